//! The healer against the real PostgreSQL: the scenarios of the core issue
//! that only PostgreSQL runs here. Each test has its own schema, dropped by
//! the kit's guard when the test ends, also when it fails. What every engine
//! must show, and the healer scenarios written once for both (the seed's
//! reproduction, the 10,000-wide jump, a held position inside it, scattered
//! holes), are the engine contract's (`contract::pg::*`). Timing figures are
//! printed; assertions use generous bounds so a busy machine does not flake
//! them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::config::StartFrom;
use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::engine::{DbErrorKind, Fence};
use gap_healer::gaps::PosRange;
use gap_healer::healer::{Ended, Healer, Options};
use gap_healer_testkit::bin::{timing, Daemon};
use gap_healer_testkit::engine::FillRange;
use gap_healer_testkit::eventuous::EVENT_TYPE;
use gap_healer_testkit::pg::{connect, Ending, Store};
use gap_healer_testkit::wait::time_until;
use tokio_util::sync::CancellationToken;

fn engine(store: &Store) -> Arc<PostgresEngine> {
    store.engine()
}

fn options(gap_timeout: Duration) -> Options {
    Options {
        store: Default::default(),
        gap_timeout,
        poll_interval: Duration::from_millis(100),
        lock_timeout: Duration::from_millis(500),
        scan_page_size: 10_000,
        start_from: StartFrom::Position(1),
        lookback: 1_000_000,
        dry_run: false,
        give_up_after: None,
        publish_watermark: false,
    }
}

fn healer(store: &Store, opts: Options) -> Healer<PostgresEngine> {
    gap_healer_testkit::engine::healer(engine(store), opts)
}

