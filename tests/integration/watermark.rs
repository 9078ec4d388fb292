//! The published contiguous watermark: a reader that bounds its naive
//! `global_position > last` query by it never skips an event that commits
//! late, while appends run in parallel; it never decreases; a restart
//! resumes the proof from it; `check` and `sql` know its table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer_testkit::bin::{cli, timing, Daemon};
use gap_healer_testkit::pg::{connect, Ending, Store};
use gap_healer_testkit::wait::until as wait_for;

/// Creates the watermark table from what `gap-healer sql` prints.
async fn create_watermark_table(store: &Store, table: &str) {
    gap_healer_testkit::pg::create_watermark_table(
        &store.client,
        &store.url(),
        &["--schema", &store.schema],
        table,
    )
    .await;
}

async fn watermark(store: &Store, table: &str) -> Option<i64> {
    store
        .client
        .query_opt(
            &format!("SELECT position FROM {table} WHERE store = 'default'"),
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_bounded_by_the_watermark_never_skips_a_late_commit() {
    let store = Arc::new(Store::new("watermark").await);
    let table = format!("{}.watermarks", store.schema);
    create_watermark_table(&store, &table).await;
    let out = store.cli(&["check", "--watermark-table", &table]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("watermark table"), "{}", out.stdout);

    let d = Daemon::start(
        &store,
        &timing(
            "300ms",
            "50ms",
            &["--watermark-table", &table, "--lock-timeout", "200ms"],
        ),
    );
    // Writers: quick commits, slow appends (open 100-700 ms) that commit or
    // roll back, each on a stream of its own.
    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for w in 0..4 {
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
                        let open = store.append_open(&stream, 1).await;
                        tokio::time::sleep(Duration::from_millis(100 + 100 * (n % 4))).await;
                        open.rollback().await;
                    }
                }
            }
        }));
    }
    // Two readers at once: one bounded by the watermark, one naive.
    let reader = connect().await;
    let (bounded_sql, naive_sql) = (
        format!(
            "SELECT global_position FROM {s}.messages WHERE global_position > $1 AND global_position <= (SELECT position FROM {table} WHERE store = 'default') ORDER BY global_position",
            s = store.schema
        ),
        format!(
            "SELECT global_position FROM {}.messages WHERE global_position > $1 ORDER BY global_position",
            store.schema
        ),
    );
    let (mut bounded, mut naive) = (Vec::<i64>::new(), Vec::<i64>::new());
    let mut marks = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        for (sql, seen) in [(&bounded_sql, &mut bounded), (&naive_sql, &mut naive)] {
            let last = seen.last().copied().unwrap_or(0);
            for row in reader.query(sql.as_str(), &[&last]).await.unwrap() {
                seen.push(row.get(0));
            }
        }
        marks.extend(watermark(&store, &table).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writing.store(false, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let stopped = Instant::now();
    let head = store.head().await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            watermark(&store, &table).await == Some(head)
        })
        .await,
        "the watermark did not reach the head {head}: {:?}\n{}",
        watermark(&store, &table).await,
        d.log()
    );
    let caught_up = stopped.elapsed();
    // Read what is left, bounded.
    let last = bounded.last().copied().unwrap_or(0);
    for row in reader.query(bounded_sql.as_str(), &[&last]).await.unwrap() {
        bounded.push(row.get(0));
    }
    // Every position is an event or a tombstone now, and the bounded reader
    // saw each one, in order: nothing skipped.
    assert!(store.missing().await.is_empty());
    assert_eq!(
        bounded,
        (1..=head).collect::<Vec<_>>(),
        "the bounded reader skipped"
    );
    // The naive reader saw positions past a slow append and skipped its
    // events when they committed later.
    let naive_seen: std::collections::BTreeSet<i64> = naive.iter().copied().collect();
    let tombstones = store.tombstone_positions().await;
    let skipped = (1..=*naive.last().unwrap_or(&0))
        .filter(|p| !naive_seen.contains(p) && !tombstones.contains(p))
        .count();
    assert!(
        marks.windows(2).all(|w| w[0] <= w[1]),
        "the watermark went down: {marks:?}"
    );
    println!(
        "watermark: {} positions ({} tombstones), {} watermark readings never decreasing; the bounded reader skipped 0 events, the naive one {skipped} (slow appends' events it had passed before they committed); at the head {caught_up:?} after the writers stopped",
        head,
        tombstones.len(),
        marks.len()
    );
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");

    // A restart resumes from the published watermark, not from the start.
    let d = Daemon::start(
        &store,
        &[
            "--watermark-table",
            &table,
            "--gap-timeout",
            "300ms",
            "--poll-interval",
            "50ms",
        ],
    );
    let from = format!("\"from\":{}", head + 1);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            d.log().contains(&from)
        })
        .await,
        "not resumed at {}: {}",
        head + 1,
        d.log()
    );
    d.terminate();
}

