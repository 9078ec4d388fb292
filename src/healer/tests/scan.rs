//! The polls: the shared grid, the shared head, re-checks of tracked ranges.
use super::*;

/// With a shared head reading, an idle store sends no scan of its own;
/// a row above what it examined brings its own scan back, and so do
/// tracked holes (their probe) until they are filled.
#[tokio::test(start_paused = true)]
async fn idle_polls_use_the_shared_head_until_something_moves() {
    let (fake, h) = healer(1..=10, opts());
    fake.0.lock().unwrap().shared = true;
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (scans, reads) = {
        let m = fake.0.lock().unwrap();
        (m.scans.clone(), m.shared_reads)
    };
    assert_eq!(
        scans,
        vec![0],
        "one scan at the start, then shared readings"
    );
    assert!(
        (10..=13).contains(&reads),
        "{reads} shared readings in 3 s at 250 ms"
    );
    // A row two above the head: the next poll scans and finds hole 11.
    // (The grid's phase is the real clock's at its first use, so the
    // test waits for that poll rather than for a fixed span, which held
    // a second poll whenever the phase fell in its last 50 ms.)
    fake.0.lock().unwrap().committed.insert(12);
    for _ in 0..30 {
        if fake.0.lock().unwrap().scans.len() > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.0.lock().unwrap().scans, vec![0, 10]);
    // Tracked until filled at gap_timeout (5 s): scans and probes meanwhile.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let scans_after_fill = {
        let m = fake.0.lock().unwrap();
        assert_eq!(m.filled.len(), 1);
        assert!(!m.probes.is_empty());
        m.scans.len()
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    task.await.unwrap();
    let m = fake.0.lock().unwrap();
    assert!(
        m.scans.len() <= scans_after_fill + 1,
        "idle again: {} scans after the fill, {scans_after_fill} before",
        m.scans.len()
    );
}

#[test]
fn polls_fall_on_one_grid_at_most_one_interval_apart() {
    let every = Duration::from_millis(250);
    let a = next_tick(every);
    std::thread::sleep(Duration::from_millis(30));
    let b = next_tick(every);
    let now = Instant::now();
    assert!(b > now && b <= now + every);
    let apart = b
        .duration_since(a)
        .as_nanos()
        .max(a.duration_since(b).as_nanos());
    assert_eq!(apart % every.as_nanos(), 0, "{apart} ns apart");
}

#[tokio::test(start_paused = true)]
async fn idle_polls_read_only_above_the_head() {
    let (fake, h) = healer(1..=1_000, opts());
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    task.await.unwrap();
    let scans = fake.0.lock().unwrap().scans.clone();
    // 10 pages to reach the head, then every poll starts at the head.
    assert!(scans.len() >= 10 + 10, "{}", scans.len());
    assert!(scans[10..].iter().all(|&after| after == 1_000), "{scans:?}");
}

#[test]
fn rechecked_covers_only_ranges_inside_a_probed_one() {
    let r = |a, b| PosRange::new(a, b).unwrap();
    let checked = Rechecked {
        ranges: vec![r(2, 5), r(9, 9), r(20, 30)],
        probe: Probe::default(),
    };
    for (range, covered) in [
        (r(2, 5), true),
        (r(3, 4), true),
        (r(9, 9), true),
        (r(25, 30), true),
        (r(1, 2), false),
        (r(5, 6), false),
        (r(8, 9), false),
        (r(10, 10), false),
        (r(31, 31), false),
    ] {
        assert_eq!(checked.covers(range), covered, "{range}");
    }
    assert!(!Rechecked::default().covers(r(1, 1)));
}