/// Runs a healer in the background until the returned token is cancelled.
fn spawn_healer(
    store: &Store,
    opts: Options,
) -> (CancellationToken, tokio::task::JoinHandle<Ended>) {
    let stop = CancellationToken::new();
    let task = tokio::spawn(healer(store, opts).run(stop.clone()));
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_append_held_open_is_never_overwritten_then_commits() {
    let store = Store::new("slow_commit").await;
    let gap_timeout = Duration::from_millis(500);
    let open = store.open_append_between(2).await;
    let held = open.positions.clone();
    let (stop, task) = spawn_healer(&store, options(gap_timeout));
    tokio::time::sleep(gap_timeout * 3).await;
    assert!(
        store.tombstone_positions().await.is_empty(),
        "a held position was filled"
    );
    open.commit()
        .await
        .expect("the slow append commits: no tombstone took its key");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = store.rows().await;
    for p in &held {
        let row = rows.iter().find(|r| r.0 == *p).expect("event present");
        assert_eq!((row.1.as_str(), row.2.as_str()), ("slow", EVENT_TYPE));
    }
    assert!(store.missing().await.is_empty());
    assert!(store.tombstone_positions().await.is_empty());
    stop.cancel();
    assert_eq!(task.await.unwrap(), Ended::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_append_rolling_back_late_is_filled_promptly() {
    let store = Store::new("slow_rollback").await;
    let gap_timeout = Duration::from_millis(500);
    let open = store.open_append_between(1).await;
    let p = open.positions[0];
    let (stop, task) = spawn_healer(&store, options(gap_timeout));
    tokio::time::sleep(gap_timeout * 3).await;
    assert!(store.tombstone_positions().await.is_empty());
    open.rollback().await;
    let rolled_back = Instant::now();
    let took = time_until(rolled_back, Duration::from_secs(10), || async {
        store.tombstone_positions().await == vec![p]
    })
    .await
    .expect("filled after the rollback");
    println!("late rollback: position {p} filled {took:?} after the rollback");
    // Retries of a held position back off to at most 2 s (plus one lock wait).
    assert!(took <= Duration::from_secs(4), "{took:?}");
    stop.cancel();
    assert_eq!(task.await.unwrap(), Ended::Stopped);
    store.assert_tombstone_stream_consistent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_filled_before_gap_timeout_and_tail_never_filled() {
    let store = Store::new("timing").await;
    store.append_holes(&[1]).await;
    let gap_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let (stop, task) = spawn_healer(&store, options(gap_timeout));
    // The healer has seen the hole; then an append in flight at the tail,
    // above the highest committed row.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tail = store.append_open("tail", 1).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        store.tombstone_positions().await.is_empty(),
        "filled before gap_timeout"
    );
    let at = time_until(started, Duration::from_secs(6), || async {
        store.tombstone_positions().await == vec![2]
    })
    .await
    .expect("hole filled after gap_timeout");
    println!("hole filled {at:?} after the healer started (gap_timeout {gap_timeout:?})");
    assert!(at >= gap_timeout);
    tokio::time::sleep(Duration::from_secs(1)).await;
    tail.commit()
        .await
        .expect("the tail append commits: the healer never touched it");
    assert_eq!(store.tombstone_positions().await, vec![2]);
    stop.cancel();
    assert_eq!(task.await.unwrap(), Ended::Stopped);
}

/// The transaction-end proof at the tail: an append open when the healer
/// first reads a hole may have drawn it, whatever position it shows later,
/// so the hole waits for it, past gap_timeout, and is filled once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_read_while_an_append_is_open_waits_for_it() {
    let store = Store::new("timing_open").await;
    store.append_holes(&[1]).await;
    let tail = store.append_open("tail", 1).await;
    let gap_timeout = Duration::from_millis(500);
    let (stop, task) = spawn_healer(&store, options(gap_timeout));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        store.tombstone_positions().await.is_empty(),
        "filled while a transaction that may have drawn the hole was open"
    );
    let ended = Instant::now();
    tail.commit().await.expect("the tail append commits");
    let at = time_until(ended, Duration::from_secs(5), || async {
        store.tombstone_positions().await == vec![2]
    })
    .await
    .expect("the hole is filled once the append has ended");
    println!("filled {at:?} after the open append ended");
    stop.cancel();
    assert_eq!(task.await.unwrap(), Ended::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_healers_keep_the_tombstone_stream_consistent() {
    let store = Store::new("two").await;
    for i in 0..40 {
        store.append(&format!("s{i}"), 1, Ending::Commit).await;
        store
            .append("fail", 1 + i % 3, Ending::RollbackAfterInsert)
            .await;
    }
    store.append("end", 1, Ending::Commit).await;
    let missing = store.missing().await.len();
    let flags = timing("200ms", "50ms", &["--no-leader-election"]);
    let a = Daemon::start(&store, &flags);
    let b = Daemon::start(&store, &flags);
    store.wait_until_healed(Duration::from_secs(15)).await;
    assert!(store.missing().await.is_empty());
    let filled_a = a
        .metric("gap_healer_tombstones_inserted_total")
        .await
        .unwrap();
    let filled_b = b
        .metric("gap_healer_tombstones_inserted_total")
        .await
        .unwrap();
    println!(
        "two healers: {missing} positions filled, {filled_a} by one and {filled_b} by the other"
    );
    assert_eq!(
        (filled_a + filled_b) as usize,
        missing,
        "every position filled exactly once"
    );
    assert_eq!(
        store.assert_tombstone_stream_consistent().await as usize,
        missing
    );
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_run_and_restarted_leaves_no_duplicate_or_missing_tombstone() {
    let store = Store::new("kill").await;
    for i in 0..30 {
        store.append("a", 1, Ending::Commit).await;
        store.append("x", 1, Ending::RollbackAfterInsert).await;
        if i % 10 == 0 {
            store.jump_identity(30_000).await;
        }
    }
    store.append("a", 1, Ending::Commit).await;
    let missing = store.missing().await.len();
    let flags = timing("100ms", "50ms", &["--no-leader-election"]);
    // Kill at several points of the run, including mid-fill of the wide holes.
    for delay_ms in [150u64, 400, 700] {
        let d = Daemon::start(&store, &flags);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        d.kill9();
        store.assert_tombstone_stream_consistent().await;
    }
    let d = Daemon::start(&store, &flags);
    store.wait_until_healed(Duration::from_secs(20)).await;
    drop(d);
    assert!(store.missing().await.is_empty());
    let tombstones = store.tombstone_positions().await;
    assert_eq!(
        tombstones.len(),
        missing,
        "no duplicate, no missing tombstone"
    );
    assert_eq!(
        store.assert_tombstone_stream_consistent().await as usize,
        missing
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing() {
    let store = Store::with_holes("dry", &[3]).await;
    let d = Daemon::start(&store, &timing("100ms", "50ms", &["--dry-run"]));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(d.metric("gap_healer_open_gap_positions").await, Some(3.0));
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0));
    assert!(log.contains("dry run: would fill"), "{log}");
    let out = store.heal_once("0s", &["--dry-run"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("dry run: would have filled 3"),
        "{}",
        out.stdout
    );
    assert_eq!(store.missing().await, vec![2, 3, 4]);
    assert!(store.tombstone_positions().await.is_empty());
}

/// Starting points: checkpoints (lowest wins), head, lookback. (The fill's
/// answers this test began with are the contract's
/// `lock_outcomes_held_committed_then_filled_after_rollback`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_points_checkpoints_head_lookback() {
    let store = Store::with_holes("start_points", &[1]).await;
    store.set_checkpoint("projection-a", Some(2)).await;
    store.set_checkpoint("projection-b", Some(1)).await;
    let mut o = options(Duration::ZERO);
    o.start_from = StartFrom::Checkpoints;
    assert_eq!(healer(&store, o.clone()).begin().await.unwrap().after, 1);
    o.start_from = StartFrom::Head;
    assert_eq!(
        healer(&store, o.clone()).begin().await.unwrap().after,
        store.head().await
    );
    store
        .client
        .batch_execute(&format!("DELETE FROM {}.checkpoints", store.schema))
        .await
        .unwrap();
    o.start_from = StartFrom::Checkpoints;
    o.lookback = 1;
    assert_eq!(
        healer(&store, o).begin().await.unwrap().after,
        store.head().await - 1
    );
}

/// A lock-timeout storm: 24 slow appends hold positions scattered among
/// 1,000 one-position holes, all due at once. The free 976 must be filled in
/// the same cycle, each held position costs a bounded wait, none is taken,
/// and once the appends end, the rolled-back ones are filled and the
/// committed ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_storm_fills_the_free_and_takes_no_held_position() {
    let store = Store::new("storm").await;
    let s = &store.schema;
    // 1,000 rows at even positions: 1,000 one-position holes (1, 3, ..., 1,999).
    store.insert_bulk(1_000, "g * 2").await;
    // 24 open appends, one per connection, at holes spread over the range.
    let held_at: Vec<i64> = (0..24).map(|i| 1 + 2 * (20 + 40 * i)).collect();
    let mut open = Vec::new();
    for (i, p) in held_at.iter().enumerate() {
        let c = connect().await;
        c.batch_execute("BEGIN").await.unwrap();
        c.execute(
            &format!("INSERT INTO {s}.streams (stream_name) VALUES ($1)"),
            &[&format!("slow-{i}")],
        )
        .await
        .unwrap();
        c.execute(
            &format!(
                "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                 OVERRIDING SYSTEM VALUE
                 SELECT gen_random_uuid(), 'TestEvent', stream_id, 0, $2, '{{}}', now() FROM {s}.streams WHERE stream_name = $1"
            ),
            &[&format!("slow-{i}"), p],
        )
        .await
        .unwrap();
        open.push(c);
    }
    let mut h = healer(&store, options(Duration::ZERO));
    h.scan_step().await.unwrap();
    assert_eq!(h.tracker().len(), 1_000);
    let started = Instant::now();
    let report = h.fill_due(&CancellationToken::new()).await;
    let took = started.elapsed();
    println!(
        "lock-timeout storm, 24 held among 1,000 holes (lock_timeout 500 ms): {} tombstones in {took:?}, {} statements, {} lock timeouts",
        report.tombstones, report.statements, report.held
    );
    assert_eq!(report.tombstones, 976);
    assert_eq!(store.missing().await, held_at);
    // The next cycle, with every append still open: the known-held positions
    // are tried one by one with the short probe (the last with the full
    // lock_timeout), not batched and searched for again.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let started = Instant::now();
    let again = h.fill_due(&CancellationToken::new()).await;
    println!(
        "  the next cycle, all still held: {:?}, {} statements, {} lock timeouts",
        started.elapsed(),
        again.statements,
        again.held
    );
    assert_eq!(
        (again.tombstones, again.statements, again.held),
        (0, 24, 24)
    );

    // Half the slow appends commit, half roll back: every commit succeeds.
    let mut committed = Vec::new();
    for (i, c) in open.into_iter().enumerate() {
        if i % 2 == 0 {
            c.batch_execute("COMMIT")
                .await
                .expect("a tombstone took an open append's key");
            committed.push(held_at[i]);
        } else {
            c.batch_execute("ROLLBACK").await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = h.fill_due(&CancellationToken::new()).await;
    assert_eq!(report.tombstones, 12, "{report:?}");
    assert!(store.missing().await.is_empty());
    let kept: Vec<i64> = store
        .client
        .query(
            &format!(
                "SELECT m.global_position FROM {s}.messages m JOIN {s}.streams st USING (stream_id)
                 WHERE st.stream_name LIKE 'slow-%' ORDER BY 1"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, committed);
    assert_eq!(store.assert_tombstone_stream_consistent().await, 988);
}

/// Issue 10: a column of an unexpected type is a permanent error that names
/// the column, never a panic (`Row::get` used to panic on database data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_of_an_unexpected_type_is_an_error_naming_it_not_a_panic() {
    let store = Store::with_holes("coltype", &[1]).await;
    let s = &store.schema;
    store
        .client
        .batch_execute(&format!(
            "ALTER TABLE {s}.streams ALTER COLUMN version TYPE bigint;"
        ))
        .await
        .unwrap();
    let e = store.engine();
    let err = e
        .fill(
            PosRange::single(2),
            Duration::from_secs(1),
            &Fence::Unfenced,
        )
        .await
        .expect_err("streams.version is bigint: the fill cannot read it as the int Eventuous uses");
    assert_eq!(err.kind, DbErrorKind::Permanent, "{err:?}");
    assert!(err.message.contains("column version"), "{}", err.message);
    assert!(store.missing().await.contains(&2), "nothing was written");
}

/// A daemon started while the store's first append is open (position 1
/// drawn, 2 committed), no watermark, the default start: before, the scan
/// began at the first committed row, so when the append rolled back
/// position 1 was never examined or filled, and the contiguous position
/// claimed 2. Now the scan begins at the sequence's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_append_open_at_the_start_is_examined_and_filled_after_its_rollback() {
    let store = Store::new("first_open").await;
    let open = store.append_open("slow", 1).await;
    assert_eq!(open.positions, vec![1]);
    store.append("B", 1, Ending::Commit).await;
    let mut h = healer(
        &store,
        Options {
            store: Default::default(),
            start_from: StartFrom::Checkpoints,
            lookback: 10,
            ..options(Duration::ZERO)
        },
    );
    h.scan_step().await.unwrap();
    assert_eq!(h.tracker().ranges(), vec![PosRange::single(1)]);
    assert_eq!(
        h.contiguous(),
        Some(0),
        "nothing proven above an unexamined position"
    );
    open.rollback().await;
    let report = h.fill_due(&CancellationToken::new()).await;
    assert_eq!(report.tombstones, 1, "{report:?}");
    assert_eq!(store.tombstone_positions().await, vec![1]);
    h.scan_step().await.unwrap();
    assert_eq!(h.contiguous(), Some(2));
}

/// More scattered holes than the tracker keeps (`MAX_TRACKED`): a scan
/// pauses once it is full, claiming nothing above where it stopped (the
/// contiguous position stays below the first untracked hole), and
/// `heal --once` heals them all in rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_holes_than_the_tracker_keeps_are_healed_in_rounds() {
    let store = Store::new("tracker_bound").await;
    let n = gap_healer::healer::MAX_TRACKED as i32 + 5_000;
    store.insert_bulk(i64::from(n), "g * 2").await;
    let mut h = healer(&store, options(Duration::from_secs(3600)));
    h.scan_to_head(&CancellationToken::new(), &mut gap_healer::healer::LogOnly)
        .await
        .unwrap();
    let tracked = h.tracker().len();
    println!(
        "{n} holes: {tracked} tracked, scan paused at {:?}",
        h.examined()
    );
    assert!(h.scan_paused());
    assert!(tracked >= gap_healer::healer::MAX_TRACKED, "{tracked}");
    assert!(tracked < n as usize, "{tracked}");
    let examined = h.examined().unwrap();
    assert!(
        examined < 2 * i64::from(n),
        "the scan stopped short of the head"
    );
    assert!(h.contiguous().unwrap() < examined);
    drop(h);
    let started = Instant::now();
    let out = store.heal_once("0s", &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    println!("heal --once of {n} holes: {:?}", started.elapsed());
    assert!(store.missing().await.is_empty(), "{}", out.all());
    assert_eq!(store.tombstone_positions().await.len(), n as usize);
}
