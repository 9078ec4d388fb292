//! Table profiles on the real PostgreSQL and the real binary: seed 003's
//! ledger-core table healed with versioned tombstones while a slow append
//! keeps its place; a custom table described in TOML, and `check` naming
//! every mistake in its description; two healers of one ledger never
//! reusing a tombstone version; SQLStreamStore's tables healed with
//! messages of a tombstone stream of their own while its racing appends
//! keep their places, its grants, and its readers bounded by the watermark.

use std::time::Duration;

use gap_healer_testkit::bin::{cli, timing, Daemon};
use gap_healer_testkit::ledger::{Ledger, TOMBSTONE_CATEGORY};
use gap_healer_testkit::pg::{as_user, connect, pg_url, schema_name, Ending, Guard};
use gap_healer_testkit::sqlstreamstore::{
    SqlStreamStore, TOMBSTONE_STREAM as SSS_TOMBSTONE_STREAM,
};
use gap_healer_testkit::wait::until as wait_for;

fn run_args(ledger: &Ledger, more: &[&str]) -> Vec<String> {
    let mut args = vec!["run".to_string()];
    args.extend(ledger.args());
    args.extend(["--log-format", "json"].map(String::from));
    args.extend(more.iter().map(|s| s.to_string()));
    args
}

/// Tombstone versions must be exactly 1..=n in position order (true here:
/// every fill of these tests covers higher positions than the one before).
fn assert_versions_follow_positions(tombstones: &[(i64, i64)]) {
    let versions: Vec<i64> = tombstones.iter().map(|(_, v)| *v).collect();
    let want: Vec<i64> = (1..=tombstones.len() as i64).collect();
    assert_eq!(
        versions, want,
        "tombstones (position, version): {tombstones:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_core_holes_get_versioned_tombstones_and_a_slow_append_keeps_its_place() {
    let ledger = Ledger::new("ledger").await;
    let check = cli(
        &ledger
            .argv(&["check"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(check.code, 0, "{}", check.all());
    assert!(
        check.stdout.contains("(ledger-core profile)"),
        "{}",
        check.stdout
    );

    let a = ledger.append("account", 1, Ending::Commit, false).await;
    let rolled = ledger
        .append("account", 3, Ending::RollbackAfterInsert, false)
        .await;
    let slow = ledger.append_open("account", 2, false).await;
    let aborted = ledger.append_open("account", 1, false).await;
    let b = ledger.append("account", 1, Ending::Commit, false).await;
    assert!(a[0] < rolled[0] && rolled[2] < slow.positions[0] && aborted.positions[0] < b[0]);

    let d = Daemon::spawn(
        &run_args(
            &ledger,
            &timing("300ms", "50ms", &["--lock-timeout", "200ms"]),
        ),
        &[],
    );
    // Held well past gap_timeout: nothing is filled while the open appends
    // are, not even the rolled-back positions: the open appends drew
    // positions too, and may hold any of them (the transaction-end proof).
    let waited = wait_for(Duration::from_secs(10), || async {
        !d.lines_containing("a transaction that may have drawn these positions is still open")
            .is_empty()
    })
    .await;
    assert!(waited, "{}", d.log());
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        ledger.tombstones().await.is_empty(),
        "filled while appends that may have drawn the positions were open: {:?}\n{}",
        ledger.rows().await,
        d.log()
    );
    slow.commit()
        .await
        .expect("the slow append commits: no tombstone took its place");
    aborted.rollback().await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            ledger.missing().await.is_empty()
        })
        .await,
        "holes left: {:?}\n{}",
        ledger.missing().await,
        d.log()
    );
    let rows = ledger.rows().await;
    for p in &slow_positions(&rows, "account") {
        assert!(rows.iter().any(|(q, c, _)| q == p && c == "account"));
    }
    let tombstones = ledger.tombstones().await;
    let filled: Vec<i64> = tombstones.iter().map(|(p, _)| *p).collect();
    let mut want: Vec<i64> = rolled.clone();
    want.extend(&aborted_positions(&rows, &rolled, &a, &b));
    want.sort();
    assert_eq!(
        filled, want,
        "tombstones exactly at the rolled-back positions"
    );
    assert_versions_follow_positions(&tombstones);
    let (_, status) = d.get("/status").await;
    assert!(status.contains("\"default\""), "{status}");
    d.terminate();
}

