//! The engine contract: what every engine must show on a real server,
//! written once, generic over the server ([`Server`]), and stamped out as one
//! test per case and engine by [`contract_tests!`]: `contract::pg::<case>`
//! (PostgreSQL, always run) and `contract::mssql::<case>` (SQL Server or
//! Babelfish, `#[ignore]`d like every SQL Server test: see the test kit's
//! `mssql` module for where the server comes from, why a run that asks for
//! them fails without one, and how a case that cannot hold on Babelfish is
//! reported as "skipped on Babelfish: <reason>").
//!
//! The cases: the lock cases (an append open, rolled back, committed, and
//! committing while the fill waits: held, filled, committed, committed), the
//! head, scan and probe answers beside open appends, the transaction-end
//! proof's reading, the leader lock (one holder, released with its session,
//! lost when the session is killed; a follower keeps one session; no right
//! needed beyond connecting) and the leader fence (a fill of a leader whose
//! lock session was killed is Busy and writes nothing); and, in [`healer`],
//! the healer's scenarios: the seed's reproduction with the real binary and
//! an Eventuous-rules subscriber, the 10,000-wide identity jump (one cycle
//! of the in-process healer, and `heal --once`), a held position inside
//! such a jump, and scattered one-position holes (one held among them; one
//! fill transaction, refused whole). After each, the tombstone stream's
//! positions are 0..n-1 and its version n-1 (invariant 5). What differs
//! between servers by nature is a [`Server`] item; a part of a case that
//! cannot hold on Babelfish is reported as skipped there, with the reason.
//! Every store is a fresh schema or database of the test's own, dropped by
//! the kit's guard when the test ends, also when it fails.
//!
//! Positions are computed from what the appends answered, never assumed: a
//! fresh PostgreSQL store starts at 1, a SQL Server one at 0
//! ([`Server::FIRST_POSITION`]).

mod healer;
pub mod mssql;
mod pg;

pub use healer::heal_everything_once;
use healer::{
    identity_jump_of_10000_filled_in_one_heal_cycle, scattered_holes_share_one_fill_transaction,
    scattered_holes_share_transactions_and_one_held_among_them_is_left,
    seed_reproduction_handled_within_gap_timeout_with_healer,
    seed_reproduction_stuck_without_healer, ten_thousand_wide_hole_filled_in_one_cycle,
    ten_thousand_wide_hole_with_one_held_position,
};

use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::config::StartFrom;
use gap_healer::engine::{Engine, Fence, FillOutcome, LeaderLock, LeaderSession, Probe};
use gap_healer::gaps::PosRange;
use gap_healer::healer::Options;
use gap_healer_testkit::engine::{healer, FillRange};
use gap_healer_testkit::eventuous::{EVENT_TYPE, TOMBSTONE_STREAM, TOMBSTONE_TYPE};
use gap_healer_testkit::subscriber::Pages;
use uuid::Uuid;

/// A committed row as the contract reads it back: (position, stream, type).
pub type Row = (i64, String, String);

