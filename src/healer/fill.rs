//! The fill: a cycle planned by [`crate::cycle::plan`] from the due holes and a fresh probe, applied to the tracker in one step, then its statements run one by one, each refusal splitting or deferring what it refused.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::*;
use crate::gaps::Hole;

impl<E: Engine> Healer<E> {
    /// Tries every hole that is due, unless in dry-run mode or not the
    /// leader; each statement is logged at INFO ([`LogOnly`]).
    pub async fn fill_due(&mut self, stop: &CancellationToken) -> FillReport {
        self.fill_due_after(stop, None, Instant::now(), &mut LogOnly)
            .await
    }

    /// [`Healer::fill_due`], telling `progress` after every statement.
    pub async fn fill_due_with(
        &mut self,
        stop: &CancellationToken,
        progress: &mut dyn Progress,
    ) -> FillReport {
        self.fill_due_after(stop, None, Instant::now(), progress)
            .await
    }

    /// [`Healer::fill_due`] right after a scan step: due holes that step
    /// re-checked are not probed again, and a reading of the open
    /// transactions begun since `not_before` (the poll's due moment, or
    /// now) serves the transaction-end proof.
    pub(super) async fn fill_due_after(
        &mut self,
        stop: &CancellationToken,
        rechecked: Option<Rechecked>,
        not_before: Instant,
        progress: &mut dyn Progress,
    ) -> FillReport {
        let mut report = FillReport::default();
        let now = Instant::now();
        let due = self.tracker.due(now);
        if due.is_empty() {
            return report;
        }
        // Holes are tracked only once begun, all below `examined`.
        let Some(Begun { examined: head, .. }) = self.begun else {
            return report;
        };
        if self.opts.dry_run {
            self.would_fill(due, now);
            return report;
        }
        if !self.leader.is_leader() {
            return report;
        }
        let due = self.proven_due(due, not_before, &mut report).await;
        if due.is_empty() {
            return report;
        }
        let Some(probe) = self.fresh_probe(&due, rechecked, &mut report).await else {
            return report;
        };
        self.fill_cycle(&due, &probe, head, now, stop, progress)
            .await
    }

    /// Dry run: the due holes logged as what would be filled, and tried
    /// again a `gap_timeout` (at least a minute) later.
    fn would_fill(&mut self, due: Vec<Hole>, now: Instant) {
        for hole in due {
            info!(range = %hole.range, width = hole.range.width(), age_ms = now.duration_since(hole.first_seen).as_millis() as u64, "dry run: would fill");
            self.tracker.defer(
                hole.range,
                now + self.opts.gap_timeout.max(Duration::from_secs(60)),
            );
        }
    }

    /// A fresh look at the due ranges: what committed since, and (SQL
    /// Server) which positions an open append holds right now; the ranges
    /// this turn's scan step just re-checked are fresh already. `None` when
    /// the probe failed (counted in `report`, the due ranges backed off).
    async fn fresh_probe(
        &mut self,
        due: &[Hole],
        rechecked: Option<Rechecked>,
        report: &mut FillReport,
    ) -> Option<Probe> {
        let ranges: Vec<PosRange> = due.iter().map(|h| h.range).collect();
        let rechecked = rechecked.unwrap_or_default();
        let unchecked: Vec<PosRange> = ranges
            .iter()
            .copied()
            .filter(|r| !rechecked.covers(*r))
            .collect();
        let mut probe = rechecked.probe;
        if !unchecked.is_empty() {
            match self.engine.probe(&unchecked).await {
                Ok(p) => {
                    probe.committed.extend(p.committed);
                    probe.in_flight.extend(p.in_flight);
                }
                Err(e) => {
                    self.db_error(Operation::Probe, &e);
                    self.defer_after_error(&ranges);
                    report.errors += 1;
                    return None;
                }
            }
        }
        Some(probe)
    }