/// Positions of `category`'s committed rows.
fn slow_positions(rows: &[(i64, String, i64)], category: &str) -> Vec<i64> {
    rows.iter()
        .filter(|(_, c, _)| c == category)
        .map(|(p, _, _)| *p)
        .collect()
}

/// Positions between the first and last event that are neither events nor
/// the rolled-back append's: the aborted append's.
fn aborted_positions(
    rows: &[(i64, String, i64)],
    rolled: &[i64],
    a: &[i64],
    b: &[i64],
) -> Vec<i64> {
    (a[0]..=b[0])
        .filter(|p| !rolled.contains(p))
        .filter(|p| {
            rows.iter()
                .any(|(q, c, _)| q == p && c == TOMBSTONE_CATEGORY)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_healers_of_one_ledger_never_reuse_a_tombstone_version() {
    let ledger = Ledger::new("ledger_two").await;
    let flags = timing("100ms", "20ms", &["--no-leader-election"]);
    let one = Daemon::spawn(&run_args(&ledger, &flags), &[]);
    let two = Daemon::spawn(&run_args(&ledger, &flags), &[]);
    // 40 rounds of one committed and two rolled-back appends: holes keep
    // appearing while both healers fill.
    for _ in 0..40 {
        ledger.append("account", 1, Ending::Commit, false).await;
        ledger
            .append("account", 2, Ending::RollbackAfterInsert, false)
            .await;
    }
    ledger.append("account", 1, Ending::Commit, false).await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            ledger.missing().await.is_empty()
        })
        .await,
        "holes left: {:?}\n{}\n{}",
        ledger.missing().await,
        one.log(),
        two.log()
    );
    let tombstones = ledger.tombstones().await;
    assert_eq!(tombstones.len(), 80, "{tombstones:?}");
    let mut by_version = tombstones.clone();
    by_version.sort_by_key(|(_, v)| *v);
    let versions: Vec<i64> = by_version.iter().map(|(_, v)| *v).collect();
    assert_eq!(
        versions,
        (1..=80).collect::<Vec<i64>>(),
        "each version once, none skipped"
    );
    for d in [&one, &two] {
        assert!(
            d.lines_containing("duplicate key").is_empty(),
            "a healer raced past the version lock:\n{}",
            d.log()
        );
    }
    one.terminate();
    two.terminate();
}