/// One engine's server as the contract sees it: a fresh store of the test's
/// own (a value of `Self`, whose guard drops it), the writers' appends, the
/// rows read back, and the few things that differ between servers by nature
/// (where positions start, how a session is killed, how long a server takes
/// to end one). What a case asserts never depends on the server except
/// through these.
pub trait Server: Sized + Send + Sync + 'static {
    /// The engine under test, as the daemon builds it.
    type Engine: Engine + LeaderLock;
    /// An append whose transaction is open: its positions taken and locked.
    type Open: Send;
    /// Where a subscriber reads ([`Server::pages`]).
    type Pages: Pages;

    /// The position of a fresh store's first append.
    const FIRST_POSITION: i64;
    /// How many fill statements a 10,000-wide hole takes: one on PostgreSQL
    /// (20,000 rows a statement), three on SQL Server (4,000, below lock
    /// escalation).
    const STATEMENTS_FOR_10000: u64;
    /// Whether the probe can see an open append's positions as in flight
    /// (SQL Server's NOLOCK read; PostgreSQL has no dirty reads).
    const PROBE_SEES_IN_FLIGHT: bool;
    /// Whether the probe names a committed position once however many of
    /// the ranges ask for it (SQL Server), or once per range (PostgreSQL).
    const PROBE_ANSWERS_A_POSITION_ONCE: bool;
    /// How long the server may take to end a closed session and free its
    /// locks.
    const ENDS_A_SESSION_WITHIN: Duration;
    /// How long the lock session's owner may take to notice that the server
    /// killed it (zero: at its next check).
    const KILL_NOTICED_WITHIN: Duration;
    /// Whether a new session may get the id of one that was just killed.
    const SESSION_IDS_REUSED: bool;

    /// A fresh, empty store.
    async fn empty() -> Self;
    /// An engine over the store, as the admin.
    fn engine(&self) -> Arc<Self::Engine>;
    /// An engine over the store logging in with `connection_string`.
    fn engine_as(&self, connection_string: &str) -> Arc<Self::Engine>;
    /// The leader key of this store's healers.
    fn leader_key(&self) -> String;
    /// The binary's flags that name the store, as the admin: `--engine`,
    /// `--connection-string`, `--schema`.
    fn store_args(&self) -> Vec<String>;

    /// Appends `count` events to `stream`, committed: their positions.
    async fn append(&self, stream: &str, count: usize) -> Vec<i64>;
    /// Appends one event with message id `id` to `stream`, committed, as
    /// Eventuous does: its position; none when the stream already has an
    /// event with that id (PostgreSQL's `ON CONFLICT DO NOTHING` skips it,
    /// SQL Server's unique key refuses it, error 2627), the position drawn
    /// for it burned either way.
    async fn append_with_id(&self, stream: &str, id: Uuid) -> Vec<i64>;
    /// `n` committed events of one stream, `bulk`, inserted in one statement
    /// at explicit positions, one every other position above the head (the
    /// identity moved past them): `n` one-position holes, at head + 1,
    /// head + 3, ... (a store too large to append event by event).
    async fn load_every_other(&self, n: i64);
    /// Starts an append of `count` events to `stream` and leaves it open.
    async fn begin_append(&self, stream: &str, count: usize) -> Self::Open;
    /// An insert of one event of `stream` at `position` itself (no draw
    /// from the identity: a second filler, an import), left open.
    async fn begin_explicit(&self, stream: &str, position: i64) -> Self::Open;
    /// Whether an explicit insert takes the lock the transaction-end proof
    /// reads (Babelfish: its identity insert takes the sequence's lock), so
    /// that the proof, not the key, holds its position.
    async fn explicit_insert_is_read(&self) -> bool;
    /// The positions an open append took.
    fn positions(open: &Self::Open) -> Vec<i64>;
    async fn commit(open: Self::Open);
    async fn rollback(open: Self::Open);
    /// The next append lands `n` positions further on, nothing committed
    /// between (an identity cache jump); works beside open appends.
    async fn skip_positions(&self, n: i64);

    /// Every committed row, in position order.
    async fn rows(&self) -> Vec<Row>;
    /// A subscriber's own session on the store, read a page at a time as
    /// Eventuous's all-stream subscription reads.
    async fn pages(&self) -> Self::Pages;
    /// The identity's current value (IDENT_CURRENT, the sequence's
    /// last_value): a fill must never move it.
    async fn identity(&self) -> i64;
    /// The tombstone stream's version, `None` while it does not exist.
    async fn tombstone_version(&self) -> Option<i64>;
    /// Asserts invariant 5: the tombstone stream's positions are 0..n-1,
    /// its type the tombstone type, its version n-1.
    async fn assert_tombstone_stream_consistent(&self);

    /// The server's id of a leader session (backend pid, `@@SPID`).
    fn session_id(session: &<Self::Engine as LeaderLock>::Session) -> i64;
    /// Ends the server session `id`, as a DBA would.
    async fn kill_session(&self, id: i64);
    /// What the server itself says of a session that took the leader lock
    /// (the locks its lock manager lists), asserted.
    async fn assert_lock_session(
        &self,
        engine: &Self::Engine,
        session: &<Self::Engine as LeaderLock>::Session,
    );
    /// Asserts that the engine's pooled session is clean (no transaction,
    /// no session setting left behind by a fill).
    async fn assert_pool_clean(engine: &Self::Engine);
    /// Asserts that the engine fills with its own statements (SQL Server's
    /// direct mode, not the fill procedure; PostgreSQL has one mode).
    async fn assert_fills_directly(engine: &Self::Engine);

    /// A login with exactly the rights a direct fill needs, as printed by
    /// `gap-healer sql` or documented (where no such login can be made, the
    /// admin's, reported as a skip): its connection string.
    async fn writer_login(&mut self, case: &str) -> String;
    /// A login that may connect and nothing more: its connection string.
    async fn bare_login(&mut self) -> String;
    /// Says that `case` checks what this server lacks and returns true
    /// (Babelfish); false where the behaviour holds.
    async fn skipped(&self, case: &str, reason: &str) -> bool;
}

