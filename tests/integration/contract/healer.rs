//! The healer's scenarios of the contract ([`super`]), written once for
//! both engines: the seed's reproduction with the real binary and an
//! Eventuous-rules subscriber (stuck without the healer, handled within
//! gap_timeout with it), the 10,000-wide identity jump (filled by the
//! in-process healer in one cycle, and by `heal --once`), a held position
//! inside such a jump, and scattered one-position holes (sharing fill
//! transactions in the healer, with one held among them, and in one
//! `fill_ranges` call, refused whole for a committed or held one among
//! them). Timing figures are printed (the README and docs/benchmarks.md
//! quote them); assertions use generous bounds so a busy machine does not
//! flake them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gap_healer::engine::{Engine, Fence, FillOutcome};
use gap_healer::gaps::PosRange;
use gap_healer_testkit::bin::{self, timing, Daemon};
use gap_healer_testkit::engine::{fill_wide_hole_around_one_held, healer};
use gap_healer_testkit::eventuous::{EVENT_TYPE, TOMBSTONE_TYPE};
use gap_healer_testkit::subscriber::Subscriber;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    as_strs, missing, options, rolled_back_append, row_at, single, store_with_streams, Server,
};

/// Why a case whose held position is an explicit insert cannot run on
/// Babelfish.
const IDENTITY_INSERT_IS_READ: &str =
    "an identity insert takes the identity's sequence lock there, so the transaction-end \
     proof waits for it and no fill meets its key \
     (a_hole_waits_for_every_transaction_open_when_it_was_read covers that)";

/// Whether a case whose held position is an explicit insert can run on
/// this server (the fill's key wait decides there); where it cannot
/// (Babelfish), it is reported as skipped, with the reason.
async fn held_by_its_key<S: Server>(s: &S, case: &str) -> bool {
    !(s.explicit_insert_is_read().await && s.skipped(case, IDENTITY_INSERT_IS_READ).await)
}

/// `gap-healer ARGS` on the store, `flags` after, run to its end within
/// `within`: its exit code and output.
async fn cli<S: Server>(s: &S, args: &[&str], flags: &[&str], within: Duration) -> (i32, String) {
    let argv: Vec<String> = args
        .iter()
        .map(|a| a.to_string())
        .chain(s.store_args())
        .chain(flags.iter().map(|f| f.to_string()))
        .collect();
    let cmd = bin::command(argv, std::iter::empty::<(&str, &str)>());
    bin::run(cmd, within).await
}

/// `gap-healer scan` from the first position: its exit code and output.
async fn scan<S: Server>(s: &S) -> (i32, String) {
    cli(
        s,
        &["scan"],
        &["--start-from", "0"],
        Duration::from_secs(60),
    )
    .await
}

/// `gap-healer heal --once` of every hole, due at once, from the first
/// position, within `within`: its exit code and output.
pub async fn heal_everything_once<S: Server>(s: &S, within: Duration) -> (i32, String) {
    cli(
        s,
        &["heal", "--once"],
        &[
            "--start-from",
            "0",
            "--gap-timeout",
            "0s",
            "--lock-timeout",
            "2s",
        ],
        within,
    )
    .await
}

/// The positions of the tombstones among `rows`.
fn tombstones(rows: &[super::Row]) -> Vec<i64> {
    rows.iter()
        .filter(|r| r.2 == TOMBSTONE_TYPE)
        .map(|r| r.0)
        .collect()
}

// ---------------------------------------------------------------------------
// The seed's reproduction, with the real binary and an Eventuous-rules
// subscriber.

