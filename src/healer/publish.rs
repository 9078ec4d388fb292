//! What a healer publishes: the [`Publisher`] of its gauges and status,
//! the checkpoints' lag and the contiguous watermark.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Options, Pacing, Sink, StartFrom};
use crate::engine::{Engine, WatermarkTable};
use crate::gaps::Tracker;
use crate::telemetry::{Gauges, Operation, Status};

/// The highest position at or below which every position from the scan's
/// start on is a committed event or a tombstone: just below the lowest
/// tracked hole, else the highest position `examined`. `None` before the
/// first scan.
pub(super) fn contiguous(tracker: &Tracker, examined: Option<i64>) -> Option<i64> {
    let head = examined?;
    Some(tracker.lowest().map_or(head, |low| low - 1))
}

/// The publishing phase's own state.
#[derive(Debug, Default)]
pub struct Publisher {
    /// When the checkpoints were last read.
    last_checkpoints: Option<Instant>,
    /// The watermark last published (or read back at the start).
    published: Option<i64>,
    /// The scan began above the published watermark (an explicit
    /// `start_from`): the proof is broken, so nothing is published.
    watermark_unproven: bool,
}

impl Publisher {
    /// The tracker's figures, with the position `examined`, leadership and
    /// how long due holes have waited for an open transaction.
    pub fn publish(
        &self,
        tracker: &Tracker,
        examined: Option<i64>,
        leader: bool,
        blocking_age: Duration,
        sink: &Sink,
    ) {
        let stats = tracker.stats();
        let now = Instant::now();
        let watermark = contiguous(tracker, examined);
        sink.figures(
            &Gauges {
                holes: stats.holes,
                positions: stats.positions,
                oldest_age: stats
                    .oldest_first_seen
                    .map_or(Duration::ZERO, |t| now.duration_since(t)),
                leader,
                head: watermark.and(examined),
                contiguous: examined.and(watermark),
                blocking_age,
            },
            Status {
                leader,
                open_holes: stats.holes as u64,
                open_positions: stats.positions,
                head: examined,
                watermark,
                last_error: None,
                watermark_error: None,
            },
        );
    }

    /// Refreshes the checkpoint lag gauges against `head`, at most every
    /// [`Pacing::checkpoint_refresh`]. A follower reads none and shows none
    /// (its head is its last scan's: the leader's figures are the store's).
    pub async fn checkpoint_lag<E: Engine>(
        &mut self,
        engine: &E,
        head: Option<i64>,
        follows: bool,
        pacing: &Pacing,
        sink: &Sink,
    ) {
        if follows {
            if self.last_checkpoints.take().is_some() {
                sink.checkpoint_lags(&[]);
            }
            return;
        }
        let now = Instant::now();
        if self
            .last_checkpoints
            .is_some_and(|t| now.duration_since(t) < pacing.checkpoint_refresh)
        {
            return;
        }
        self.last_checkpoints = Some(now);
        let Some(head) = head else { return };
        match engine.checkpoints().await {
            Ok(rows) => {
                let lags: Vec<(String, i64)> = rows
                    .into_iter()
                    .map(|c| (c.id, c.position.map_or(head, |p| head - p)))
                    .collect();
                sink.checkpoint_lags(&lags);
            }
            Err(e) => {
                sink.db_error(Operation::Checkpoints, &e);
                debug!(error = %e, "cannot read checkpoints");
            }
        }
    }

    /// Publishes `watermark` when it has moved (with a watermark table
    /// configured, not in a dry run, and the proof unbroken).
    pub async fn publish_watermark<E: Engine>(
        &mut self,
        engine: &E,
        watermark: i64,
        opts: &Options,
        sink: &Sink,
    ) {
        if !opts.publish_watermark || self.watermark_unproven {
            return;
        }
        if self.published.is_some_and(|p| p >= watermark) {
            return;
        }
        let Some(table) = engine.watermark_table() else {
            return;
        };
        match table
            .publish_watermark(opts.store.as_str(), watermark)
            .await
        {
            Ok(()) => {
                debug!(watermark, "published the contiguous watermark");
                self.published = Some(watermark);
                sink.watermark_published();
            }
            Err(e) => {
                sink.watermark_failed("publish", &e);
                warn!(error = %e, "cannot publish the contiguous watermark; retrying next turn");
            }
        }
    }

    /// Every position up to the published watermark is proven filled (there
    /// is no hole there to find); the proof goes on from it, or from the
    /// identity's seed when none is published, whatever start_from says.
    /// Not from the first row: an append still open (or about to roll back)
    /// below it looks exactly like a reseed. A watermark that cannot be read
    /// (its table missing, no right) stops no healing: the proof then starts
    /// at the seed, which lies at or below anything published before, and
    /// the upsert only ever raises the row. The position the scan starts
    /// after, given it would start after `after`.
    pub async fn chain_to_watermark<E: Engine>(
        &mut self,
        engine: &E,
        after: i64,
        floor: i64,
        opts: &Options,
        sink: &Sink,
    ) -> i64 {
        let read = match engine.watermark_table() {
            Some(table) => table.read_watermark(opts.store.as_str()).await,
            None => Ok(None),
        };
        let proven = match read {
            Ok(proven) => proven,
            Err(e) => {
                sink.watermark_failed("read", &e);
                warn!(error = %e, seed = floor, "cannot read the published watermark: healing goes on, scanning from the identity's seed, and the watermark is published once its table answers");
                None
            }
        };
        self.published = proven;
        let chain = proven.unwrap_or(floor - 1).max(floor - 1);
        match opts.start_from {
            // A position given is the user's word, for the daemon and
            // the one-shot commands alike; from above the chain the
            // proof is broken, so this run publishes nothing.
            StartFrom::Position(_) if after > chain => {
                warn!(
                    from = after + 1,
                    watermark = chain,
                    "start_from lies above the published watermark: the positions between are not examined, so this run does not publish the watermark"
                );
                self.watermark_unproven = true;
                after
            }
            StartFrom::Position(_) => after,
            StartFrom::Checkpoints | StartFrom::Head => chain,
        }
    }
}