/// Stamps out one `#[tokio::test]` per contract case for the server type
/// given, with the attributes given after it (`#[ignore = ...]` for SQL
/// Server), each calling the case of the same name in [`self`].
macro_rules! contract_tests {
    ($server:ty $(, #[$attr:meta])*) => {
        contract_tests!(@each $server, [$(#[$attr])*],
            lock_case_append_open_fill_waits_then_held,
            lock_case_append_rolled_back_filled_and_identity_unchanged,
            lock_case_append_committed_event_stays,
            lock_case_append_commits_while_fill_waits_event_stays,
            lock_outcomes_held_committed_then_filled_after_rollback,
            scan_pages_and_probe_never_wait_on_open_appends,
            seed_reproduction_stuck_without_healer,
            seed_reproduction_handled_within_gap_timeout_with_healer,
            ten_thousand_wide_hole_filled_in_one_cycle,
            identity_jump_of_10000_filled_in_one_heal_cycle,
            ten_thousand_wide_hole_with_one_held_position,
            scattered_holes_share_transactions_and_one_held_among_them_is_left,
            scattered_holes_share_one_fill_transaction,
            a_hole_waits_for_every_transaction_open_when_it_was_read,
            open_transactions_list_an_open_append_until_it_ends,
            leader_lock_one_holder_released_on_drop_and_on_kill,
            leader_lock_follower_keeps_one_session,
            leader_lock_needs_no_rights_beyond_connecting,
            leader_fence_fill_after_the_lock_session_was_killed_is_busy,
        );
    };
    (@each $server:ty, $attrs:tt, $($case:ident),* $(,)?) => {
        $(contract_tests!(@one $server, $attrs, $case);)*
    };
    (@one $server:ty, [$(#[$attr:meta])*], $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $case() {
            super::$case::<$server>().await;
        }
    };
}
use contract_tests;

fn single(p: i64) -> PosRange {
    PosRange::single(p)
}

/// Streams A and B exist (committed), so an open append holds only its own
/// stream row and keys, as in a store that has been running a while.
pub async fn store_with_streams<S: Server>() -> S {
    let s = S::empty().await;
    s.append("A", 1).await;
    s.append("B", 1).await;
    s
}

/// A hole below the head, returned as its one position.
async fn hole<S: Server>(s: &S) -> i64 {
    let p = rolled_back_append(s, "A", 1).await[0];
    s.append("B", 1).await;
    p
}

/// A hole at a rolled-back append's positions; returns them.
async fn rolled_back_append<S: Server>(s: &S, stream: &str, count: usize) -> Vec<i64> {
    let open = s.begin_append(stream, count).await;
    let positions = S::positions(&open);
    S::rollback(open).await;
    positions
}

/// The stream and type of the row at `position`.
async fn row_at<S: Server>(s: &S, position: i64) -> Option<(String, String)> {
    s.rows()
        .await
        .into_iter()
        .find(|r| r.0 == position)
        .map(|(_, stream, kind)| (stream, kind))
}

/// A row's (stream, type) as `&str`s, for comparing with literals.
fn as_strs(row: &Option<(String, String)>) -> Option<(&str, &str)> {
    row.as_ref().map(|(s, t)| (s.as_str(), t.as_str()))
}

/// The in-process healer's options: every hole due at once (`gap_timeout`
/// 0), a 500 ms lock timeout, from the store's first position.
fn options<S: Server>() -> Options {
    Options {
        store: Default::default(),
        gap_timeout: Duration::ZERO,
        poll_interval: Duration::from_millis(100),
        lock_timeout: Duration::from_millis(500),
        scan_page_size: 10_000,
        start_from: StartFrom::Position(S::FIRST_POSITION),
        lookback: 1_000_000,
        dry_run: false,
        give_up_after: None,
        publish_watermark: false,
    }
}

// ---------------------------------------------------------------------------
// The seed's four lock cases, each a function of a store and an engine so
// an engine's own tests can repeat them under other settings (SQL Server's
// `rcsi_on_and_off`).

/// An open append: the scan skips its held key (a hole), the probe sees it
/// in flight (where the server can), the fill waits the lock timeout and
/// answers Held without moving the identity; the append then commits.
pub async fn append_open<S: Server>(s: &S, engine: &S::Engine) {
    let open = s.begin_append("A", 1).await;
    let p = S::positions(&open)[0];
    let after = s.append("B", 1).await[0];
    assert!(after > p);

    // The scan skips the held key: the open append's position is a hole.
    let page = engine.scan(p - 1, 100).await.unwrap();
    assert_eq!(page.holes, vec![single(p)], "{page:?}");
    assert_eq!(page.high, after);
    // The probe sees it in flight, not committed.
    let probe = engine.probe(&[single(p)]).await.unwrap();
    let seen_in_flight = if !S::PROBE_SEES_IN_FLIGHT
        || s.skipped(
            "the NOLOCK probe of an open append",
            "no dirty reads: NOLOCK never shows an open append's row (the fill's key wait below still decides)",
        )
        .await
    {
        vec![]
    } else {
        vec![p]
    };
    assert_eq!(
        probe,
        Probe {
            committed: vec![],
            in_flight: seen_in_flight
        }
    );

    let ident = s.identity().await;
    let started = Instant::now();
    let outcome = engine
        .fill(single(p), Duration::from_secs(2), &Fence::Unfenced)
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(outcome, FillOutcome::Held);
    assert!(
        waited >= Duration::from_millis(1900),
        "the fill waited {waited:?}, not the lock timeout"
    );
    assert!(
        waited < Duration::from_secs(10),
        "the fill waited {waited:?}"
    );
    assert_eq!(s.identity().await, ident, "the identity moved");

    S::commit(open).await;
    let m = row_at(s, p).await;
    assert_eq!(as_strs(&m), Some(("A", EVENT_TYPE)), "the append's event");
    s.assert_tombstone_stream_consistent().await;
}

/// A rolled-back append's position is filled (the identity unchanged), and
/// filling it again finds the tombstone committed.
pub async fn append_rolled_back<S: Server>(s: &S, engine: &S::Engine) {
    let p = rolled_back_append(s, "A", 1).await[0];
    s.append("B", 1).await;
    let ident = s.identity().await;
    let outcome = engine
        .fill(single(p), Duration::from_secs(2), &Fence::Unfenced)
        .await
        .unwrap();
    assert_eq!(outcome, FillOutcome::Filled { rows: 1 });
    assert_eq!(s.identity().await, ident, "the identity moved");
    let m = row_at(s, p).await;
    assert_eq!(
        as_strs(&m),
        Some((TOMBSTONE_STREAM, TOMBSTONE_TYPE)),
        "a tombstone"
    );
    // Filling it again: the tombstone is committed now.
    assert_eq!(
        engine
            .fill(single(p), Duration::from_secs(2), &Fence::Unfenced)
            .await
            .unwrap(),
        FillOutcome::Committed
    );
    s.assert_tombstone_stream_consistent().await;
}

/// A committed position is never filled, nor a range that contains it.
pub async fn append_committed<S: Server>(s: &S, engine: &S::Engine) {
    let p = s.append("A", 1).await[0];
    s.append("B", 1).await;
    let ident = s.identity().await;
    assert_eq!(
        engine
            .fill(single(p), Duration::from_secs(2), &Fence::Unfenced)
            .await
            .unwrap(),
        FillOutcome::Committed
    );
    // A range that contains the committed position fails whole.
    let wide = PosRange::new(p - 1, p).unwrap();
    assert_eq!(
        engine
            .fill(wide, Duration::from_secs(2), &Fence::Unfenced)
            .await
            .unwrap(),
        FillOutcome::Committed
    );
    let m = row_at(s, p).await;
    assert_eq!(as_strs(&m), Some(("A", EVENT_TYPE)), "the event stays");
    assert_eq!(s.identity().await, ident);
    s.assert_tombstone_stream_consistent().await;
}

/// An append that commits while the fill waits on its key: the fill ends
/// then (Committed), and the event stays.
pub async fn append_commits_while_fill_waits<S: Server>(s: &S, engine: &S::Engine) {
    let open = s.begin_append("A", 1).await;
    let p = S::positions(&open)[0];
    s.append("B", 1).await;
    let ident = s.identity().await;
    let started = Instant::now();
    let (outcome, ()) = tokio::join!(
        engine.fill(single(p), Duration::from_secs(10), &Fence::Unfenced),
        async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            S::commit(open).await;
        }
    );
    assert_eq!(outcome.unwrap(), FillOutcome::Committed);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the fill did not end when the append committed"
    );
    let m = row_at(s, p).await;
    assert_eq!(as_strs(&m), Some(("A", EVENT_TYPE)), "the event stays");
    assert_eq!(s.identity().await, ident);
    s.assert_tombstone_stream_consistent().await;
}

async fn lock_case_append_open_fill_waits_then_held<S: Server>() {
    let s = store_with_streams::<S>().await;
    append_open(&s, &s.engine()).await;
}

async fn lock_case_append_rolled_back_filled_and_identity_unchanged<S: Server>() {
    let s = store_with_streams::<S>().await;
    append_rolled_back(&s, &s.engine()).await;
}

async fn lock_case_append_committed_event_stays<S: Server>() {
    let s = store_with_streams::<S>().await;
    append_committed(&s, &s.engine()).await;
}

async fn lock_case_append_commits_while_fill_waits_event_stays<S: Server>() {
    let s = store_with_streams::<S>().await;
    append_commits_while_fill_waits(&s, &s.engine()).await;
}

/// The fill's answers in a row, at a short lock timeout: Held while an
/// append is open, Committed for a committed position, Filled once the
/// append rolled back, then Committed for the tombstone.
async fn lock_outcomes_held_committed_then_filled_after_rollback<S: Server>() {
    let s = S::empty().await;
    let first = s.append("A", 1).await[0];
    let open = s.begin_append("slow", 1).await;
    s.append("B", 1).await;
    let e = s.engine();
    let held = S::positions(&open)[0];
    let t = Duration::from_millis(200);
    assert_eq!(
        e.fill(single(held), t, &Fence::Unfenced).await.unwrap(),
        FillOutcome::Held
    );
    assert_eq!(
        e.fill(single(first), t, &Fence::Unfenced).await.unwrap(),
        FillOutcome::Committed
    );
    S::rollback(open).await;
    assert_eq!(
        e.fill(single(held), t, &Fence::Unfenced).await.unwrap(),
        FillOutcome::Filled { rows: 1 }
    );
    assert_eq!(
        e.fill(single(held), t, &Fence::Unfenced).await.unwrap(),
        FillOutcome::Committed
    );
    s.assert_tombstone_stream_consistent().await;
}

// ---------------------------------------------------------------------------
// Reads.

/// The head, the scan page by page and the probe beside a hole and an open
/// append: none waits on the open append, whose positions sit inside a hole.
async fn scan_pages_and_probe_never_wait_on_open_appends<S: Server>() {
    let s = S::empty().await;
    let f = S::FIRST_POSITION;
    let engine = s.engine();
    assert_eq!(engine.head().await.unwrap(), None, "empty store");
    let empty = engine.scan(f - 1, 10).await.unwrap();
    assert_eq!((empty.holes.len(), empty.high, empty.rows), (0, f - 1, 0));

    let a = s.append("A", 3).await; // f, f+1, f+2
    let hole = rolled_back_append(&s, "A", 2).await; // f+3, f+4
    let b = s.append("B", 2).await; // f+5, f+6
    let open = s.begin_append("A", 2).await; // f+7, f+8: in flight
    let c = s.append("C", 1).await; // f+9
    assert_eq!(
        (a[0], hole[0], b[0], S::positions(&open)[0], c[0]),
        (f, f + 3, f + 5, f + 7, f + 9)
    );

    // Page by page: 3 rows, then 3, then the rest.
    let p1 = engine.scan(f - 1, 3).await.unwrap();
    assert_eq!((p1.holes.clone(), p1.high, p1.rows), (vec![], f + 2, 3));
    // Committed above f+2: f+5, f+6, f+9. The open append's f+7 and f+8
    // are skipped, not waited on, so they sit inside a hole.
    let p2 = engine.scan(p1.high, 3).await.unwrap();
    let holes = vec![
        PosRange::new(f + 3, f + 4).unwrap(),
        PosRange::new(f + 7, f + 8).unwrap(),
    ];
    assert_eq!(
        (p2.holes.clone(), p2.high, p2.rows),
        (holes.clone(), f + 9, 3)
    );
    let p3 = engine.scan(p2.high, 3).await.unwrap();
    assert_eq!(
        (p3.holes.len(), p3.high, p3.rows),
        (0, f + 9, 0),
        "caught up"
    );
    let whole = engine.scan(f - 1, 100).await.unwrap();
    assert_eq!(whole.holes, holes);
    assert_eq!((whole.high, whole.rows), (f + 9, 6));
    assert_eq!(engine.head().await.unwrap(), Some(f + 9));

    let probe = engine
        .probe(&[
            PosRange::new(f, f + 4).unwrap(),
            PosRange::new(f + 6, f + 8).unwrap(),
        ])
        .await
        .unwrap();
    // On Babelfish an open append is invisible to NOLOCK too.
    let in_flight = if !S::PROBE_SEES_IN_FLIGHT
        || s.skipped(
            "scan_pages_and_probe_never_wait_on_open_appends: positions in flight",
            "no dirty reads: NOLOCK never shows an open append's rows",
        )
        .await
    {
        vec![]
    } else {
        vec![f + 7, f + 8]
    };
    assert_eq!(probe.committed, vec![f, f + 1, f + 2, f + 6]);
    assert_eq!(probe.in_flight, in_flight);

    // Many ranges in one call (chunks and padding).
    // The same ten positions 150 times over: SQL Server names a committed
    // position once, PostgreSQL once per range that asks for it.
    let ranges: Vec<PosRange> = (0..1500).map(|i| single(f + i % 10)).collect();
    let probe = engine.probe(&ranges).await.unwrap();
    let mut committed = probe.committed.clone();
    committed.sort_unstable();
    committed.dedup();
    let expected = vec![f, f + 1, f + 2, f + 5, f + 6, f + 9];
    assert_eq!(committed, expected);
    if S::PROBE_ANSWERS_A_POSITION_ONCE {
        assert_eq!(probe.committed, expected);
    }
    assert_eq!(probe.in_flight, in_flight);

    S::rollback(open).await;
    let probe = engine
        .probe(&[PosRange::new(f + 7, f + 8).unwrap()])
        .await
        .unwrap();
    assert_eq!(probe, Probe::default());
}

/// The transaction-end proof, once for every engine: a 10,000-wide hole
/// read while an append that drew a position in its middle is open waits,
/// whole, for that append's transaction (it may have drawn any of them):
/// no statement runs, and the cycle says why (`open_transaction`). Once the
/// append commits, the next poll's reading proves the rest, every other
/// position is filled and the append's event stays.
async fn a_hole_waits_for_every_transaction_open_when_it_was_read<S: Server>() {
    let s = store_with_streams::<S>().await;
    let first = s.append("A", 1).await[0];
    s.skip_positions(4_999).await;
    let open = s.begin_append("slow", 1).await;
    let held = S::positions(&open)[0];
    assert_eq!(held, first + 5_000);
    s.skip_positions(5_000).await;
    let last = s.append("B", 1).await[0];
    let mut h = healer(s.engine(), options::<S>());
    h.scan_step().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let report = h.fill_due(&stop).await;
    println!("while the append is open: {report:?}");
    assert_eq!(
        (
            report.statements,
            report.tombstones,
            report.open_transaction
        ),
        (0, 0, 10_000),
        "{report:?}"
    );
    assert!(s.rows().await.iter().all(|r| r.2 != TOMBSTONE_TYPE));
    S::commit(open).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !h.tracker().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(options::<S>().poll_interval).await;
        h.scan_step().await.unwrap();
        h.fill_due(&stop).await;
    }
    assert!(h.tracker().is_empty(), "{:?}", h.tracker().ranges());
    let rows = s.rows().await;
    assert_eq!(
        rows.iter().filter(|r| r.2 == TOMBSTONE_TYPE).count(),
        (last - first - 2) as usize
    );
    assert_eq!(
        as_strs(&row_at(&s, held).await),
        Some(("slow", EVENT_TYPE)),
        "the append's event stays"
    );
    assert!(missing::<S>(&rows).is_empty());
    s.assert_tombstone_stream_consistent().await;
}

/// The engine's reading of open transactions, which the transaction-end
/// proof rests on: none while nothing is open; an append whose transaction
/// is open (its position drawn and keyed) is listed, once; once it has
/// committed it is gone. The reading never lists its own session.
async fn open_transactions_list_an_open_append_until_it_ends<S: Server>() {
    use gap_healer::engine::OpenTransactions;
    let s = store_with_streams::<S>().await;
    let engine = s.engine();
    let read = || async {
        match engine
            .open_transactions(tokio::time::Instant::now())
            .await
            .expect("a reading")
        {
            OpenTransactions::Read(r) => r.open,
            OpenTransactions::KeyOrderOnly => panic!("this login may read the locks"),
        }
    };
    assert_eq!(read().await, vec![], "nothing is open");
    let open = s.begin_append("slow", 1).await;
    let during = read().await;
    assert_eq!(during.len(), 1, "{during:?}");
    assert!(during[0].session.is_some(), "{during:?}");
    S::commit(open).await;
    assert_eq!(read().await, vec![], "the append has ended");
}

/// The positions from the store's first to the head that no row holds.
fn missing<S: Server>(rows: &[Row]) -> Vec<i64> {
    let head = rows.last().map_or(S::FIRST_POSITION - 1, |r| r.0);
    let present: std::collections::HashSet<i64> = rows.iter().map(|r| r.0).collect();
    (S::FIRST_POSITION..=head)
        .filter(|p| !present.contains(p))
        .collect()
}

// ---------------------------------------------------------------------------
// The leader lock: on a dedicated session, one holder, released with it.

/// `engine.try_lead(key)` until it takes the lock: the server ends a closed
/// or killed session (and releases its locks) shortly after, not at once.
async fn lead_within<S: Server>(
    engine: &S::Engine,
    key: &str,
) -> <S::Engine as LeaderLock>::Session {
    let limit = S::ENDS_A_SESSION_WITHIN;
    let deadline = Instant::now() + limit;
    loop {
        match engine.try_lead(key).await {
            Ok(Some(session)) => return session,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(None) => panic!("the lock was not free within {limit:?}"),
            Err(e) => panic!("try_lead failed: {e:?}"),
        }
    }
}

/// One holder at a time, without waiting; the lock lives on a dedicated
/// session that the server sees holding it; names are separate locks; the
/// lock is freed when its session is dropped, and lost (every check after
/// says so) when the server kills it.
async fn leader_lock_one_holder_released_on_drop_and_on_kill<S: Server>() {
    let s = S::empty().await;
    let key = s.leader_key();
    let first = s.engine();
    let second = s.engine();

    // The first engine takes it; the second, and a second session of the
    // first engine, get None without waiting.
    let mut leader = first.try_lead(&key).await.unwrap().expect("free lock");
    let started = Instant::now();
    assert!(
        second.try_lead(&key).await.unwrap().is_none(),
        "a second session cannot take it"
    );
    assert!(first.try_lead(&key).await.unwrap().is_none());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "try_lead waited for the lock"
    );
    assert!(first.still_held(&mut leader, &key).await.unwrap());
    assert!(first.still_held(&mut leader, &key).await.unwrap());
    assert!(S::session_id(&leader) > 0);
    s.assert_lock_session(&first, &leader).await;

    // Names are separate locks, compared binary (case-sensitive).
    assert!(!first
        .still_held(&mut leader, &format!("{key}-other"))
        .await
        .unwrap());
    for other in [format!("{key}-other"), key.to_uppercase()] {
        let taken = second
            .try_lead(&other)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{other} is another lock"));
        drop(taken);
    }

    // Dropping the session closes its connection and frees the lock.
    drop(leader);
    let mut follower = lead_within::<S>(&second, &key).await;
    assert!(second.still_held(&mut follower, &key).await.unwrap());
    assert!(first.try_lead(&key).await.unwrap().is_none());

    // The server kills the leader's session: its next check fails or says
    // not held, and every check after that; the lock is free again.
    let id = S::session_id(&follower);
    s.kill_session(id).await;
    let deadline = Instant::now() + S::KILL_NOTICED_WITHIN;
    loop {
        match second.still_held(&mut follower, &key).await {
            Ok(true) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(true) => panic!(
                "still held {:?} after the server killed session {id}",
                S::KILL_NOTICED_WITHIN
            ),
            Ok(false) | Err(_) => break,
        }
    }
    let again = second.still_held(&mut follower, &key).await;
    assert!(!matches!(again, Ok(true)), "{again:?}");
    drop(follower);
    let taken = lead_within::<S>(&first, &key).await;
    assert_ne!(S::session_id(&taken), 0);
}