/// The seed's hole: an event with message id X on stream A, handled by the
/// subscriber; the same message id again, not stored, after it drew a
/// position (PostgreSQL's ON CONFLICT DO NOTHING, SQL Server's 2627 on
/// UQ_StreamIdAndMessageId): that position, a hole once an event lands
/// above it.
async fn seed_hole<S: Server>(s: &S, sub: &mut Subscriber<S::Pages>) -> i64 {
    let x = Uuid::new_v4();
    let first = s.append_with_id("A", x).await;
    assert_eq!(first.len(), 1, "the first append of X is stored");
    assert!(sub
        .poll_until(Duration::from_secs(5), |s| s.handled_stream("A"))
        .await
        .is_some());
    assert_eq!(sub.handled[0].position, first[0]);
    let ident_before = s.identity().await;
    assert!(s.append_with_id("A", x).await.is_empty());
    let burned = s.identity().await;
    assert_eq!(
        burned,
        ident_before + 1,
        "the failed append used one identity value"
    );
    assert_eq!(burned, first[0] + 1);
    burned
}

/// Without the healer, the subscriber stands at the seed's hole for good.
pub(super) async fn seed_reproduction_stuck_without_healer<S: Server>() {
    let s = S::empty().await;
    let gap_timeout = Duration::from_millis(600);
    let mut sub = Subscriber::new(s.pages().await, S::FIRST_POSITION);
    let hole = seed_hole(&s, &mut sub).await;
    let b = s.append("B", 1).await[0];
    assert_eq!(b, hole + 1);
    let handled = sub
        .poll_until(gap_timeout * 5, |s| s.handled_stream("B"))
        .await;
    assert!(
        handled.is_none(),
        "without the healer the subscriber must still be stuck after 5 x gap_timeout"
    );
    assert_eq!(missing::<S>(&s.rows().await), vec![hole]);
}

/// With `gap-healer run` (gap_timeout 1 s, poll 250 ms), the subscriber
/// handles stream B within gap_timeout + poll + 1 s of B's commit, and no
/// sooner than gap_timeout, past exactly one tombstone, the hole's.
pub(super) async fn seed_reproduction_handled_within_gap_timeout_with_healer<S: Server>() {
    let s = S::empty().await;
    let gap_timeout = Duration::from_secs(1);
    let poll = Duration::from_millis(250);
    let mut argv = vec!["run".to_string()];
    argv.extend(s.store_args());
    argv.extend(["--log-format".into(), "json".into()]);
    argv.extend(timing("1s", "250ms", &[]).iter().map(|f| f.to_string()));
    let mut daemon = Daemon::spawn(&argv, &[]);
    let mut sub = Subscriber::new(s.pages().await, S::FIRST_POSITION);
    let hole = seed_hole(&s, &mut sub).await;

    // Let the daemon connect, lead and take its first look (its start is
    // not what this test measures; on a loaded Babelfish it took 11 s).
    let started = Instant::now();
    while (daemon.lines_with("scan starts").is_empty()
        || daemon.lines_with("became the leader").is_empty())
        && started.elapsed() < Duration::from_secs(60)
        && daemon.alive()
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        daemon.alive(),
        "gap-healer run exited early\n{}",
        daemon.log()
    );

    // An event on stream B, after the hole.
    let b = s.append("B", 1).await[0];
    let appended = Instant::now();
    assert_eq!(b, hole + 1);

    let bound = gap_timeout + poll + Duration::from_secs(1);
    // On Babelfish the one-position fill statement alone took 0.75-1.2 s
    // (a T-SQL batch's first run in a session was seen taking 2.2 s under
    // load), so the bound may not hold there: a miss is reported as skipped
    // on Babelfish, and B must still be handled within 10 s more.
    let allowed = bound + Duration::from_secs(10);
    let handled = sub
        .poll_until(allowed, |s| s.handled_stream("B"))
        .await
        .unwrap_or_else(|| {
            panic!(
                "stream B's event was not handled within {allowed:?} of its commit; handled {:?}\n{}",
                sub.handled,
                daemon.log()
            )
        });
    let took = handled - appended;
    let fill_ms = daemon
        .lines_with("filled hole with tombstones")
        .first()
        .and_then(|l| l["ms"].as_u64())
        .map_or_else(|| "?".to_string(), |ms| ms.to_string());
    println!(
        "seed reproduction: stream B handled {took:?} after its append (gap_timeout {gap_timeout:?}, poll {poll:?}); beyond gap_timeout: {:?}; bound {bound:?}; the fill statement took {fill_ms} ms",
        took.saturating_sub(gap_timeout)
    );
    if took > bound {
        let reason = format!(
            "the {bound:?} bound: B was handled {took:?} after its commit, of which Babelfish spent {fill_ms} ms on the one-position fill statement"
        );
        assert!(
            s.skipped(
                "seed_reproduction_handled_within_gap_timeout_with_healer",
                &reason
            )
            .await,
            "took {took:?}: {reason}\n{}",
            daemon.log()
        );
    }
    assert!(took >= gap_timeout, "filled before gap_timeout: {took:?}");
    assert_eq!(
        sub.ignored.len(),
        1,
        "the subscriber ignored exactly one tombstone"
    );
    assert_eq!(sub.ignored, vec![hole], "the hole was handed over");
    assert_eq!(tombstones(&s.rows().await), vec![hole]);
    assert_eq!(
        daemon.metric("gap_healer_tombstones_inserted_total").await,
        Some(1.0)
    );
    drop(daemon);
    assert_eq!(s.identity().await, b, "the identity moved");
    s.assert_tombstone_stream_consistent().await;
}

