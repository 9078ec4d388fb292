//! When and what the loop fills: the gap timeout, held positions, dirty reads, followers and dry runs, errors.
use super::*;

/// Issue 20: `/status` read "probe: probe: 57014: ...": the healer named
/// the operation, and PostgreSQL's error had named it already. Whether an
/// error names its operation is a field of it (`DbError::during`), never
/// read from its text.
#[tokio::test(start_paused = true)]
async fn an_error_names_its_operation_once() {
    for (engine_said, during, shown) in [
        (
            "probe: 57014: canceling statement due to statement timeout",
            Some("probe"),
            "probe: 57014: canceling statement due to statement timeout",
        ),
        (
            "SQL Server error 1205: deadlock victim",
            None,
            "probe: SQL Server error 1205: deadlock victim",
        ),
        (
            "cannot connect to PostgreSQL at probe.db:5432: Connection refused",
            None,
            "probe: cannot connect to PostgreSQL at probe.db:5432: Connection refused",
        ),
    ] {
        let (fake, mut h) = healer([1, 3], opts());
        h.begin().await.unwrap();
        h.scan_step().await.unwrap();
        let said = DbError::transient(engine_said);
        fake.0.lock().unwrap().probe_error = Some(match during {
            Some(d) => said.during(d),
            None => said,
        });
        tokio::time::advance(Duration::from_secs(6)).await;
        // The due hole is probed again before its fill, and that fails.
        let report = h.fill_due(&CancellationToken::new()).await;
        assert_eq!(report.errors, 1);
        assert_eq!(h.sink.health().status().last_error.as_deref(), Some(shown));
    }
    let e = |m: &str, during: &str| DbError::permanent(m).during(during);
    assert_eq!(
        e("fill 2..=3: 42501: denied", "fill 2..=3").in_words("fill"),
        "fill 2..=3: 42501: denied"
    );
    assert_eq!(
        e("read the watermark: 42P01: no table", "read the watermark").in_words("read"),
        "read the watermark: 42P01: no table"
    );
    assert_eq!(
        e(
            "publish the watermark: 42501: denied",
            "publish the watermark"
        )
        .in_words("watermark"),
        "publish the watermark: 42501: denied"
    );
    assert_eq!(
        DbError::permanent("SQL Server error 229: denied").in_words("fill"),
        "fill: SQL Server error 229: denied"
    );
}

#[tokio::test(start_paused = true)]
async fn fills_exactly_at_gap_timeout_not_before() {
    let (fake, h) = healer([1, 2, 4, 5], opts());
    let start = Instant::now();
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(4_990)).await;
    assert!(
        fake.0.lock().unwrap().filled.is_empty(),
        "filled before gap_timeout"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let filled = fake.0.lock().unwrap().filled.clone();
    assert_eq!(filled.len(), 1);
    assert_eq!(filled[0].0, PosRange::single(3));
    // Scheduled on the due time itself, not on the next poll tick.
    assert_eq!(filled[0].1.duration_since(start), Duration::from_secs(5));
    stop.cancel();
    task.await.unwrap();
}

/// The due time falls on a poll: the fill uses that turn's re-check of
/// the hole instead of probing it a second time.
#[tokio::test(start_paused = true)]
async fn a_due_hole_is_probed_once_in_a_turn_that_also_polls() {
    let (fake, h) = healer([1, 3], opts());
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(5_010)).await;
    stop.cancel();
    task.await.unwrap();
    let m = fake.0.lock().unwrap();
    assert_eq!(m.filled.len(), 1);
    let at = m.filled[0].1;
    let that_turn: Vec<_> = m.probes.iter().filter(|(t, _)| *t == at).collect();
    assert_eq!(that_turn.len(), 1, "{:?}", m.probes);
    // Before it came due, every poll re-checked it.
    assert!(m.probes.len() >= 19, "{}", m.probes.len());
}

#[tokio::test(start_paused = true)]
async fn held_position_is_left_and_retried_until_released() {
    let (fake, h) = healer([1, 10_002], opts());
    fake.0.lock().unwrap().held.insert(5_000);
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    {
        let m = fake.0.lock().unwrap();
        let filled: u64 = m.filled.iter().map(|(r, _)| r.width()).sum();
        assert_eq!(filled, 9_999);
        assert!(!m.committed.contains(&5_000));
    }
    fake.0.lock().unwrap().held.clear();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        fake.0.lock().unwrap().committed.contains(&5_000),
        "released position filled on a later cycle"
    );
    stop.cancel();
    task.await.unwrap();
}

/// Review finding F3: a position that a dirty read keeps showing in
/// flight while its key is free (an aborted transaction's row before
/// accelerated database recovery cleans it up) used to be left out of
/// every fill for ever. Now, after NOLOCK_SIGHTINGS sightings, it is
/// tried alone with the full lock_timeout and the key decides.
#[tokio::test(start_paused = true)]
async fn a_dirty_read_only_advises_and_the_key_decides() {
    let (fake, h) = healer([1, 10], opts());
    fake.0.lock().unwrap().dirty.insert(5);
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    {
        let m = fake.0.lock().unwrap();
        assert!(!m.committed.contains(&5), "the first sighting is trusted");
        assert!(m.committed.contains(&4) && m.committed.contains(&6));
        assert!(m
            .attempts
            .iter()
            .all(|(r, _)| !r.iter().any(|r| r.contains(5))));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let m = fake.0.lock().unwrap();
        assert!(m.committed.contains(&5), "the key was free: filled");
        let tries: Vec<_> = m
            .attempts
            .iter()
            .filter(|(r, _)| r.iter().any(|r| r.contains(5)))
            .collect();
        assert_eq!(
            tries,
            vec![&(vec![PosRange::single(5)], Duration::from_secs(2))],
            "alone, with the full lock_timeout"
        );
    }
    stop.cancel();
    task.await.unwrap();
}

