//! What a healer reports: its gauges, the checkpoints' lag, the contiguous position and the published watermark.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::*;

impl<E: Engine> Healer<E> {
    pub(super) fn db_error(&self, operation: Operation, e: &DbError) {
        self.observer.db_error(operation);
        self.health.record_error(&e.in_words(operation.label()));
    }

    /// Refreshes the checkpoint lag gauges, at most every few seconds.
    pub(super) async fn checkpoint_lag(&mut self) {
        let now = Instant::now();
        if self
            .last_checkpoints
            .is_some_and(|t| now.duration_since(t) < CHECKPOINT_REFRESH)
        {
            return;
        }
        self.last_checkpoints = Some(now);
        let Some(head) = self.examined() else { return };
        match self.engine.checkpoints().await {
            Ok(rows) => {
                let lags: Vec<(String, i64)> = rows
                    .into_iter()
                    .map(|c| (c.id, c.position.map_or(head, |p| head - p)))
                    .collect();
                self.observer.checkpoint_lags(&lags);
            }
            Err(e) => {
                self.db_error(Operation::Checkpoints, &e);
                debug!(error = %e, "cannot read checkpoints");
            }
        }
    }

    /// Publishes the tracker's figures.
    pub fn publish(&self) {
        let stats = self.tracker.stats();
        let now = Instant::now();
        let leader = self.leader.is_leader();
        let watermark = self.contiguous();
        self.observer.gauges(&Gauges {
            holes: stats.holes,
            positions: stats.positions,
            oldest_age: stats
                .oldest_first_seen
                .map_or(Duration::ZERO, |t| now.duration_since(t)),
            leader,
            head: watermark.and(self.examined()),
            contiguous: self.examined().and(watermark),
            blocking_age: self.blocking_age(now),
        });
        self.health.update(t::Status {
            leader,
            open_holes: stats.holes as u64,
            open_positions: stats.positions,
            head: self.examined(),
            watermark,
            last_error: None,
            watermark_error: None,
        });
    }

    /// Publishes the contiguous watermark when it has moved (with a
    /// watermark table configured and not in a dry run).
    pub async fn publish_watermark(&mut self) {
        if !self.opts.publish_watermark || self.watermark_unproven {
            return;
        }
        let Some(watermark) = self.contiguous() else {
            return;
        };
        if self.published.is_some_and(|p| p >= watermark) {
            return;
        }
        let Some(table) = self.engine.watermark_table() else {
            return;
        };
        match table
            .publish_watermark(self.health.store(), watermark)
            .await
        {
            Ok(()) => {
                debug!(watermark, "published the contiguous watermark");
                self.published = Some(watermark);
                self.health.watermark_published();
            }
            Err(e) => {
                self.db_error(Operation::Watermark, &e);
                self.health.watermark_failed(&e.in_words("publish"));
                warn!(error = %e, "cannot publish the contiguous watermark; retrying next turn");
            }
        }
    }

    /// The highest position at or below which every position from the
    /// scan's start on is a committed event or a tombstone: just below the
    /// lowest tracked hole, else the highest position examined. `None`
    /// before the first scan.
    pub fn contiguous(&self) -> Option<i64> {
        let head = self.examined()?;
        Some(self.tracker.lowest().map_or(head, |low| low - 1))
    }
}