// ---------------------------------------------------------------------------
// A 10,000-wide identity jump (the identity cache after a failover).

/// A jump made by [`wide_jump`]: the hole `lo..=hi`, the head, and the
/// identity's value once it was made.
struct WideJump {
    lo: i64,
    hi: i64,
    head: i64,
    identity: i64,
}

/// Five events on stream A in a fresh store, a jump of 10,000, two events
/// on stream B: the engine sees one 10,000-wide range, however wide.
async fn wide_jump<S: Server>(s: &S) -> WideJump {
    let f = S::FIRST_POSITION;
    let before = s.append("A", 5).await;
    assert_eq!(
        before,
        (f..f + 5).collect::<Vec<_>>(),
        "a fresh store starts at {f}"
    );
    s.skip_positions(10_000).await;
    let after = s.append("B", 2).await;
    assert_eq!(after, vec![f + 10_005, f + 10_006]);
    assert_eq!(after[0] - before[4] - 1, 10_000);
    let identity = s.identity().await;

    // The engine sees one range, however wide.
    let engine = s.engine();
    let (lo, hi) = (f + 5, f + 10_004);
    let page = engine.scan(f - 1, 1000).await.unwrap();
    assert_eq!(page.holes, vec![PosRange::new(lo, hi).unwrap()]);
    assert_eq!((page.high, page.rows), (f + 10_006, 7));
    assert_eq!(engine.identity_floor().await.unwrap(), f);
    WideJump {
        lo,
        hi,
        head: f + 10_006,
        identity,
    }
}

/// Every position of the jump a tombstone, in order, every other row kept,
/// the identity unchanged, the tombstone stream 10,000 long.
async fn assert_jump_filled<S: Server>(s: &S, jump: &WideJump) {
    let rows = s.rows().await;
    assert_eq!(rows.len() as i64, jump.head - S::FIRST_POSITION + 1);
    assert!(
        rows.iter()
            .enumerate()
            .all(|(i, r)| r.0 == S::FIRST_POSITION + i as i64),
        "every position {}..={} present",
        S::FIRST_POSITION,
        jump.head
    );
    assert!(missing::<S>(&rows).is_empty());
    let tombstones = tombstones(&rows);
    assert_eq!(
        (tombstones.len(), tombstones[0], *tombstones.last().unwrap()),
        (10_000, jump.lo, jump.hi)
    );
    assert_eq!(s.identity().await, jump.identity, "the identity moved");
    assert_eq!(s.tombstone_version().await, Some(9_999));
    s.assert_tombstone_stream_consistent().await;
}