/// The tombstone stream's version is allocated under a lock: a second fill
/// waits for the first to end before it reads the version, so two healers
/// never compute the same next version (the unique key would refuse one;
/// a custom table may not have that key at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_fill_waits_for_the_first_before_reading_the_version() {
    use gap_healer::engine::{Engine, Fence, FillOutcome};
    use gap_healer::gaps::PosRange;
    let ledger = Ledger::new("ledger_lock").await;
    // Without the stream's unique key, which would make the second insert
    // wait on the first's row too: the lock alone must keep them apart.
    ledger
        .client
        .batch_execute(&format!(
            "ALTER TABLE {}.events DROP CONSTRAINT events_stream_version_key",
            ledger.schema
        ))
        .await
        .unwrap();
    // Positions: 1 event, 2 free, 3 held by an open append, 4 event, 5 free, 6 event.
    ledger.append("account", 1, Ending::Commit, false).await;
    ledger
        .append("account", 1, Ending::RollbackAfterInsert, false)
        .await;
    let held = ledger.append_open("account", 1, false).await;
    ledger.append("account", 1, Ending::Commit, false).await;
    ledger
        .append("account", 1, Ending::RollbackAfterInsert, false)
        .await;
    ledger.append("account", 1, Ending::Commit, false).await;
    assert_eq!(held.positions, vec![3]);
    let (one, two) = (ledger.engine(), ledger.engine());
    let first = tokio::spawn(async move {
        // Writes 2, then waits on 3's key until its lock timeout: Held.
        let range = [PosRange::new(2, 3).unwrap()];
        let started = std::time::Instant::now();
        let outcome = one
            .fill_ranges(&range, Duration::from_millis(1_500), &Fence::Unfenced)
            .await;
        (outcome.unwrap(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let second = two
        .fill_ranges(
            &[PosRange::new(5, 5).unwrap()],
            Duration::from_secs(2),
            &Fence::Unfenced,
        )
        .await
        .unwrap();
    let waited = started.elapsed();
    let (first, first_took) = first.await.unwrap();
    eprintln!("second fill waited {waited:?}; the first took {first_took:?}");
    assert_eq!(first, FillOutcome::Held);
    assert_eq!(second, FillOutcome::Filled { rows: 1 });
    assert!(
        waited >= Duration::from_millis(900),
        "the second fill read the version while the first was open: it took {waited:?} (the first {first_took:?})"
    );
    held.rollback().await;
    assert_eq!(ledger.tombstones().await, vec![(5, 1)]);
}

/// A custom journal table, its tombstone row described in the file.
const JOURNAL: &str = "
CREATE SCHEMA __schema__;
CREATE TABLE __schema__.journal (
    seq bigserial PRIMARY KEY,
    id uuid NOT NULL,
    kind text NOT NULL,
    tenant int NOT NULL,
    n int NOT NULL,
    payload jsonb NOT NULL,
    at timestamptz NOT NULL,
    note text,
    UNIQUE (kind, tenant, n)
);";

fn journal_config(dir: &std::path::Path, schema: &str, columns: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{schema}-{}.toml", columns.len()));
    std::fs::write(
        &path,
        format!(
            "engine = \"postgres\"\nschema = \"{schema}\"\nprofile = \"custom\"\n\
             table = \"journal\"\nposition_column = \"seq\"\n[columns]\n{columns}"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_table_described_in_toml_is_checked_and_healed() {
    let client = connect().await;
    let schema = schema_name("custom");
    let _schema = Guard::schema(&pg_url(), &schema);
    client
        .batch_execute(&JOURNAL.replace("__schema__", &schema))
        .await
        .unwrap();
    let insert = format!(
        "INSERT INTO {schema}.journal (id, kind, tenant, n, payload, at) \
         VALUES (gen_random_uuid(), 'entry', 1, $1, '{{}}', now())"
    );
    client.execute(&insert, &[&1i32]).await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    client.execute(&insert, &[&2i32]).await.unwrap();
    client.execute(&insert, &[&3i32]).await.unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    client.execute(&insert, &[&4i32]).await.unwrap();

    let dir = std::env::temp_dir().join(format!("gh-{schema}"));
    std::fs::create_dir_all(&dir).unwrap();
    let good = journal_config(
        &dir,
        &schema,
        "id = \"uuid\"\nkind = { literal = \"$gap\" }\ntenant = { literal = 0 }\n\
         n = { next_version = [\"kind\", \"tenant\"] }\npayload = { literal = { reason = \"hole\" } }\nat = \"now\"\n",
    );
    let url = pg_url();
    let env = [("GAP_HEALER_CONNECTION_STRING", url.as_str())];
    let cfg = |path: &std::path::Path| path.display().to_string();
    let out = cli(&["check", "--config", &cfg(&good)], &env);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("the tombstone row fills"),
        "{}",
        out.stdout
    );
    let out = cli(
        &[
            "heal",
            "--once",
            "--config",
            &cfg(&good),
            "--gap-timeout",
            "1ms",
        ],
        &env,
    );
    assert_eq!(out.code, 0, "{}", out.all());
    let rows = client
        .query(
            &format!("SELECT seq, kind, tenant, n, payload::text, note FROM {schema}.journal ORDER BY seq"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i64, String, i32, i32, String, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    assert_eq!(
        got.iter()
            .map(|r| (r.0, r.1.as_str(), r.3))
            .collect::<Vec<_>>(),
        vec![
            (1, "entry", 1),
            (2, "$gap", 1),
            (3, "$gap", 2),
            (4, "entry", 4)
        ],
        "{got:?}"
    );
    assert_eq!(got[1].4, "{\"reason\": \"hole\"}");
    assert_eq!(got[1].5, None, "a column left out gets its default");

    // Mistakes `check` must name: a literal the column's type refuses, a
    // required column left out, a column that does not exist.
    let bad = journal_config(
        &dir,
        &schema,
        "id = \"uuid\"\nkind = { literal = \"$gap\" }\ntenant = { literal = \"zero\" }\n\
         payload = { literal = {} }\nat = \"now\"\nwhen = \"now\"\n",
    );
    let out = cli(&["check", "--config", &cfg(&bad)], &env);
    assert_ne!(out.code, 0, "{}", out.all());
    for needle in [
        "when: no such column",
        "not in the tombstone row: n",
        "invalid input syntax for type integer",
    ] {
        assert!(
            out.stdout.contains(needle),
            "{needle} not in:\n{}",
            out.all()
        );
    }
    // `run` refuses the table, healing nothing.
    let before = client
        .query_one(&format!("SELECT count(*) FROM {schema}.journal"), &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    let mut d = Daemon::spawn(
        &[
            "run".to_string(),
            "--config".into(),
            cfg(&bad),
            "--give-up-after".into(),
            "1s".into(),
            "--log-format".into(),
            "json".into(),
        ],
        &env,
    );
    let started = std::time::Instant::now();
    while d.alive() && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !d.alive(),
        "run kept going on a table it cannot fill:\n{}",
        d.log()
    );
    assert!(
        d.log().contains("not in the tombstone row: n"),
        "{}",
        d.log()
    );
    let after = client
        .query_one(&format!("SELECT count(*) FROM {schema}.journal"), &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(before, after);

    // Configuration mistakes stop before connecting, naming the key.
    let out = cli(
        &["check", "--config", &cfg(&good), "--profile", "eventuous"],
        &env,
    );
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(out.stderr.contains("table"), "{}", out.stderr);
    std::fs::remove_dir_all(dir).ok();
}

/// What `check` says about where a ledger-core store's scan starts is what
/// the scan does: `lookback` below the head (before, `check` said "at the
/// identity's seed" while the daemon started at head - lookback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_where_a_ledger_core_scan_starts_and_the_scan_starts_there() {
    let ledger = Ledger::new("ledger_start").await;
    for _ in 0..5 {
        ledger.append("account", 1, Ending::Commit, false).await;
    }
    let run = |args: &[&str]| {
        cli(
            &ledger
                .argv(args)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            &[],
        )
    };
    let check = run(&["check"]);
    let line = check
        .stdout
        .lines()
        .find(|l| l.contains("checkpoints table"))
        .unwrap_or_else(|| panic!("{}", check.all()));
    assert!(line.contains("`lookback` below the head"), "{line}");
    let scan = run(&["scan", "--lookback", "2", "--format", "json"]);
    let report = scan
        .stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{}", scan.all()));
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    assert_eq!(report["from"], 4, "head 5, lookback 2: {report}");
}

/// `run` with SQLStreamStore's tables (`--profile sqlstreamstore`).
fn sss_run_args(store: &SqlStreamStore, more: &[&str]) -> Vec<String> {
    let mut args = vec!["run".to_string()];
    args.extend(store.args());
    args.extend(["--log-format", "json"].map(String::from));
    args.extend(more.iter().map(|s| s.to_string()));
    args
}

/// The tombstone stream's versions are each of 0..n once (SQLStreamStore's
/// first version is 0) and its row says version n-1 and the highest
/// position, as SQLStreamStore leaves a stream's row after an append.
async fn assert_tombstone_stream_consistent(store: &SqlStreamStore) -> Vec<(i64, i32)> {
    let tombstones = store.tombstones().await;
    let mut versions: Vec<i32> = tombstones.iter().map(|(_, v)| *v).collect();
    versions.sort();
    assert_eq!(
        versions,
        (0..tombstones.len() as i32).collect::<Vec<_>>(),
        "tombstones (position, version): {tombstones:?}"
    );
    let row = store.tombstone_stream().await.expect("the stream's row");
    let highest = tombstones.iter().map(|(p, _)| *p).max().unwrap_or(-1);
    assert_eq!(
        row,
        (
            SSS_TOMBSTONE_STREAM.to_string(),
            tombstones.len() as i32 - 1,
            highest
        ),
        "the tombstone stream's row (name, version, position)"
    );
    tombstones
}

/// SQLStreamStore's appends, made statement by statement as its
/// append_to_stream makes them: a rolled-back append's positions become
/// messages of the tombstone stream (its own streams row, versions from 0,
/// the row's version and position raised with them); nothing is filled
/// while an append that may have drawn a position is open, neither the
/// position of an append holding its key nor that of an append racing it
/// to the same stream version, which waits on that key with its position
/// drawn and no key of its own, and inserts there once the first rolls
/// back. Fails before the profile existed: the configuration refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlstreamstore_holes_become_tombstone_messages_and_open_appends_keep_their_places() {
    let store = SqlStreamStore::new("sss").await;
    let check = cli(
        &store
            .argv(&["check"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(check.code, 0, "{}", check.all());
    for needle in [
        "(sqlstreamstore profile)",
        "sequence",
        "unique key pk_messages",
        "not made yet",
    ] {
        assert!(check.stdout.contains(needle), "{needle}: {}", check.stdout);
    }

    let a = store.append("account-1", 1, Ending::Commit).await;
    let rolled = store
        .append("account-2", 3, Ending::RollbackAfterInsert)
        .await;
    // account-1's next two versions, held open after the append's last
    // statement (the client has not committed yet).
    let slow = store.append_open("account-1", 2).await;
    // Another append to account-1, expecting version 0 as slow did: its
    // insert draws a position, then waits on slow's key for version 1.
    // (With ExpectedVersion.Any it would wait earlier, on slow's update of
    // the stream's row, before drawing.)
    let (racer_pid, racer) = store.append_in_background("account-1", 1, 0).await;
    assert!(
        wait_for(Duration::from_secs(5), || async {
            store.waits_on_a_lock(racer_pid).await
        })
        .await,
        "the racing append does not wait on the slow one's key"
    );
    let held = store.append_open("account-3", 1).await;
    let b = store.append("account-4", 1, Ending::Commit).await;
    assert_eq!(a, vec![0], "SQLStreamStore's positions start at 0");
    assert!(rolled[2] < slow.positions[0] && slow.positions[1] + 1 < held.positions[0]);
    let racer_position = slow.positions[1] + 1;
    let slow_positions = slow.positions.clone();
    assert_eq!(store.missing().await.len(), 3 + 2 + 1 + 1);

    let d = Daemon::spawn(
        &sss_run_args(
            &store,
            &timing("300ms", "50ms", &["--lock-timeout", "200ms"]),
        ),
        &[],
    );
    let waited = wait_for(Duration::from_secs(10), || async {
        !d.lines_containing("a transaction that may have drawn these positions is still open")
            .is_empty()
    })
    .await;
    assert!(waited, "{}", d.log());
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        store.tombstones().await.is_empty(),
        "filled while appends that may have drawn the positions were open: {:?}\n{}",
        store.rows().await,
        d.log()
    );
    held.commit()
        .await
        .expect("the held append commits: no tombstone took its place");
    slow.rollback().await;
    let raced = racer.await.expect("the racing append's task");
    assert_eq!(
        raced,
        Ok(vec![racer_position]),
        "the racing append inserts at the position it drew"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            store.missing().await.is_empty()
        })
        .await,
        "holes left: {:?}\n{}",
        store.missing().await,
        d.log()
    );
    let rows = store.rows().await;
    let at = |p: i64| rows.iter().find(|r| r.0 == p).cloned();
    assert_eq!(
        at(racer_position).map(|r| (r.1, r.2)),
        Some(("account-1".to_string(), 1)),
        "{rows:?}"
    );
    assert_eq!(at(b[0]).map(|r| r.1), Some("account-4".to_string()));
    let tombstones = assert_tombstone_stream_consistent(&store).await;
    let filled: Vec<i64> = tombstones.iter().map(|(p, _)| *p).collect();
    let mut want = rolled.clone();
    want.extend(&slow_positions);
    want.sort();
    assert_eq!(
        filled, want,
        "tombstones exactly at the rolled-back appends' positions"
    );
    let check = cli(
        &store
            .argv(&["check"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    );
    assert_eq!(check.code, 0, "{}", check.all());
    assert!(
        check.stdout.contains("5 tombstones, version 4"),
        "{}",
        check.stdout
    );
    d.terminate();
}

/// What `gap-healer sql` prints for the profile is every right its fill
/// needs (column rights on streams, the sequence that draws the stream
/// row's id_internal, the proof's sequence): `check` names what a bare login
/// lacks, and after the grants it passes and `heal --once` makes the
/// stream's row and fills as that login. Fails before: the configuration
/// refused the profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlstreamstore_grants_sql_prints_are_what_check_asks_and_enough_to_heal() {
    let store = SqlStreamStore::new("sss_grants").await;
    let role = format!("{}_healer", store.schema);
    store.guard.add_role(&role);
    store
        .client
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    let login = as_user(&store.url(), &role);
    store.append("account-1", 1, Ending::Commit).await;
    let rolled = store
        .append("account-2", 2, Ending::RollbackAfterInsert)
        .await;
    store.append("account-1", 1, Ending::Commit).await;

    let as_login = |args: &[&str]| {
        let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        argv.extend(store.args_at(&login));
        cli(&argv.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    let bare = as_login(&["check"]);
    assert_ne!(bare.code, 0, "{}", bare.all());
    assert!(
        bare.stdout.contains(&format!(
            "GRANT USAGE ON SCHEMA {} TO {role};",
            store.schema
        )),
        "{}",
        bare.stdout
    );

    let sql = cli(
        &[
            "sql",
            "--engine",
            "postgres",
            "--schema",
            &store.schema,
            "--profile",
            "sqlstreamstore",
            "--role",
            &role,
        ],
        &[],
    );
    assert_eq!(sql.code, 0, "{}", sql.all());
    store.client.batch_execute(&sql.stdout).await.unwrap();
    let granted = as_login(&["check"]);
    assert_eq!(granted.code, 0, "{}\n{}", granted.all(), sql.stdout);
    assert!(
        granted.stdout.contains("on its sequence"),
        "{}",
        granted.stdout
    );
    let heal = as_login(&["heal", "--once", "--gap-timeout", "1ms"]);
    assert_eq!(heal.code, 0, "{}", heal.all());
    let tombstones = assert_tombstone_stream_consistent(&store).await;
    assert_eq!(
        tombstones.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        rolled
    );
}

/// A reader that reads SQLStreamStore's all stream as its `read_all` does
/// (`position >= next`, next being one past the last read) skips an append
/// that commits after it has read past its positions; the same reader
/// bounded by the published watermark reads every message in order while
/// appends (quick, slow and rolled back, made as SQLStreamStore makes them)
/// run in parallel. Fails before: the configuration refused the profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlstreamstore_a_reader_bounded_by_the_watermark_loses_nothing_an_unbounded_one_skips() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let store = Arc::new(SqlStreamStore::new("sss_watermark").await);
    let table = format!("{}.watermarks", store.schema);
    let store_args = [
        "--schema",
        store.schema.as_str(),
        "--profile",
        "sqlstreamstore",
    ];
    gap_healer_testkit::pg::create_watermark_table(
        &store.client,
        &store.url(),
        &store_args,
        &table,
    )
    .await;
    let d = Daemon::spawn(
        &sss_run_args(
            &store,
            &timing(
                "300ms",
                "50ms",
                &["--watermark-table", &table, "--lock-timeout", "200ms"],
            ),
        ),
        &[],
    );
    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (store, writing) = (store.clone(), writing.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while writing.load(Ordering::Relaxed) {
                n += 1;
                let stream = format!("w{w}-{n}");
                match (w + n) % 4 {
                    0 | 1 => {
                        store.append(&stream, 1, Ending::Commit).await;
                    }
                    2 => {
                        let open = store.append_open(&stream, 2).await;
                        tokio::time::sleep(Duration::from_millis(100 + 150 * (n % 5))).await;
                        open.commit().await.unwrap();
                    }
                    _ => {
                        store.append(&stream, 1, Ending::RollbackAfterInsert).await;
                    }
                }
            }
        }));
    }
    let reader = gap_healer_testkit::pg::connect_to(&store.url()).await;
    let unbounded_sql = format!(
        "SELECT position FROM {}.messages WHERE position >= $1 ORDER BY position LIMIT 100",
        store.schema
    );
    let bounded_sql = format!(
        "SELECT position FROM {}.messages WHERE position >= $1 \
         AND position <= (SELECT position FROM {table} WHERE store = 'default') \
         ORDER BY position LIMIT 100",
        store.schema
    );
    let (mut bounded, mut unbounded) = (Vec::<i64>::new(), Vec::<i64>::new());
    let read = |seen: &mut Vec<i64>, rows: Vec<tokio_postgres::Row>| {
        seen.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    };
    // One slow append the unbounded reader is made to pass: it stays open
    // until that reader has read a later commit.
    let slow = store.append_open("slow", 1).await;
    let after = store.append("quick", 1, Ending::Commit).await;
    let started = std::time::Instant::now();
    let mut slow = Some(slow);
    let mut slow_positions = Vec::new();
    while started.elapsed() < Duration::from_secs(5) {
        for (sql, seen) in [
            (&bounded_sql, &mut bounded),
            (&unbounded_sql, &mut unbounded),
        ] {
            let next = seen.last().map_or(0, |p| p + 1);
            let rows = reader.query(sql.as_str(), &[&next]).await.unwrap();
            read(seen, rows);
        }
        if unbounded.last().is_some_and(|p| *p >= after[0]) {
            if let Some(open) = slow.take() {
                slow_positions = open.positions.clone();
                open.commit().await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writing.store(false, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        slow.is_none(),
        "the unbounded reader never passed the slow append"
    );
    let head = store.head().await;
    let mark = || async {
        store
            .client
            .query_opt(
                &format!("SELECT position FROM {table} WHERE store = 'default'"),
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get::<_, i64>(0))
    };
    assert!(
        wait_for(Duration::from_secs(10), || async {
            mark().await == Some(head)
        })
        .await,
        "the watermark did not reach the head {head}: {:?}\n{}",
        mark().await,
        d.log()
    );
    loop {
        let next = bounded.last().map_or(0, |p| p + 1);
        let rows = reader.query(bounded_sql.as_str(), &[&next]).await.unwrap();
        if rows.is_empty() {
            break;
        }
        read(&mut bounded, rows);
    }
    assert!(store.missing().await.is_empty());
    assert_eq!(
        bounded,
        (0..=head).collect::<Vec<_>>(),
        "the bounded reader skipped"
    );
    let seen: std::collections::BTreeSet<i64> = unbounded.iter().copied().collect();
    for p in &slow_positions {
        assert!(
            !seen.contains(p),
            "the unbounded reader read the slow append at {p}"
        );
    }
    let tombstones: std::collections::BTreeSet<i64> =
        store.tombstones().await.iter().map(|(p, _)| *p).collect();
    let skipped = (0..=*unbounded.last().unwrap_or(&0))
        .filter(|p| !seen.contains(p) && !tombstones.contains(p))
        .count();
    assert_tombstone_stream_consistent(&store).await;
    println!(
        "sqlstreamstore watermark: {} positions ({} tombstones); the bounded reader skipped 0, the unbounded one {skipped} (the slow append at {slow_positions:?} among them)",
        head + 1,
        tombstones.len()
    );
    d.terminate();
}