/// The same for an append that really is open: tried alone, held, the
/// rest filled, and filled once it rolls back.
#[tokio::test(start_paused = true)]
async fn an_open_append_seen_by_nolock_stays_held_until_it_ends() {
    let (fake, h) = healer([1, 10], opts());
    {
        let mut m = fake.0.lock().unwrap();
        m.dirty.insert(5);
        m.held.insert(5);
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(12)).await;
    {
        let m = fake.0.lock().unwrap();
        assert!(!m.committed.contains(&5));
        let tries = m
            .attempts
            .iter()
            .filter(|(r, _)| r == &vec![PosRange::single(5)])
            .count();
        assert!(tries >= 2, "tried with the key again and again: {tries}");
        let filled: u64 = m.filled.iter().map(|(r, _)| r.width()).sum();
        assert_eq!(filled, 7);
    }
    {
        let mut m = fake.0.lock().unwrap();
        m.dirty.clear();
        m.held.clear();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fake.0.lock().unwrap().committed.contains(&5));
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dry_run_and_followers_never_fill() {
    let mut o = opts();
    o.dry_run = true;
    let (fake, h) = healer([1, 3], o);
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(fake.0.lock().unwrap().filled.is_empty());
    stop.cancel();
    task.await.unwrap();

    let fake = Arc::new(Fake(Mutex::new(Model {
        committed: [1, 3].into(),
        ..Default::default()
    })));
    let (tx, follower) = Leader::channel();
    let h = Healer::new(
        fake.clone(),
        opts(),
        follower,
        Health::new(Duration::from_millis(250), Duration::from_secs(2)),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(fake.0.lock().unwrap().filled.is_empty());
    let fence = Fence::Leader(crate::engine::FenceToken {
        session_id: 70_000,
        lock: "gap-healer:test".into(),
    });
    tx.set(Some(fence.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        fake.0.lock().unwrap().filled.len(),
        1,
        "a new leader fills what is due at once"
    );
    assert_eq!(
        fake.0.lock().unwrap().fences,
        vec![fence],
        "the fill is fenced by the published leadership"
    );
    stop.cancel();
    task.await.unwrap();
}

/// The transaction-end proof in the loop: a hole read while a transaction
/// that may have drawn it is open waits past `gap_timeout` for as long as
/// that transaction stays open, whatever appends come and go meanwhile; it
/// is filled at the first poll after it ended, never by a timeout.
#[tokio::test(start_paused = true)]
async fn a_due_hole_waits_for_the_transaction_open_when_it_was_read() {
    let (fake, h) = healer([1, 3], opts());
    fake.0.lock().unwrap().open = vec!["7/1".into()];
    let health = h.sink.health().clone();
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    // Long past gap_timeout (5 s): new appends open and close meanwhile.
    for i in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fake.0.lock().unwrap().open = vec!["7/1".into(), format!("8/{i}")];
    }
    assert!(
        fake.0.lock().unwrap().filled.is_empty(),
        "filled while 7/1 was open"
    );
    assert!(fake.0.lock().unwrap().attempts.is_empty());
    let readings = fake.0.lock().unwrap().readings;
    // Due at 5 s, then one reading a poll (250 ms) for 15 s: 60, plus the
    // one after the scan that found the hole and the one when it came due.
    assert!(
        (55..=63).contains(&readings),
        "a reading a poll while the hole waits, not more: {readings}"
    );
    // 7/1 ends; only newer transactions remain open: 2 is proven.
    fake.0.lock().unwrap().open = vec!["9/1".into()];
    let ended = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let filled = fake.0.lock().unwrap().filled.clone();
    assert_eq!(filled.len(), 1, "{filled:?}");
    assert_eq!(filled[0].0, PosRange::single(2));
    assert!(
        filled[0].1.duration_since(ended) <= Duration::from_millis(250),
        "filled at the first poll after it ended"
    );
    assert_eq!(health.status().open_holes, 0);
    stop.cancel();
    task.await.unwrap();
}

/// A hole whose reading shows no open transaction is proven by the
/// reading taken right after the scan that found it: filled exactly at
/// `gap_timeout`, with one reading, not one a poll.
#[tokio::test(start_paused = true)]
async fn a_hole_read_with_no_open_transaction_is_filled_at_gap_timeout() {
    let (fake, h) = healer([1, 3], opts());
    let start = Instant::now();
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(5_010)).await;
    let filled = fake.0.lock().unwrap().filled.clone();
    assert_eq!(filled.len(), 1);
    assert_eq!(filled[0].1.duration_since(start), Duration::from_secs(5));
    assert_eq!(fake.0.lock().unwrap().readings, 1);
    stop.cancel();
    task.await.unwrap();
}

/// A dry run and a follower read no open transactions (a reading takes
/// every lock partition of the server for a moment).
#[tokio::test(start_paused = true)]
async fn only_a_healer_that_fills_reads_open_transactions() {
    let mut o = opts();
    o.dry_run = true;
    let (fake, mut h) = healer([1, 3, 5], o);
    h.begin().await.unwrap();
    h.scan_step().await.unwrap();
    tokio::time::advance(Duration::from_secs(6)).await;
    h.fill_due(&CancellationToken::new()).await;
    assert_eq!(fake.0.lock().unwrap().readings, 0);
}
