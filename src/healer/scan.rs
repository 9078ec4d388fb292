//! The scan: the [`Scanner`] reads pages of committed positions above
//! `examined` and re-checks the tracked ranges in turns.

use tokio::time::Instant;
use tracing::{debug, info};

use super::{Begun, Options, MAX_TRACKED};
use crate::engine::{DbResult, Engine, Probe};
use crate::gaps::{PosRange, Tracker};

/// Pages read per scan step before the loop lets fills and metrics run.
const MAX_PAGES_PER_STEP: usize = 50;

/// Tracked ranges a leader re-checks per poll (16 probe statements on
/// PostgreSQL): the rest are re-checked in later polls, in turns, and the
/// due ones again right before they are filled.
const RECHECK_RANGES: usize = 16_000;
/// The same for a follower or a dry run, whose holes only feed its figures.
const RECHECK_RANGES_IDLE: usize = 1_000;

/// How many tracked ranges a poll re-checks: a healer that fills more, one
/// whose holes only feed its figures less.
pub(super) fn recheck_budget(fills: bool) -> usize {
    if fills {
        RECHECK_RANGES
    } else {
        RECHECK_RANGES_IDLE
    }
}

/// What one scan step read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanStep {
    pub rows: u64,
    pub new_holes: usize,
    /// The step reached the head, or stopped at [`MAX_TRACKED`]
    /// ([`super::Healer::scan_paused`]).
    pub caught_up: bool,
    /// The tracked holes it re-checked first, and what the probe found.
    pub rechecked: Rechecked,
    /// The highest committed position examined after the step.
    pub examined: i64,
    /// Each page's highest position, and when its answer came: every
    /// position up to it was handed out before then.
    pub pages: Vec<(Instant, i64)>,
}

/// Tracked ranges (ascending, disjoint) and one probe of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rechecked {
    pub ranges: Vec<PosRange>,
    pub probe: Probe,
}

impl Rechecked {
    /// Whether `range` lies inside one of the probed ranges.
    pub(super) fn covers(&self, range: PosRange) -> bool {
        let i = self.ranges.partition_point(|r| r.start() <= range.start());
        i > 0 && self.ranges[i - 1].end() >= range.end()
    }
}

/// The scan phase's own state.
#[derive(Debug)]
pub struct Scanner {
    /// Where the next poll's re-check of tracked ranges goes on from.
    recheck_after: i64,
    /// The last scan step stopped at [`MAX_TRACKED`].
    paused: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            recheck_after: i64::MIN,
            paused: false,
        }
    }
}

impl Scanner {
    /// The last scan step stopped at [`MAX_TRACKED`] holes, short of the head.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// One step: `recheck` of the tracked ranges probed (what committed
    /// since is forgotten), then up to [`MAX_PAGES_PER_STEP`] pages of new
    /// rows above `begun.examined`, their holes tracked and `begun`'s
    /// position examined kept after each page (a step cut short keeps what
    /// it read).
    pub async fn step<E: Engine>(
        &mut self,
        engine: &E,
        tracker: &mut Tracker,
        begun: &mut Begun,
        opts: &Options,
        recheck: usize,
    ) -> DbResult<ScanStep> {
        let mut step = ScanStep::default();
        if !tracker.is_empty() {
            step.rechecked = self.recheck(engine, tracker, recheck).await?;
        }
        self.read_pages(engine, tracker, begun, opts, &mut step)
            .await?;
        step.examined = begun.examined;
        Ok(step)
    }

    /// A bounded share of the tracked ranges each poll, in turns, probed:
    /// what committed since is forgotten. A million holes cost a few
    /// statements a poll, not a thousand.
    pub(super) async fn recheck<E: Engine>(
        &mut self,
        engine: &E,
        tracker: &mut Tracker,
        budget: usize,
    ) -> DbResult<Rechecked> {
        let ranges = tracker.ranges_after(self.recheck_after, budget);
        self.recheck_after = match ranges.last() {
            Some(last) if ranges.len() < tracker.len() => last.start(),
            _ => i64::MIN,
        };
        let probe = engine.probe(&ranges).await?;
        tracker.remove_positions(&probe.committed);
        Ok(Rechecked { ranges, probe })
    }

    async fn read_pages<E: Engine>(
        &mut self,
        engine: &E,
        tracker: &mut Tracker,
        begun: &mut Begun,
        opts: &Options,
        step: &mut ScanStep,
    ) -> DbResult<()> {
        for _ in 0..MAX_PAGES_PER_STEP {
            if tracker.len() >= MAX_TRACKED {
                // Bounded memory: nothing above `examined` is claimed, so the
                // holes beyond are found by the scans after some are filled.
                if !self.paused {
                    info!(
                        tracked = tracker.len(),
                        examined = begun.examined,
                        "tracking the most holes the healer keeps: the scan pauses here until some are filled"
                    );
                }
                self.paused = true;
                step.caught_up = true;
                break;
            }
            self.paused = false;
            let after = begun.examined;
            let page = engine.scan(after, opts.scan_page_size).await?;
            let now = Instant::now();
            for hole in &page.holes {
                debug!(hole = %hole, width = hole.width(), "hole seen");
                tracker.observe(*hole, now, opts.gap_timeout);
            }
            step.rows += page.rows;
            step.new_holes += page.holes.len();
            begun.examined = page.high.max(after);
            step.pages.push((now, page.high));
            if page.rows < u64::from(opts.scan_page_size) {
                step.caught_up = true;
                break;
            }
        }
        Ok(())
    }
}