/// A follower tries on the session it kept, not on a new login each time; a
/// kept session that was killed is replaced without an error; the kept
/// session is the one that leads once the holder goes.
async fn leader_lock_follower_keeps_one_session<S: Server>() {
    let s = S::empty().await;
    let key = s.leader_key();
    let (first, second) = (s.engine(), s.engine());
    let held = first.try_lead(&key).await.unwrap().expect("free lock");
    let mut idle = None;
    assert!(second
        .try_lead_reusing(&key, &mut idle)
        .await
        .unwrap()
        .is_none());
    let id = S::session_id(idle.as_ref().expect("the session is kept"));
    for _ in 0..5 {
        assert!(second
            .try_lead_reusing(&key, &mut idle)
            .await
            .unwrap()
            .is_none());
        assert_eq!(idle.as_ref().map(S::session_id), Some(id));
    }
    s.kill_session(id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        second
            .try_lead_reusing(&key, &mut idle)
            .await
            .unwrap()
            .is_none(),
        "a killed kept session is replaced, not reported"
    );
    let replaced = S::session_id(idle.as_ref().expect("a new session is kept"));
    if !S::SESSION_IDS_REUSED {
        assert_ne!(replaced, id);
    }
    drop(held);
    let deadline = Instant::now() + S::ENDS_A_SESSION_WITHIN;
    let mut leading = loop {
        if let Some(session) = second.try_lead_reusing(&key, &mut idle).await.unwrap() {
            break session;
        }
        assert!(Instant::now() < deadline, "the freed lock was not taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(S::session_id(&leading), replaced, "on the kept session");
    assert!(idle.is_none());
    assert!(second.still_held(&mut leading, &key).await.unwrap());
}

/// A login with no right at all takes the leader lock, and it is the same
/// lock as every other login's.
async fn leader_lock_needs_no_rights_beyond_connecting<S: Server>() {
    let mut s = S::empty().await;
    let key = s.leader_key();
    let cs = s.bare_login().await;
    let bare = s.engine_as(&cs);
    let mut session = bare
        .try_lead(&key)
        .await
        .unwrap()
        .expect("a login without grants takes the lock");
    assert!(bare.still_held(&mut session, &key).await.unwrap());
    // The admin's engine sees it taken: the same lock, whatever the login.
    assert!(s.engine().try_lead(&key).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------
// The leader fence: a fill through the pool cannot outlive the leader's lock
// session.

/// The server kills the leader's lock session; another engine takes the
/// lock then; the old leader's fill through its pool is Busy and writes
/// nothing, the new leader's fill works.
pub async fn fill_after_kill_is_busy<S: Server>(s: &S, old: &S::Engine, new: &S::Engine) {
    let key = s.leader_key();
    let mut leader = old.try_lead(&key).await.unwrap().expect("free lock");
    assert!(old.still_held(&mut leader, &key).await.unwrap());
    // The old leader's fills are fenced by the token its lock session won.
    let old_fence = Fence::Leader(leader.fence_token());
    // While the lock session lives, the fence lets fills through.
    let p = hole(s).await;
    assert_eq!(
        old.fill(single(p), Duration::from_secs(2), &old_fence)
            .await
            .unwrap(),
        FillOutcome::Filled { rows: 1 }
    );

    let q = hole(s).await;
    let version = s.tombstone_version().await;
    let ident = s.identity().await;
    s.kill_session(S::session_id(&leader)).await;
    // Another healer takes the lock as soon as the server has released it.
    let taken = lead_within::<S>(new, &key).await;
    // The old leader has not noticed (no check ran), and still fills through
    // its pool: refused by the fence, nothing written.
    assert_eq!(
        old.fill(single(q), Duration::from_secs(2), &old_fence)
            .await
            .unwrap(),
        FillOutcome::Busy
    );
    assert!(row_at(s, q).await.is_none(), "the fenced fill wrote");
    assert_eq!(s.tombstone_version().await, version);
    assert_eq!(s.identity().await, ident);
    // The pooled connection it used is clean.
    S::assert_pool_clean(old).await;
    // Its check fails or says not held.
    assert!(!matches!(old.still_held(&mut leader, &key).await, Ok(true)));
    // The new leader fills.
    assert_eq!(
        new.fill(
            single(q),
            Duration::from_secs(2),
            &Fence::Leader(taken.fence_token())
        )
        .await
        .unwrap(),
        FillOutcome::Filled { rows: 1 }
    );
    // The old leader's fills stay refused until it leads again.
    let r = hole(s).await;
    assert_eq!(
        old.fill(single(r), Duration::from_secs(2), &old_fence)
            .await
            .unwrap(),
        FillOutcome::Busy
    );
    assert!(row_at(s, r).await.is_none());
    drop(leader);
    drop(taken);
    s.assert_tombstone_stream_consistent().await;
}

/// [`fill_after_kill_is_busy`] for two healers logging in with exactly the
/// rights a direct fill needs: the fence needs no more.
async fn leader_fence_fill_after_the_lock_session_was_killed_is_busy<S: Server>() {
    let mut s = store_with_streams::<S>().await;
    let cs = s
        .writer_login("leader_fence_fill_after_the_lock_session_was_killed_is_busy")
        .await;
    let (old, new) = (s.engine_as(&cs), s.engine_as(&cs));
    S::assert_fills_directly(&old).await;
    fill_after_kill_is_busy(&s, &old, &new).await;
}
