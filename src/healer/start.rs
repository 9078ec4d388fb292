//! Where a healer begins: `start_from` resolved to the first position examined, never below the identity's seed, and the published watermark read back.

use tracing::{info, warn};

use super::*;

impl<E: Engine> Healer<E> {
    /// Resolves `start_from` against the store. Idempotent.
    pub async fn begin(&mut self) -> DbResult<Start> {
        if self.examined.is_none() {
            self.engine.verify_shape().await?;
            if !self.opts.dry_run {
                self.engine.prepare_fills().await;
            }
        }
        let floor = self.engine.identity_floor().await?;
        let head = self.engine.head().await?;
        let first = self.engine.first_position().await?;
        // A store reseeded before its first append (DBCC CHECKIDENT ...
        // RESEED) starts above its identity's seed, which does not show the
        // reseed: nothing below its first row was ever handed out, so by
        // default the scan starts at that row, not up to `lookback` below it.
        let first_floor = start_floor(floor, first);
        let head_or_floor = head.unwrap_or(floor - 1);
        let after = match self.opts.start_from {
            StartFrom::Head => head_or_floor,
            StartFrom::Position(p) => p - 1,
            StartFrom::Checkpoints => {
                let checkpoints = self.engine.checkpoints().await?;
                let after = if checkpoints.is_empty() {
                    head_or_floor.saturating_sub(self.opts.lookback as i64)
                } else {
                    // A checkpoint is the last position handled: the next one may be a hole.
                    // A checkpoint without a position has handled nothing yet.
                    checkpoints
                        .iter()
                        .map(|c| c.position.unwrap_or(first_floor - 1))
                        .min()
                        .unwrap_or(head_or_floor)
                };
                after.max(first_floor - 1)
            }
        };
        let mut after = after.max(floor - 1);
        if self.opts.publish_watermark && self.examined.is_none() {
            // Every position up to the published watermark is proven filled
            // (there is no hole there to find); the proof goes on from it,
            // or from the identity's seed when none is published, whatever
            // start_from says. Not from the first row: an append still open
            // (or about to roll back) below it looks exactly like a reseed.
            // A watermark that cannot be read (its table missing, no
            // right) stops no healing: the proof then starts at the seed,
            // which lies at or below anything published before, and the
            // upsert only ever raises the row.
            let read = match self.engine.watermark_table() {
                Some(table) => table.read_watermark(self.health.store()).await,
                None => Ok(None),
            };
            let proven = match read {
                Ok(proven) => proven,
                Err(e) => {
                    self.db_error(Operation::Watermark, &e);
                    self.health.watermark_failed(&prefixed("read", &e));
                    warn!(error = %e, seed = floor, "cannot read the published watermark: healing goes on, scanning from the identity's seed, and the watermark is published once its table answers");
                    None
                }
            };
            self.published = proven;
            let chain = proven.unwrap_or(floor - 1).max(floor - 1);
            match self.opts.start_from {
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
                }
                StartFrom::Position(_) => {}
                StartFrom::Checkpoints | StartFrom::Head => after = chain,
            }
        }
        let start = Start {
            after: self.examined.unwrap_or(after),
            head: head_or_floor,
            empty: head.is_none(),
        };
        if self.examined.is_none() {
            self.examined = Some(after);
            self.start = Some(start);
            if first_floor > floor && after == first_floor - 1 {
                info!(
                    seed = floor,
                    first_row = first_floor,
                    "the first row lies above the identity's seed (a reseeded store): positions below it \
                     are not scanned; --start-from {floor} would fill them"
                );
            }
            info!(
                from = after + 1,
                head = head_or_floor,
                start_from = %self.opts.start_from,
                "scan starts"
            );
            if start.above_head() {
                warn!(
                    from = after + 1,
                    head = head_or_floor,
                    start_from = %self.opts.start_from,
                    "the scan starts above the head: positions {floor}..={after}, and every hole among them, are never examined (start_from = 0 or checkpoints examines them)"
                );
            }
        }
        Ok(start)
    }
}
