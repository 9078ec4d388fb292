//! Where a healer begins: the seed, the first row, a start above the head.
use super::*;

/// The first proof of a published watermark starts at the identity's
/// seed, not at the first row: positions 1..4 below the first row may
/// be an append still open (PostgreSQL shows none of it), so the
/// watermark must stay below them until they are filled.
#[tokio::test(start_paused = true)]
async fn the_first_watermark_proof_starts_at_the_seed_not_the_first_row() {
    let o = Options {
        store: Default::default(),
        start_from: StartFrom::Checkpoints,
        publish_watermark: true,
        ..opts()
    };
    let (fake, mut h) = healer([5, 6, 8], o);
    h.begin().await.unwrap();
    h.scan_step().await.unwrap();
    h.publish_watermark().await;
    assert_eq!(fake.0.lock().unwrap().watermark, Some(0));
    // Once 1..4 and 7 are filled, the watermark reaches the head.
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(fake.0.lock().unwrap().watermark, Some(8));
    // Without a watermark, the same store starts at its first row.
    let o = Options {
        store: Default::default(),
        start_from: StartFrom::Checkpoints,
        lookback: 1_000,
        ..opts()
    };
    let (fake, mut h) = healer([5, 6, 8], o);
    h.begin().await.unwrap();
    h.scan_step().await.unwrap();
    assert_eq!(fake.0.lock().unwrap().scans.first(), Some(&4));
}

/// Review finding F5: IDENT_SEED does not show a reseed, so a store
/// reseeded before its first append, with no checkpoints (or one that
/// handled nothing yet), used to start `lookback` below the head (or at
/// the seed) and fill everything below its first row with tombstones.
#[tokio::test]
async fn a_reseeded_store_starts_at_its_first_row_unless_told_otherwise() {
    // The Fake's identity seed is 1; this store's first row is 1,000,000.
    let rows = [1_000_000, 1_000_001, 1_000_005];
    let start = |start_from: StartFrom, checkpoint: Option<Option<i64>>| async move {
        let mut o = opts();
        o.start_from = start_from;
        o.lookback = 1_000_000;
        let (fake, mut h) = healer(rows, o);
        fake.0.lock().unwrap().checkpoints = checkpoint
            .map(|position| Checkpoint {
                id: "orders".into(),
                position,
            })
            .into_iter()
            .collect();
        let after = h.begin().await.unwrap().after;
        h.scan_step().await.unwrap();
        (after, h.tracker().ranges())
    };
    let r = |a, b| PosRange::new(a, b).unwrap();
    // No checkpoints: not `lookback` below the head, but the first row.
    assert_eq!(
        start(StartFrom::Checkpoints, None).await,
        (999_999, vec![r(1_000_002, 1_000_004)])
    );
    // A subscription that has handled nothing yet: the same.
    assert_eq!(start(StartFrom::Checkpoints, Some(None)).await.0, 999_999);
    // A checkpoint above the first row is where the scan starts, as before.
    assert_eq!(
        start(StartFrom::Checkpoints, Some(Some(1_000_001))).await.0,
        1_000_001
    );
    // --start-from says otherwise: honoured below the first row.
    assert_eq!(
        start(StartFrom::Position(1), None).await,
        (0, vec![r(1, 999_999), r(1_000_002, 1_000_004)])
    );
    // Not reseeded (the first row is the seed): unchanged.
    assert_eq!(start_floor(1, Some(1)), 1);
    assert_eq!(start_floor(1, None), 1);
    assert_eq!(start_floor(1, Some(0)), 1);
    assert_eq!(start_floor(1, Some(7)), 7);
}

/// `run` refuses a start above the head of a table with events (it would
/// never examine the holes below), and starts anywhere on an empty one.
#[tokio::test(start_paused = true)]
async fn run_refuses_a_start_above_the_head_unless_the_table_is_empty() {
    let mut o = opts();
    o.start_from = StartFrom::Position(1_000);
    let (fake, h) = healer([1, 2, 4], o.clone());
    let ended = h.run(CancellationToken::new()).await;
    assert_eq!(
        ended,
        Ended::StartAboveHead {
            from: 1_000,
            head: 4
        }
    );
    assert!(fake.0.lock().unwrap().filled.is_empty());

    let (_, h) = healer([], o.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(h.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    assert_eq!(task.await.unwrap(), Ended::Stopped);

    // The head itself, or one above it, is not above the head.
    o.start_from = StartFrom::Position(5);
    let (_, mut h) = healer([1, 2, 4], o);
    let start = h.begin().await.unwrap();
    assert_eq!((start.after, start.head, start.empty), (4, 4, false));
    assert!(!start.above_head());
}
