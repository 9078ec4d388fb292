//! The chaos run: 8 Eventuous-style writers (rollbacks, slow appends,
//! duplicate message ids, multi-stream appends that fail part way), 3 healer
//! processes of the real binary with leader election, killed with SIGKILL and
//! restarted at random, the database server restarted once, and an Eventuous
//! 0.17 all-stream subscriber reading throughout. Once on PostgreSQL, and
//! once on SQL Server when one is available (see below). At the end every claim of
//! issue 5 is checked against the database, the writers' journal, the
//! subscriber's log and the healers' own JSON logs, and the figures printed.
//!
//! The PostgreSQL run starts a throwaway cluster of its own (the test kit's
//! `pg::Throwaway`: initdb on a free port) and restarts that one, never the
//! machine's server, so it needs PostgreSQL's binaries
//! (`/usr/lib/postgresql/<v>/bin`) and no environment variable. This binary
//! holds only the chaos runs all the same: they load the machine for a
//! while, and cargo runs test binaries one after another.
//!
//! The SQL Server run is `#[ignore]`d like every SQL Server test (reported as
//! ignored, never as passed): `cargo test --test chaos -- --ignored sql_server`
//! runs it against `GAP_HEALER_TEST_MSSQL` or a testcontainers server, and
//! fails with the reason when there is none. Its restart is
//! `GAP_HEALER_CHAOS_MSSQL_RESTART` (a shell command, e.g. `docker restart
//! <id>`) when set; else the database is taken OFFLINE WITH ROLLBACK
//! IMMEDIATE and brought back ONLINE, which ends every session of it, and
//! the figures say which happened.
//!
//! The fleet run (`fleet_postgres_keeps_every_invariant_per_store`,
//! `chaos/fleet.rs`) does the same to four stores at once on PostgreSQL:
//! three schemas in one database and one in a second database of its own
//! throwaway cluster, 3 writers and a subscriber on each, healed by the same
//! 3 healer processes, each running the whole fleet from one `[[stores]]`
//! file (leader election per store), killed and restarted, and the server
//! restarted once, as above. Mid-run one store is broken (its schema renamed
//! away for at least 10 s, then back). Every invariant above is checked per
//! store, each store's verdict reading only its own lines of the healers'
//! logs; and: the other stores' longest subscriber stall stays within 8 s
//! (shorter than the break), the broken store shows as failing in `/status`
//! or `gap_healer_stores{state="failing"}` in a real scrape of the healers
//! during the break, and the store that publishes a watermark
//! (`watermark_table`) is sampled every 100 ms: every position at or below
//! the watermark is a committed event or tombstone in the same snapshot, and
//! it never decreases.
//!
//! The ledger-core run
//! (`ledger_core_postgres_readers_bounded_by_the_watermark_never_skip`,
//! `chaos/ledger.rs`) heals seed 003's `events` table
//! (`tests/fixtures/ledger_core_postgres.sql`) in a throwaway cluster of its
//! own: 8 writers append the way seed 003 does but WITHOUT its global
//! advisory lock, in parallel (rollbacks after insert, slow appends held
//! open 50-500 ms, two-stream appends failing at a stale version on the
//! unique (stream_category, stream_id, version) key, and the version races
//! unlocked appends really lose), 3 healer processes with `--profile
//! ledger-core` and `--watermark-table`, killed and restarted, the server
//! restarted once; the verdict above, with tombstones in the ledger's own
//! `$gap` stream. On top: the watermark sampled every 100 ms as in the fleet
//! run (and reaching the head at the end); a naive reader like seed 003's
//! `ReadAll` bounded by the watermark (`WHERE position > @after AND position
//! <= (SELECT position FROM <watermark table> WHERE store = 'default')`,
//! polling) must read every committed event exactly once in position order;
//! a second one without the watermark predicate runs beside it and its
//! skipped events are counted, not judged; tombstone versions are each of
//! 1..=n once (in fill order). `CHAOS_LEDGER_NO_WATERMARK=1` drops the predicate from
//! the checked reader: the run must then fail. The runs of this binary take
//! turns, one at a time.
//!
//! `CHAOS_SECONDS` (default 20; CI runs 60) sets how long the writers write;
//! `CHAOS_SEED` replays a run's random choices (the process timings still vary).
//! `CHAOS_SPLIT_LEADERS=1` gives each healer its own leader key (in the
//! fleet, its own key per store), so all lead at once: every run must then
//! fail, which shows the log check can see it.
//! Run it with `cargo test --test chaos -- --nocapture` to see the figures.

#[path = "chaos/support.rs"]
mod support;

#[path = "chaos/run.rs"]
mod run;

#[path = "chaos/postgres.rs"]
mod postgres;

#[path = "chaos/mssql.rs"]
mod mssql;

#[path = "chaos/watermark.rs"]
mod watermark;

#[path = "chaos/fleet.rs"]
mod fleet;

#[path = "chaos/ledger.rs"]
mod ledger;

/// The runs load the machine: one at a time, though cargo runs the tests of
/// a binary in parallel.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_run_keeps_every_invariant() {
    // The machine's server (when there is one) must come out of the run
    // without a restart: the run restarts only its own cluster.
    let _one = ONE_AT_A_TIME.lock().await;
    let machine = postgres::machine_server_started().await;
    run::run(
        std::sync::Arc::new(postgres::Postgres::create().await),
        None,
        (),
    )
    .await;
    assert_eq!(
        postgres::machine_server_started().await,
        machine,
        "the machine's PostgreSQL was restarted during the chaos run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs SQL Server: GAP_HEALER_TEST_MSSQL or a Docker engine (see tests/kit/src/mssql.rs)"]
async fn sql_server_chaos_run_keeps_every_invariant() {
    let _one = ONE_AT_A_TIME.lock().await;
    run::run(
        std::sync::Arc::new(mssql::SqlServer::create().await),
        None,
        (),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_postgres_keeps_every_invariant_per_store() {
    let _one = ONE_AT_A_TIME.lock().await;
    let machine = postgres::machine_server_started().await;
    fleet::run().await;
    assert_eq!(
        postgres::machine_server_started().await,
        machine,
        "the machine's PostgreSQL was restarted during the fleet chaos run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ledger_core_postgres_readers_bounded_by_the_watermark_never_skip() {
    let _one = ONE_AT_A_TIME.lock().await;
    let machine = postgres::machine_server_started().await;
    ledger::run().await;
    assert_eq!(
        postgres::machine_server_started().await,
        machine,
        "the machine's PostgreSQL was restarted during the ledger-core chaos run"
    );
}
