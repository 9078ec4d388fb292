//! The scan: pages of committed positions above `examined`, the tracked ranges re-checked in turns, and the daemon's poll that reads the shared head first.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::*;

impl<E: Engine> Healer<E> {
    /// Re-checks tracked holes (committed since?) and reads up to
    /// [`MAX_PAGES_PER_STEP`] pages of new rows; when it found new holes
    /// and this healer fills, the open transactions are read after it
    /// ([`crate::proof`]).
    pub async fn scan_step(&mut self) -> DbResult<ScanStep> {
        self.scan_step_due(Instant::now()).await
    }

    /// [`Healer::scan_step`] for a poll due at `due`: a reading of the open
    /// transactions that began since then serves it (the stores of a
    /// database share one).
    async fn scan_step_due(&mut self, due: Instant) -> DbResult<ScanStep> {
        let begun = match self.begun {
            Some(begun) => begun,
            None => self.start().await?,
        };
        let started = std::time::Instant::now();
        let mut step = ScanStep::default();
        if !self.tracker.is_empty() {
            step.rechecked = self.recheck_tracked().await?;
        }
        let examined = self.read_pages(begun, &mut step).await?;
        self.scanned(started);
        step.examined = examined;
        if step.new_holes > 0 && self.fills() {
            self.read_transactions(due).await;
        }
        Ok(step)
    }

    /// A bounded share of the tracked ranges each poll, in turns, probed:
    /// what committed since is forgotten. A million holes cost a few
    /// statements a poll, not a thousand. A healer that does not fill
    /// re-checks far less: its holes only feed its figures.
    async fn recheck_tracked(&mut self) -> DbResult<Rechecked> {
        let budget = if self.leader.is_leader() && !self.opts.dry_run {
            RECHECK_RANGES
        } else {
            RECHECK_RANGES_IDLE
        };
        let ranges = self.tracker.ranges_after(self.recheck_after, budget);
        self.recheck_after = match ranges.last() {
            Some(last) if ranges.len() < self.tracker.len() => last.start(),
            _ => i64::MIN,
        };
        let probe = self.engine.probe(&ranges).await?;
        self.tracker.remove_positions(&probe.committed);
        Ok(Rechecked { ranges, probe })
    }

    /// A begun healer's pages of new rows above `begun.examined`, at most
    /// [`MAX_PAGES_PER_STEP`], their holes tracked and the position examined
    /// kept after each page (a step cut short keeps what it read); the
    /// position examined after the step.
    async fn read_pages(&mut self, begun: Begun, step: &mut ScanStep) -> DbResult<i64> {
        let mut examined = begun.examined;
        for _ in 0..MAX_PAGES_PER_STEP {
            if self.tracker.len() >= MAX_TRACKED {
                // Bounded memory: nothing above `examined` is claimed, so the
                // holes beyond are found by the scans after some are filled.
                if !self.paused {
                    info!(
                        tracked = self.tracker.len(),
                        examined,
                        "tracking the most holes the healer keeps: the scan pauses here until some are filled"
                    );
                }
                self.paused = true;
                step.caught_up = true;
                break;
            }
            self.paused = false;
            let after = examined;
            let page = self.engine.scan(after, self.opts.scan_page_size).await?;
            let now = Instant::now();
            for hole in &page.holes {
                debug!(hole = %hole, width = hole.width(), "hole seen");
                self.tracker.observe(*hole, now, self.opts.gap_timeout);
            }
            step.rows += page.rows;
            step.new_holes += page.holes.len();
            examined = page.high.max(after);
            self.scanned_up_to(page.high);
            self.begun = Some(Begun { examined, ..begun });
            if page.rows < u64::from(self.opts.scan_page_size) {
                step.caught_up = true;
                break;
            }
        }
        Ok(examined)
    }

    /// A poll's scan (its own, or the shared head) that began at `started`
    /// has read the database.
    pub(super) fn scanned(&self, started: std::time::Instant) {
        self.observer.scanned(started.elapsed());
        self.health.scan_completed();
    }

    /// The daemon's poll, due at `due`: with no hole tracked, first the head
    /// read for every store of the database at once
    /// ([`SharedHeads::shared_head`]); the store scans itself only when that
    /// shows rows above `examined`, or is not to be had. With holes tracked
    /// it scans (the probe re-checks them).
    pub async fn poll(&mut self, due: Instant) -> DbResult<ScanStep> {
        if let (true, Some(examined)) = (self.tracker.is_empty(), self.examined()) {
            let started = std::time::Instant::now();
            // A failed shared reading is not this store's failure: its own
            // scan decides.
            if let Some(heads) = self.engine.shared_heads() {
                if heads.shared_head(due).await.shows_nothing_above(examined) {
                    self.scanned(started);
                    return Ok(ScanStep {
                        caught_up: true,
                        examined,
                        ..ScanStep::default()
                    });
                }
            }
        }
        self.scan_step_due(due).await
    }

    /// Scans until the head is reached, telling `progress` after each step.
    pub async fn scan_to_head(
        &mut self,
        stop: &CancellationToken,
        progress: &mut dyn Progress,
    ) -> DbResult<()> {
        loop {
            let step = self.scan_step().await?;
            progress.scanned(step.examined);
            if step.caught_up || stop.is_cancelled() {
                return Ok(());
            }
        }
    }
}
