//! Where a healer begins: `start_from` resolved to the first position
//! examined, never below the identity's seed, and the published watermark
//! read back, so the proof behind it goes on from where it stood. Resolved
//! once: a healer that has begun keeps its [`Begun`].

use tracing::{info, warn};

use super::{Healer, StartFrom};
use crate::engine::{DbResult, Engine};

/// Where the scan started and how far it has to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    /// The first position examined is `after + 1`.
    pub after: i64,
    /// The table's highest committed position when the scan started (the
    /// identity's seed minus one for an empty table).
    pub head: i64,
    /// The table had no rows.
    pub empty: bool,
}

impl Start {
    /// The scan starts above the head: every position at or below `after`,
    /// the existing holes included, is never examined.
    pub fn above_head(&self) -> bool {
        self.after > self.head
    }
}

/// A healer that has begun: what its start resolved, and the highest
/// committed position read since (never below `start.after`).
#[derive(Clone, Copy, Debug)]
pub struct Begun {
    pub start: Start,
    pub examined: i64,
}

/// What the store says about where a scan may start.
#[derive(Clone, Copy)]
struct Bounds {
    /// The identity's seed: the lowest position it can hand out.
    floor: i64,
    /// The lowest position a default start scans from ([`start_floor`]).
    first_floor: i64,
    /// The highest committed position, `None` for an empty table.
    head: Option<i64>,
}

impl Bounds {
    /// The head, or the seed minus one for an empty table.
    fn head_or_floor(&self) -> i64 {
        self.head.unwrap_or(self.floor - 1)
    }
}

/// The lowest position a default start (`start_from = checkpoints`) scans
/// from: the identity's seed, or the first row when that lies above it (the
/// store was reseeded before its first append, which the seed does not show).
pub(super) fn start_floor(seed: i64, first_row: Option<i64>) -> i64 {
    first_row.map_or(seed, |first| first.max(seed))
}

impl<E: Engine> Healer<E> {
    /// Resolves `start_from` against the store, the first time; once begun,
    /// the start keeps the position examined and shows the head as it is
    /// now (`start_from` is not resolved again).
    pub async fn begin(&mut self) -> DbResult<Start> {
        match self.begun {
            Some(begun) => {
                let bounds = self.bounds().await?;
                Ok(Start {
                    after: begun.examined,
                    head: bounds.head_or_floor(),
                    empty: bounds.head.is_none(),
                })
            }
            None => Ok(self.start().await?.start),
        }
    }

    /// The first [`Healer::begin`]: the store's shape verified, the start
    /// resolved (and, publishing a watermark, chained to it) and logged.
    pub(super) async fn start(&mut self) -> DbResult<Begun> {
        self.engine.verify_shape().await?;
        if !self.opts.dry_run {
            let waits = crate::plan::fill_lock_timeouts(self.opts.lock_timeout);
            self.engine.prepare_fills(&waits).await;
        }
        let bounds = self.bounds().await?;
        let mut after = self.start_from(bounds).await?;
        if self.opts.publish_watermark {
            after = self
                .publisher
                .chain_to_watermark(&*self.engine, after, bounds.floor, &self.opts, &self.sink)
                .await;
        }
        let start = Start {
            after,
            head: bounds.head_or_floor(),
            empty: bounds.head.is_none(),
        };
        let begun = Begun {
            start,
            examined: after,
        };
        self.begun = Some(begun);
        self.log_start(start, bounds);
        Ok(begun)
    }

    async fn bounds(&self) -> DbResult<Bounds> {
        let floor = self.engine.identity_floor().await?;
        let head = self.engine.head().await?;
        let first = self.engine.first_position().await?;
        // A store reseeded before its first append (DBCC CHECKIDENT ...
        // RESEED) starts above its identity's seed, which does not show the
        // reseed: nothing below its first row was ever handed out, so by
        // default the scan starts at that row, not up to `lookback` below it.
        Ok(Bounds {
            floor,
            first_floor: start_floor(floor, first),
            head,
        })
    }

    /// The position `start_from` names, less one (the scan reads above it),
    /// never below the seed.
    async fn start_from(&self, bounds: Bounds) -> DbResult<i64> {
        let Bounds {
            floor, first_floor, ..
        } = bounds;
        let head_or_floor = bounds.head_or_floor();
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
        Ok(after.max(floor - 1))
    }

    fn log_start(&self, start: Start, bounds: Bounds) {
        let Bounds {
            floor, first_floor, ..
        } = bounds;
        let (after, head_or_floor) = (start.after, start.head);
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
}