    /// A begun healer's fill cycle below `head` (the position examined):
    /// planned from the `due` holes and the fresh `probe`, applied to the
    /// tracker, then its statements run while this healer leads and is not
    /// told to stop.
    async fn fill_cycle(
        &mut self,
        due: &[Hole],
        probe: &Probe,
        head: i64,
        now: Instant,
        stop: &CancellationToken,
        progress: &mut dyn Progress,
    ) -> FillReport {
        let mut report = FillReport::default();
        let limits = cycle::Limits {
            fill: self.engine.fill_limits(),
            gap_timeout: self.opts.gap_timeout,
        };
        let cycle = cycle::plan(due, &probe.committed, &probe.in_flight, head, now, limits);
        self.apply(&cycle, head);
        let planned: u64 = cycle.statements.iter().flatten().map(PosRange::width).sum();
        let mut queue = cycle.statements;
        queue.reverse();
        let started = Instant::now();
        let (mut said, mut published) = (started, started);
        while let Some(batch) = queue.pop() {
            if stop.is_cancelled() {
                break;
            }
            // Leadership as it stands now: the fill checks this very fence.
            let Some(fence) = self.leader.fence() else {
                break;
            };
            self.fill_batch(batch, &fence, &mut queue, &mut report)
                .await;
            progress.filled(&report);
            // A long cycle shows its progress: the gauges move, and the
            // log says how far it is (a one-shot command shows its own).
            let now = Instant::now();
            if now.duration_since(published) >= PUBLISH_EVERY {
                self.publish();
                published = now;
            }
            if !progress.shown() && now.duration_since(said) >= PROGRESS_EVERY {
                log_progress(&report, planned, now.duration_since(started));
                said = now;
            }
        }
        self.log_cycle(&report, planned, started.elapsed());
        report
    }

    /// The cycle's line: at INFO when it wrote tombstones; a cycle that
    /// wrote none (held, busy, committed) is counted and said at most once
    /// a [`QUIET_EVERY`], with how many there were.
    fn log_cycle(&mut self, report: &FillReport, planned: u64, took: Duration) {
        if report.statements == 0 {
            return;
        }
        let ms = took.as_millis() as u64;
        if report.tombstones > 0 {
            info!(
                filled = report.tombstones,
                planned,
                statements = report.statements,
                committed = report.committed,
                held = report.held,
                failed = report.errors,
                ms,
                "filled holes with tombstones"
            );
            return;
        }
        let now = Instant::now();
        match &mut self.quiet_cycles {
            Some((since, quiet)) if now.duration_since(*since) < QUIET_EVERY => {
                *quiet += 1;
                debug!(
                    planned,
                    statements = report.statements,
                    held = report.held,
                    "filled nothing this cycle"
                );
            }
            slot => {
                let cycles = slot.map_or(1, |(_, quiet)| quiet + 1);
                info!(
                    planned,
                    statements = report.statements,
                    committed = report.committed,
                    held = report.held,
                    failed = report.errors,
                    cycles,
                    "filled nothing: the due positions were held by open appends, committed or refused ({cycles} such cycle(s) since the last line)"
                );
                *slot = Some((now, 0));
            }
        }
    }

    /// Applies a planned cycle to the tracker in one step: committed
    /// positions and pieces at or above the head forgotten, trusted
    /// sightings deferred as held with one more sighting counted.
    pub(super) fn apply(&mut self, cycle: &cycle::Cycle, head: i64) {
        self.tracker.remove_positions(&cycle.committed);
        for seen in &cycle.held {
            debug!(
                position = seen.position,
                sightings = seen.sightings + 1,
                "an open append holds this position; not trying it"
            );
            self.defer_held(PosRange::single(seen.position));
            self.tracker.add_sighting(seen.position);
        }
        for seen in &cycle.advised {
            info!(
                position = seen.position,
                sightings = seen.sightings,
                age_ms = seen.age.as_millis() as u64,
                "a dirty read keeps showing an open append here; trying the position alone so its key decides"
            );
        }
        for piece in &cycle.refused {
            error!(range = %piece, head, "refusing to fill at or above the head");
            self.tracker.remove(*piece);
        }
    }