/// The in-process healer tracks the jump as one range and fills it in one
/// cycle, in as few statements as the engine's fill limits allow.
pub(super) async fn ten_thousand_wide_hole_filled_in_one_cycle<S: Server>() {
    let s = S::empty().await;
    let jump = wide_jump(&s).await;
    let mut h = healer(s.engine(), options::<S>());
    let step = h.scan_step().await.unwrap();
    assert_eq!(step.new_holes, 1, "one range, not 10,000 entries");
    assert_eq!(h.tracker().len(), 1);
    let started = Instant::now();
    let report = h.fill_due(&CancellationToken::new()).await;
    let took = started.elapsed();
    println!(
        "10,000-wide hole: filled in {took:?} with {} statement(s) ({:.0} tombstones/s)",
        report.statements,
        10_000.0 / took.as_secs_f64()
    );
    assert_eq!(report.tombstones, 10_000);
    assert_eq!(report.statements, S::STATEMENTS_FOR_10000);
    assert_eq!(
        S::STATEMENTS_FOR_10000,
        10_000u64.div_ceil(s.engine().fill_limits().rows)
    );
    assert!(h.tracker().is_empty());
    assert_jump_filled(&s, &jump).await;
}

/// The binary on the same jump: `scan` finds it (exit 1), `heal --once`
/// fills it (exit 0), `scan` then finds nothing (exit 0).
pub(super) async fn identity_jump_of_10000_filled_in_one_heal_cycle<S: Server>() {
    let s = S::empty().await;
    let jump = wide_jump(&s).await;
    let (code, out) = scan(&s).await;
    assert_eq!(code, 1, "scan exits 1 when it finds holes\n{out}");

    let started = Instant::now();
    let (code, out) = heal_everything_once(&s, Duration::from_secs(180)).await;
    assert_eq!(code, 0, "heal --once\n{out}");
    println!(
        "heal --once filled 10,000 positions in {:?}",
        started.elapsed()
    );
    assert_jump_filled(&s, &jump).await;

    let (code, out) = scan(&s).await;
    assert_eq!(code, 0, "scan exits 0 when there are no holes\n{out}");
}

/// A 10,000-wide hole (an identity jump) whose middle position an open
/// transaction holds by its key, inserted there itself (a second filler, an
/// import: a writer that draws nothing, so the transaction-end proof does
/// not wait for it and the fill's key wait decides). The healer fills
/// everything around the held position and nothing of it; the held insert
/// then commits intact.
pub(super) async fn ten_thousand_wide_hole_with_one_held_position<S: Server>() {
    let s = store_with_streams::<S>().await;
    if s.explicit_insert_is_read().await {
        return ten_thousand_wide_hole_waits_for_its_held_position(s).await;
    }
    let (first, last, held, open) = wide_hole_with_a_held_position(&s).await;
    let ident = s.identity().await;

    let mut h = healer(s.engine(), options::<S>());
    let report = fill_wide_hole_around_one_held(&mut h, first, last).await;
    assert_eq!(report.tombstones, 9_999);
    let rows = s.rows().await;
    let at: HashMap<i64, &str> = rows.iter().map(|r| (r.0, r.2.as_str())).collect();
    for p in first + 1..last {
        match at.get(&p) {
            Some(kind) if p != held => assert_eq!(*kind, TOMBSTONE_TYPE, "{p}"),
            None if p == held => {}
            other => panic!("position {p}: {other:?} (held {held})"),
        }
    }
    assert_eq!(missing::<S>(&rows), vec![held]);
    assert_eq!(
        h.tracker().ranges(),
        vec![single(held)],
        "the held position stays tracked"
    );
    S::commit(open).await;
    let m = row_at(&s, held).await;
    assert_eq!(
        as_strs(&m),
        Some(("slow", EVENT_TYPE)),
        "the held append commits intact"
    );
    h.scan_step().await.unwrap();
    assert!(h.tracker().is_empty(), "the re-check sees the commit");
    assert_eq!(s.identity().await, ident, "the identity moved");
    s.assert_tombstone_stream_consistent().await;
}