#[tokio::test]
async fn check_names_a_missing_or_unwritable_watermark_table() {
    let store = Store::new("watermark_check").await;
    let table = format!("{}.watermarks", store.schema);
    let out = store.cli(&["check", "--watermark-table", &table]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(
        out.stdout.contains(&format!(
            "{table} does not exist: as the owner of {}, run what `gap-healer sql --engine postgres \
             --schema {} --watermark-table {table} --role postgres` prints",
            store.schema, store.schema
        )),
        "{}",
        out.stdout
    );
    store
        .client
        .batch_execute(&format!("CREATE TABLE {table} (store text, position int)"))
        .await
        .unwrap();
    let out = store.cli(&["check", "--watermark-table", &table]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(
        out.stdout
            .contains("lacks the column(s) position bigint, updated_at"),
        "{}",
        out.stdout
    );
    // SQL Server: the table's DDL comes with the setup script (the table is
    // checked and written on a server in mssql::watermark_published_...).
    let out = cli(
        &["sql", "--engine", "mssql", "--watermark-table", "dbo.w"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("IF OBJECT_ID(N'dbo.w', N'U') IS NULL"),
        "{}",
        out.all()
    );
}

/// A watermark table that is missing stops no healing: before, every scan
/// failed "read the watermark: 42P01" and a hole stayed open. Now the holes
/// are filled, `/status` and the watermark error counter say why nothing is
/// published, and once the table exists the watermark is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_that_cannot_be_published_stops_no_healing() {
    let store = Store::with_holes("watermark_missing", &[2]).await;
    let table = format!("{}.watermarks", store.schema);
    let daemon = Daemon::start(
        &store,
        &timing("200ms", "50ms", &["--watermark-table", &table]),
    );
    assert!(
        store.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        daemon.log()
    );
    let errors = daemon
        .metric(r#"gap_healer_db_errors_total{operation="watermark",store="default"}"#)
        .await
        .unwrap_or(0.0);
    assert!(errors >= 1.0, "{}", daemon.log());
    let (_, status) = daemon.get("/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let why = status["stores"][0]["watermark_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("watermarks"), "{status}");
    create_watermark_table(&store, &table).await;
    let head = *store.rows().await.iter().map(|r| &r.0).max().unwrap();
    let published = gap_healer_testkit::wait::until(Duration::from_secs(10), || async {
        watermark(&store, &table).await == Some(head)
    })
    .await;
    assert!(published, "{}", daemon.log());
    let (_, status) = daemon.get("/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(status["stores"][0]["watermark_error"].is_null(), "{status}");
    drop(daemon);
}

/// Two single-store daemons, both stores named `default`, publish to one
/// watermark table (as a README example invited). Before, B's daemon
/// started its proof from A's row (never examining its own hole) and raised
/// A's row to its own head, above an append A could still commit. Now a
/// row describes one table: A's stays A's, B heals its hole anyway and says
/// why it does not publish, and `check` names the row's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_row_is_never_shared_by_two_stores() {
    let a = Store::new("watermark_a").await;
    let b = Store::new("watermark_b").await;
    let table = format!("{}.watermarks", a.schema);
    create_watermark_table(&a, &table).await;
    a.append("S", 100, Ending::Commit).await;
    b.append("S", 40, Ending::Commit).await;
    b.append("X", 19, Ending::RollbackAfterInsert).await;
    b.append("S", 141, Ending::Commit).await;
    let flags = timing("200ms", "50ms", &["--watermark-table", table.as_str()]);
    let da = Daemon::start(&a, &flags);
    let published = wait_for(Duration::from_secs(10), || async {
        watermark(&a, &table).await == Some(100)
    })
    .await;
    assert!(published, "{}", da.log());
    let db = Daemon::start(&b, &flags);
    assert!(
        b.wait_until_healed(Duration::from_secs(10)).await,
        "B heals its own hole: {}",
        db.log()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        watermark(&a, &table).await,
        Some(100),
        "B never raises A's row"
    );
    let (_, status) = db.get("/status").await;
    assert!(status.contains("describes"), "{status}");
    drop((da, db));
    let out = b.cli(&["check", "--watermark-table", &table]);
    assert_eq!(out.code, 3, "{}", out.all());
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("FAIL watermark table"))
        .unwrap_or_else(|| panic!("{}", out.all()));
    assert!(
        line.contains(&format!(".{}.messages, not ", a.schema)),
        "{line}"
    );
    let out = a.cli(&["check", "--watermark-table", &table]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("published up to position 100"),
        "{}",
        out.stdout
    );
}

/// `scan` and `heal --once` honour `--start-from` with a watermark table
/// set (before, they started from the published watermark whatever the
/// flag said); from below the watermark the proof holds, and the healed
/// store's head is published; from above it nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_commands_honour_start_from_beside_a_watermark_table() {
    let store = Store::with_holes("watermark_oneshot", &[1, 1]).await;
    let table = format!("{}.watermarks", store.schema);
    create_watermark_table(&store, &table).await;
    let s = &store.schema;
    // A watermark published above both holes (as if an older run had).
    store
        .client
        .batch_execute(&format!(
            "INSERT INTO {table} (store, position, healed_table) VALUES ('default', 4, current_database() || '.{s}.messages')"
        ))
        .await
        .unwrap();
    let out = store.cli(&["scan", "--start-from", "0", "--watermark-table", &table]);
    assert_eq!(
        out.code,
        1,
        "holes found below the watermark: {}",
        out.all()
    );
    let out = store.heal_once("0s", &["--watermark-table", &table]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(store.missing().await.is_empty(), "{}", out.all());
    assert_eq!(
        watermark(&store, &table).await,
        Some(5),
        "healed from position 1: the head"
    );
    store.append("D", 1, Ending::Commit).await;
    store.append("X", 1, Ending::RollbackAfterInsert).await;
    store.append("E", 1, Ending::Commit).await;
    let out = store.cli(&[
        "heal",
        "--once",
        "--start-from",
        "7",
        "--gap-timeout",
        "0s",
        "--watermark-table",
        &table,
    ]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(store.missing().await.is_empty(), "{}", out.all());
    assert_eq!(
        watermark(&store, &table).await,
        Some(5),
        "a run from above the watermark publishes nothing"
    );
}

/// Issue 20 item 3: the watermark set-up works as printed. Before, `sql
/// --watermark-table <new schema>.watermarks | psql` failed with `schema ...
/// does not exist`, `check` only said to run what `sql` prints, and the
/// role placeholder `gap_healer` was also the example's schema name, so
/// replacing it as told rewrote the table's name. Now `check`, as the
/// healer's own login, names the exact command; its output, run as
/// printed, creates the schema and the table and grants that login what it
/// needs; `check` then passes as the login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_watermark_setup_runs_as_printed_into_a_new_schema() {
    let store = Store::new("wm_setup").await;
    let wm_schema = format!("{}_wm", store.schema);
    let _wm_schema = gap_healer_testkit::pg::Guard::schema(&store.url(), &wm_schema);
    let table = format!("{wm_schema}.watermarks");
    let role = format!("{}_healer", store.schema);
    let login = store.create_login(&role).await;
    let check = ["check", "--watermark-table", table.as_str()];
    let before = store.cli_at(&login, &check);
    assert_ne!(before.code, 0, "{}", before.all());
    let command = format!(
        "gap-healer sql --engine postgres --schema {} --watermark-table {table} --role {role}",
        store.schema
    );
    assert!(before.stdout.contains(&command), "{}", before.stdout);
    let printed = store.cli(&["sql", "--watermark-table", &table, "--role", &role]);
    assert_eq!(printed.code, 0, "{}", printed.all());
    assert!(
        printed
            .stdout
            .lines()
            .filter(|l| l.starts_with("GRANT"))
            .all(|l| l.ends_with(&format!(" TO {role};"))),
        "{}",
        printed.stdout
    );
    store
        .client
        .batch_execute(&printed.stdout)
        .await
        .expect("the printed set-up runs as printed");
    let after = store.cli_at(&login, &check);
    assert_eq!(after.code, 0, "{}", after.all());
}