    /// One fill transaction, and what its outcome means for the tracker and
    /// the rest of the queue.
    pub(super) async fn fill_batch(
        &mut self,
        batch: plan::Batch,
        fence: &Fence,
        queue: &mut Vec<plan::Batch>,
        report: &mut FillReport,
    ) {
        let lock_timeout = plan::lock_timeout_for(&batch, self.opts.lock_timeout, queue.is_empty());
        let what = describe(&batch);
        let started = std::time::Instant::now();
        let outcome = self.engine.fill_ranges(&batch, lock_timeout, fence).await;
        report.statements += 1;
        let a = Answered {
            batch: &batch,
            what: &what,
            ms: started.elapsed().as_millis() as u64,
            queue,
            report,
        };
        match outcome {
            Ok(FillOutcome::Filled { rows }) => self.filled(a, rows),
            Ok(FillOutcome::Committed) => self.fill_around_committed(a).await,
            Ok(FillOutcome::Busy) => self.retry_when_not_busy(a),
            Ok(FillOutcome::TableLocked) => self.back_off_from_locked_table(a),
            Ok(FillOutcome::Held) => self.split_around_held(a),
            Err(e) => self.back_off_from_error(a, &e),
        }
    }

    /// Tombstones went in for the whole batch: its ranges are healed.
    fn filled(&mut self, a: Answered<'_>, rows: u64) {
        let Answered {
            batch, what, ms, ..
        } = a;
        self.health.forget_fill_refusal();
        debug!(range = %what, ranges = batch.len(), rows, ms, outcome = "filled", "filled hole with tombstones");
        self.observer.filled(Outcome::Filled, rows);
        a.report.tombstones += rows;
        for range in batch {
            self.tracker.remove(*range);
        }
    }

    /// Another healer holds the tombstone stream (or this one no longer
    /// leads): the batch and the rest of the cycle wait a poll.
    fn retry_when_not_busy(&mut self, a: Answered<'_>) {
        let Answered { what, ms, .. } = a;
        self.observer.filled(Outcome::Held, 0);
        a.report.held += 1;
        debug!(range = %what, ms, outcome = "busy", "another healer is filling, or this one no longer leads; retrying later");
        let at = Instant::now() + self.opts.poll_interval;
        // The same holds for the rest of this cycle's batches.
        for range in a
            .batch
            .iter()
            .chain(std::mem::take(a.queue).iter().flatten())
        {
            self.tracker.defer(*range, at);
        }
    }

    /// An open transaction holds a position of the batch past the lock
    /// timeout: the batch is halved, or a single held position deferred.
    fn split_around_held(&mut self, a: Answered<'_>) {
        let Answered { what, ms, .. } = a;
        self.observer.filled(Outcome::Held, 0);
        a.report.held += 1;
        debug!(range = %what, ms, outcome = "held", "a position is locked by an open transaction");
        self.requeue(plan::after_held(a.batch), a.queue);
    }

    /// The table itself is locked (DDL, an index build): no fill of the
    /// store can run, so the whole cycle backs off.
    fn back_off_from_locked_table(&mut self, a: Answered<'_>) {
        let Answered { what, ms, .. } = a;
        self.observer.filled(Outcome::TableLocked, 0);
        a.report.held += 1;
        warn!(
            range = %what,
            ms,
            outcome = "table_locked",
            "the table itself is locked (DDL, CREATE INDEX, LOCK TABLE): no fill of this store can run; backing off"
        );
        self.health.record_error(
            "fill: the table is locked by another session (DDL, CREATE INDEX, LOCK TABLE)",
        );
        // One backoff for the whole store: every range of the cycle.
        self.defer_cycle_after_error(a.batch, a.queue);
    }