/// A 10,000-wide identity jump between two events (`first`, `last`), and
/// an insert of its middle position (`held`) left `open`.
async fn wide_hole_with_a_held_position<S: Server>(s: &S) -> (i64, i64, i64, S::Open) {
    let first = s.append("A", 1).await[0];
    s.skip_positions(10_000).await;
    let last = s.append("B", 1).await[0];
    assert_eq!(last - first - 1, 10_000);
    let held = first + 5_000;
    let open = s.begin_explicit("slow", held).await;
    (first, last, held, open)
}

/// The same case where an insert at a position takes the identity's lock
/// (Babelfish: its identity insert holds the sequence's lock): the
/// transaction-end proof waits for the held insert, so nothing of the
/// hole is filled while it is open, and all of it but the held position is
/// filled once it commits. Prints how long after the commit.
async fn ten_thousand_wide_hole_waits_for_its_held_position<S: Server>(s: S) {
    let (_, _, held, open) = wide_hole_with_a_held_position(&s).await;
    let mut h = healer(s.engine(), options::<S>());
    let never = CancellationToken::new();
    h.scan_step().await.unwrap();
    let report = h.fill_due(&never).await;
    assert_eq!(
        report.tombstones, 0,
        "filled while a transaction that may have drawn a position was open"
    );
    assert_eq!(missing::<S>(&s.rows().await).len(), 10_000);
    S::commit(open).await;
    let committed = Instant::now();
    let mut filled = 0;
    while !h.tracker().is_empty() {
        assert!(
            committed.elapsed() < Duration::from_secs(60),
            "not healed 60 s after the commit"
        );
        h.scan_step().await.unwrap();
        filled += h.fill_due(&never).await.tombstones;
    }
    let took = committed.elapsed();
    println!(
        "Babelfish: 10,000-wide hole with one held position (an insert there, which holds the identity's lock): \
         nothing filled while it was open; {filled} tombstones, healed {took:?} after it committed"
    );
    assert_eq!(filled, 9_999);
    let m = row_at(&s, held).await;
    assert_eq!(
        as_strs(&m),
        Some(("slow", EVENT_TYPE)),
        "the held insert stays"
    );
    assert!(missing::<S>(&s.rows().await).is_empty());
    s.assert_tombstone_stream_consistent().await;
}

// ---------------------------------------------------------------------------
// Scattered one-position holes.

/// [`Server::load_every_other`] of `n` rows above the head: the `n` holes
/// it leaves, checked against the rows.
async fn every_other<S: Server>(s: &S, n: i64) -> Vec<i64> {
    let head = s.rows().await.last().map_or(S::FIRST_POSITION - 1, |r| r.0);
    s.load_every_other(n).await;
    let holes: Vec<i64> = (0..n).map(|i| head + 1 + 2 * i).collect();
    assert_eq!(
        missing::<S>(&s.rows().await),
        holes,
        "{n} one-position holes"
    );
    holes
}

/// 5,000 one-position holes, all due, one of them held by an open insert at
/// that position (as in [`ten_thousand_wide_hole_with_one_held_position`]):
/// the healer fills the other 4,999 in shared transactions (not one
/// statement per hole) and leaves the held one; once its holder rolls back
/// it is filled too.
pub(super) async fn scattered_holes_share_transactions_and_one_held_among_them_is_left<
    S: Server,
