//! Table profiles on the real PostgreSQL and the real binary: seed 003's
//! ledger-core table healed with versioned tombstones while a slow append
//! keeps its place; a custom table described in TOML, and `check` naming
//! every mistake in its description; two healers of one ledger never
//! reusing a tombstone version.

use std::time::Duration;

use gap_healer_testkit::bin::{cli, timing, Daemon};
use gap_healer_testkit::ledger::{Ledger, TOMBSTONE_CATEGORY};
use gap_healer_testkit::pg::{connect, pg_url, schema_name, Ending, Guard};
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