    /// The fill failed: counted, reported (a permanent error as the store's
    /// fill refusal), and the whole cycle backs off.
    fn back_off_from_error(&mut self, a: Answered<'_>, e: &DbError) {
        let Answered { what, ms, .. } = a;
        self.observer.filled(Outcome::Error, 0);
        a.report.errors += 1;
        self.db_error(Operation::Fill, e);
        if e.kind == crate::engine::DbErrorKind::Permanent {
            self.health.fill_refused(&e.in_words("fill"));
        }
        warn!(range = %what, ms, outcome = "error", error = %e, "fill failed; retrying later");
        // Whatever broke (connection, rights) will break the rest too.
        self.defer_cycle_after_error(a.batch, a.queue);
    }

    /// A duplicate key: an append committed inside the batch. Probe it and
    /// fill around the committed rows.
    async fn fill_around_committed(&mut self, a: Answered<'_>) {
        let Answered {
            batch, what, ms, ..
        } = a;
        let limits = self.engine.fill_limits();
        self.observer.filled(Outcome::Committed, 0);
        a.report.committed += 1;
        let found = match self.engine.probe(batch).await {
            Ok(p) => p.committed,
            Err(e) => {
                self.db_error(Operation::Probe, &e);
                self.defer_after_error(batch);
                return;
            }
        };
        debug!(range = %what, ms, committed = found.len(), outcome = "committed", "an append committed inside the range; filling around it");
        self.tracker.remove_positions(&found);
        self.requeue(plan::after_committed(batch, &found, limits), a.queue);
    }

    pub(super) fn requeue(&mut self, after: AfterRefusal, queue: &mut Vec<plan::Batch>) {
        match after {
            AfterRefusal::Retry(mut batches) => {
                batches.reverse();
                queue.extend(batches);
            }
            AfterRefusal::Defer(p) => {
                debug!(
                    position = p.start(),
                    outcome = "held",
                    "an open append holds this position; retrying later"
                );
                self.defer_held(p);
            }
        }
    }

    pub(super) fn defer_held(&mut self, range: PosRange) {
        let retries = self.tracker.retries_at(range.start());
        let cap = self.opts.lock_timeout.max(Duration::from_secs(2));
        let delay = plan::retry_delay(retries, self.opts.poll_interval, cap);
        self.tracker.defer(range, Instant::now() + delay);
    }

    /// `batch` and the rest of the cycle's `queue`, each with its error backoff.
    pub(super) fn defer_cycle_after_error(
        &mut self,
        batch: &[PosRange],
        queue: &mut Vec<plan::Batch>,
    ) {
        self.defer_after_error(batch);
        for rest in std::mem::take(queue) {
            self.defer_after_error(&rest);
        }
    }

    pub(super) fn defer_after_error(&mut self, batch: &[PosRange]) {
        for range in batch {
            let retries = self.tracker.retries_at(range.start());
            let base = self.opts.poll_interval.max(Duration::from_millis(500));
            let delay = plan::retry_delay(retries, base, Duration::from_secs(30));
            self.tracker.defer(*range, Instant::now() + delay);
        }
    }
}

/// A fill statement that has answered, and the cycle it is part of: what
/// the handling of each outcome reads and changes.
struct Answered<'c> {
    batch: &'c [PosRange],
    /// The batch as the log names it.
    what: &'c str,
    /// How long the statement took.
    ms: u64,
    /// The cycle's batches still to run.
    queue: &'c mut Vec<plan::Batch>,
    report: &'c mut FillReport,
}

/// How often a long fill cycle publishes its gauges.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// How often a long fill cycle of the daemon says how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How often cycles that filled nothing are said (with their count).
const QUIET_EVERY: Duration = Duration::from_secs(60);

/// A long cycle's progress line: positions filled of those planned,
/// statements, and how long the rest should take at this rate.
fn log_progress(report: &FillReport, planned: u64, took: Duration) {
    let done = report.tombstones;
    let left = planned.saturating_sub(done);
    let eta_s = if done == 0 {
        None
    } else {
        Some((took.as_secs_f64() * left as f64 / done as f64).round() as u64)
    };
    info!(
        filled = done,
        planned,
        statements = report.statements,
        elapsed_s = took.as_secs(),
        eta_s = ?eta_s,
        "filling: {done} of {planned} positions so far"
    );
}