>() {
    let s = store_with_streams::<S>().await;
    if !held_by_its_key(
        &s,
        "scattered_holes_share_transactions_and_one_held_among_them_is_left",
    )
    .await
    {
        return;
    }
    let holes = every_other(&s, 5_000).await;
    // An open transaction holds one of the holes, in the middle.
    let held = holes[2_500];
    let open = s.begin_explicit("slow", held).await;
    let ident = s.identity().await;
    let mut h = healer(s.engine(), options::<S>());
    h.scan_step().await.unwrap();
    assert_eq!(h.tracker().len(), 5_000);
    let started = Instant::now();
    let report = h.fill_due(&CancellationToken::new()).await;
    println!(
        "5,000 one-position holes, one held: {} tombstones in {:?}, {} statements, {} lock timeouts",
        report.tombstones,
        started.elapsed(),
        report.statements,
        report.held
    );
    assert_eq!(report.tombstones, 4_999);
    assert!(
        report.statements < 60,
        "batched, not one statement per hole: {}",
        report.statements
    );
    assert_eq!(missing::<S>(&s.rows().await), vec![held]);
    S::rollback(open).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = h.fill_due(&CancellationToken::new()).await;
    assert_eq!(report.tombstones, 1, "filled once the holder rolled back");
    let rows = s.rows().await;
    assert!(missing::<S>(&rows).is_empty());
    assert_eq!(tombstones(&rows), holes, "every hole a tombstone");
    assert_eq!(s.identity().await, ident, "the identity moved");
    assert_eq!(s.tombstone_version().await, Some(4_999));
    s.assert_tombstone_stream_consistent().await;
}

/// Issue 11 item 5: 200 scattered one-position holes share one fill
/// transaction (up to 1,000 ranges, within the lock budget), and a batch is
/// refused whole when one of its positions is committed or held.
pub(super) async fn scattered_holes_share_one_fill_transaction<S: Server>() {
    let s = store_with_streams::<S>().await;
    let made = every_other(&s, 200).await;
    let engine = s.engine();
    let holes = engine
        .scan(S::FIRST_POSITION - 1, 10_000)
        .await
        .unwrap()
        .holes;
    assert_eq!(holes.len(), 200, "{holes:?}");
    assert_eq!(holes, made.iter().map(|p| single(*p)).collect::<Vec<_>>());
    let ident = s.identity().await;
    let started = Instant::now();
    let outcome = engine
        .fill_ranges(&holes, Duration::from_secs(2), &Fence::Unfenced)
        .await
        .unwrap();
    println!(
        "200 scattered one-position holes filled in one transaction in {:?}",
        started.elapsed()
    );
    assert_eq!(outcome, FillOutcome::Filled { rows: 200 });
    let rows = s.rows().await;
    let at: HashMap<i64, &str> = rows.iter().map(|r| (r.0, r.2.as_str())).collect();
    for hole in &holes {
        assert_eq!(
            at.get(&hole.start()).copied(),
            Some(TOMBSTONE_TYPE),
            "{hole}"
        );
    }
    assert_eq!(s.identity().await, ident, "the identity moved");
    s.assert_tombstone_stream_consistent().await;

    // A committed position among them: the whole batch is refused.
    let a = rolled_back_append(&s, "A", 1).await[0];
    let committed = s.append("B", 1).await[0];
    let b = rolled_back_append(&s, "A", 1).await[0];
    s.append("B", 1).await;
    let batch = [single(a), single(committed), single(b)];
    assert_eq!(
        engine
            .fill_ranges(&batch, Duration::from_secs(2), &Fence::Unfenced)
            .await
            .unwrap(),
        FillOutcome::Committed
    );
    assert!(row_at(&s, a).await.is_none() && row_at(&s, b).await.is_none());
    // A held position among them: refused whole too, after the lock timeout.
    let open = s.begin_append("A", 1).await;
    let held = S::positions(&open)[0];
    s.append("B", 1).await;
    let outcome = engine
        .fill_ranges(
            &[single(a), single(b), single(held)],
            Duration::from_millis(500),
            &Fence::Unfenced,
        )
        .await
        .unwrap();
    assert_eq!(outcome, FillOutcome::Held);
    assert!(row_at(&s, a).await.is_none() && row_at(&s, b).await.is_none());
    S::rollback(open).await;
    assert_eq!(
        engine
            .fill_ranges(
                &[single(a), single(b), single(held)],
                Duration::from_secs(2),
                &Fence::Unfenced
            )
            .await
            .unwrap(),
        FillOutcome::Filled { rows: 3 }
    );
    s.assert_tombstone_stream_consistent().await;
}
