//! The fill: one cycle's [`Run`] (its queue of statements and its
//! [`FillReport`]), planned by [`crate::cycle::plan`] from the due holes and
//! a fresh probe, applied to the tracker in one step, then its statements
//! run one by one; each answer's reaction is decided by
//! [`crate::cycle::react`] and applied in one place ([`Run::apply`]). The
//! [`Filler`] keeps what outlives a cycle (how its quiet cycles were said).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{Options, Pacing, Sink};
use crate::cycle::{self, Answer, Reaction, Wait};
use crate::engine::{DbError, DbErrorKind, Engine, Fence, FillOutcome, Probe};
use crate::gaps::{Hole, PosRange, Tracker};
use crate::leader::Leader;
use crate::plan::{self, AfterRefusal, Batch};
use crate::telemetry::{Operation, Outcome};

use super::Rechecked;

/// What one fill step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillReport {
    pub statements: u64,
    pub tombstones: u64,
    pub committed: u64,
    /// Refusals that mean "try later": held positions, a busy tombstone
    /// stream, a locked table.
    pub held: u64,
    /// Due positions not tried because a transaction that may have drawn
    /// them is still open (the transaction-end proof, [`crate::proof`]).
    pub open_transaction: u64,
    pub errors: u64,
}

impl FillReport {
    /// Adds another step's figures to these.
    pub fn add(&mut self, other: &FillReport) {
        self.statements += other.statements;
        self.tombstones += other.tombstones;
        self.committed += other.committed;
        self.held += other.held;
        self.open_transaction += other.open_transaction;
        self.errors += other.errors;
    }

    /// Counts one statement's `answer`: the report follows from the
    /// answers, never bumped by hand.
    pub fn count(&mut self, answer: Answer) {
        self.statements += 1;
        match answer {
            Answer::Filled { rows } => self.tombstones += rows,
            Answer::Committed => self.committed += 1,
            Answer::Held | Answer::Busy | Answer::TableLocked => self.held += 1,
            Answer::Failed { .. } => self.errors += 1,
        }
    }
}

/// Who follows a healer's steps as they go: the daemon's log alone
/// ([`LogOnly`]), or a one-shot command that shows its own progress.
pub trait Progress: Send {
    /// Whether someone is shown the figures as they come: else a long fill
    /// cycle logs its progress every few seconds (each statement is logged
    /// at DEBUG, each cycle at INFO, either way).
    fn shown(&self) -> bool {
        true
    }

    /// A scan step has read every committed position up to `examined`.
    fn scanned(&mut self, examined: i64) {
        let _ = examined;
    }

    /// A fill statement has ended; `so_far` is the cycle's report up to it.
    fn filled(&mut self, so_far: &FillReport) {
        let _ = so_far;
    }
}

/// Nobody follows but the log: the daemon, and [`super::Healer::fill_due`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LogOnly;

impl Progress for LogOnly {
    fn shown(&self) -> bool {
        false
    }
}

/// A statement's answer as the planner and the metric name it.
fn answer(outcome: &Result<FillOutcome, DbError>) -> (Answer, Outcome) {
    match outcome {
        Ok(FillOutcome::Filled { rows }) => (Answer::Filled { rows: *rows }, Outcome::Filled),
        Ok(FillOutcome::Committed) => (Answer::Committed, Outcome::Committed),
        Ok(FillOutcome::Held) => (Answer::Held, Outcome::Held),
        Ok(FillOutcome::Busy) => (Answer::Busy, Outcome::Held),
        Ok(FillOutcome::TableLocked) => (Answer::TableLocked, Outcome::TableLocked),
        Err(e) => (
            Answer::Failed {
                permanent: e.kind == DbErrorKind::Permanent,
            },
            Outcome::Error,
        ),
    }
}

/// A batch for logs: `a..=b`, or `a..=b (+n more up to c)` for several ranges.
fn describe(batch: &[PosRange]) -> String {
    match batch {
        [] => String::new(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!(
            "{first} (+{} more up to {})",
            rest.len(),
            rest[rest.len() - 1].end()
        ),
    }
}

/// Dry run: the due holes logged as what would be filled, and said again a
/// [`Pacing::dry_run_again`] later.
pub(super) fn would_fill(
    tracker: &mut Tracker,
    due: Vec<Hole>,
    now: Instant,
    opts: &Options,
    pacing: &Pacing,
) {
    for hole in due {
        info!(range = %hole.range, width = hole.range.width(), age_ms = now.duration_since(hole.first_seen).as_millis() as u64, "dry run: would fill");
        tracker.defer(hole.range, now + pacing.dry_run_again(opts.gap_timeout));
    }
}

/// What outlives one fill cycle: how the cycles that wrote nothing were
/// said.
#[derive(Debug, Default)]
pub struct Filler {
    /// Cycles that wrote nothing since their last line: since when, and how
    /// many.
    quiet: Option<(Instant, u64)>,
}

impl Filler {
    /// The cycle's line: at INFO when it wrote tombstones; a cycle that
    /// wrote none (held, busy, committed) is counted and said at most once
    /// a [`Pacing::quiet_every`], with how many there were.
    pub fn log_cycle(&mut self, report: &FillReport, pacing: &Pacing) {
        if report.statements == 0 {
            return;
        }
        if report.tombstones > 0 {
            info!(
                filled = report.tombstones,
                statements = report.statements,
                committed = report.committed,
                held = report.held,
                failed = report.errors,
                "filled holes with tombstones"
            );
            return;
        }
        let now = Instant::now();
        match &mut self.quiet {
            Some((since, quiet)) if now.duration_since(*since) < pacing.quiet_every => {
                *quiet += 1;
                debug!(
                    statements = report.statements,
                    held = report.held,
                    "filled nothing this cycle"
                );
            }
            slot => {
                let cycles = slot.map_or(1, |(_, quiet)| quiet + 1);
                info!(
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
}

/// One fill cycle: what it borrows of the healer, and its report.
pub(super) struct Run<'h, E: Engine> {
    pub engine: &'h E,
    pub tracker: &'h mut Tracker,
    pub sink: &'h Sink,
    pub leader: &'h Leader,
    pub opts: &'h Options,
    pub pacing: &'h Pacing,
    /// Publishes the figures (a long cycle does as it goes).
    pub publish: &'h (dyn Fn(&Tracker) + Sync),
    pub report: FillReport,
}

impl<E: Engine> Run<'_, E> {
    /// A fresh look at the due ranges: what committed since, and (SQL
    /// Server) which positions an open append holds right now; the ranges
    /// this turn's scan step just re-checked are fresh already. `None` when
    /// the probe failed (counted, the due ranges backed off).
    pub async fn fresh_probe(
        &mut self,
        due: &[Hole],
        rechecked: Option<Rechecked>,
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
                    self.probe_failed(&e, &ranges);
                    return None;
                }
            }
        }
        Some(probe)
    }

    /// The cycle below `head` (the position examined): planned from the
    /// `due` holes and the fresh `probe`, applied to the tracker, then its
    /// statements run while this healer leads and is not told to stop.
    pub async fn cycle(
        mut self,
        due: &[Hole],
        probe: &Probe,
        head: i64,
        now: Instant,
        stop: &CancellationToken,
        progress: &mut dyn Progress,
    ) -> FillReport {
        let limits = cycle::Limits {
            fill: self.engine.fill_limits(),
            gap_timeout: self.opts.gap_timeout,
        };
        let cycle = cycle::plan(due, &probe.committed, &probe.in_flight, head, now, limits);
        self.planned(&cycle, head);
        let planned: u64 = cycle.statements.iter().flatten().map(PosRange::width).sum();
        let mut queue = cycle.statements;
        queue.reverse();
        let started = Instant::now();
        let (mut said, mut published) = (started, started);
        let mut refill: Option<Batch> = None;
        loop {
            if let Some(batch) = refill.take() {
                // An append committed inside `batch`: probe it (a statement
                // of its own), then fill around what committed.
                self.fill_around_committed(&batch, limits.fill, &mut queue)
                    .await;
                continue;
            }
            let Some(batch) = queue.pop() else { break };
            if stop.is_cancelled() {
                break;
            }
            // Leadership as it stands now: the fill checks this very fence.
            let Some(fence) = self.leader.fence() else {
                break;
            };
            if self.statement(batch.clone(), &fence, &mut queue).await {
                refill = Some(batch);
            }
            progress.filled(&self.report);
            // A long cycle shows its progress: the gauges move, and the
            // log says how far it is (a one-shot command shows its own).
            let now = Instant::now();
            if now.duration_since(published) >= self.pacing.publish_every {
                (self.publish)(self.tracker);
                published = now;
            }
            if !progress.shown() && now.duration_since(said) >= self.pacing.progress_every {
                log_progress(&self.report, planned, now.duration_since(started));
                said = now;
            }
        }
        self.report
    }

    /// Applies a planned cycle to the tracker in one step: committed
    /// positions and pieces at or above the head forgotten, trusted
    /// sightings deferred as held with one more sighting counted.
    fn planned(&mut self, cycle: &cycle::Cycle, head: i64) {
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

    /// One fill transaction, its answer applied; `true` when an append
    /// committed inside the batch and the cycle must probe it next.
    async fn statement(&mut self, batch: Batch, fence: &Fence, queue: &mut Vec<Batch>) -> bool {
        let lock_timeout = plan::lock_timeout_for(&batch, self.opts.lock_timeout, queue.is_empty());
        let started = std::time::Instant::now();
        let outcome = self.engine.fill_ranges(&batch, lock_timeout, fence).await;
        let ms = started.elapsed().as_millis() as u64;
        self.apply(&batch, &outcome, ms, queue)
    }

    /// The one place a statement's answer changes anything: the report
    /// (counted from the answer), the sink (figure and status), the log,
    /// and the tracker and queue as [`cycle::react`] decided. `true` when
    /// the cycle must probe the batch next.
    fn apply(
        &mut self,
        batch: &[PosRange],
        outcome: &Result<FillOutcome, DbError>,
        ms: u64,
        queue: &mut Vec<Batch>,
    ) -> bool {
        let (answer, label) = answer(outcome);
        self.report.count(answer);
        let rows = match answer {
            Answer::Filled { rows } => rows,
            _ => 0,
        };
        self.sink.filled(label, rows);
        let what = describe(batch);
        match (answer, outcome) {
            (Answer::Filled { .. }, _) => {
                self.sink.fills_work();
                debug!(range = %what, ranges = batch.len(), rows, ms, outcome = "filled", "filled hole with tombstones");
            }
            (Answer::Committed, _) => {
                debug!(range = %what, ms, outcome = "committed", "an append committed inside the range; filling around it");
            }
            (Answer::Held, _) => {
                debug!(range = %what, ms, outcome = "held", "a position is locked by an open transaction");
            }
            (Answer::Busy, _) => {
                debug!(range = %what, ms, outcome = "busy", "another healer is filling, or this one no longer leads; retrying later");
            }
            (Answer::TableLocked, _) => {
                self.sink.table_locked();
                warn!(
                    range = %what,
                    ms,
                    outcome = "table_locked",
                    "the table itself is locked (DDL, CREATE INDEX, LOCK TABLE): no fill of this store can run; backing off"
                );
            }
            (Answer::Failed { permanent }, Err(e)) => {
                self.sink.db_error(Operation::Fill, e);
                if permanent {
                    self.sink.fill_refused(e);
                }
                warn!(range = %what, ms, outcome = "error", error = %e, "fill failed; retrying later");
            }
            (Answer::Failed { .. }, Ok(_)) => {}
        }
        match cycle::react(answer, batch) {
            Reaction::Forget => {
                for range in batch {
                    self.tracker.remove(*range);
                }
                false
            }
            Reaction::ProbeThenRefill => true,
            Reaction::Then(after) => {
                self.requeue(after, queue);
                false
            }
            Reaction::DeferCycle(wait) => {
                let rest: Vec<PosRange> = batch
                    .iter()
                    .copied()
                    .chain(std::mem::take(queue).into_iter().flatten())
                    .collect();
                let now = Instant::now();
                match wait {
                    Wait::Poll => {
                        let poll = self.opts.poll_interval;
                        self.tracker.back_off(&rest, now, |_| poll);
                    }
                    Wait::ErrorBackoff => self.back_off(&rest),
                }
                false
            }
        }
    }

    /// An append committed inside `batch`: what committed there is probed
    /// and forgotten, and the rest filled around it. A probe that fails is
    /// counted as an error, like any other, and backs the batch off.
    async fn fill_around_committed(
        &mut self,
        batch: &[PosRange],
        limits: crate::gaps::FillLimits,
        queue: &mut Vec<Batch>,
    ) {
        match self.engine.probe(batch).await {
            Ok(p) => {
                self.tracker.remove_positions(&p.committed);
                self.requeue(plan::after_committed(batch, &p.committed, limits), queue);
            }
            Err(e) => self.probe_failed(&e, batch),
        }
    }

    /// A probe failed: counted, reported, and its ranges backed off.
    fn probe_failed(&mut self, e: &DbError, ranges: &[PosRange]) {
        self.sink.db_error(Operation::Probe, e);
        self.report.errors += 1;
        self.back_off(ranges);
    }

    fn requeue(&mut self, after: AfterRefusal, queue: &mut Vec<Batch>) {
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

    fn defer_held(&mut self, range: PosRange) {
        let (poll, lock_timeout) = (self.opts.poll_interval, self.opts.lock_timeout);
        let pacing = self.pacing;
        self.tracker.back_off(&[range], Instant::now(), |retries| {
            pacing.held_retry(retries, poll, lock_timeout)
        });
    }

    /// `ranges`, each with its error backoff.
    fn back_off(&mut self, ranges: &[PosRange]) {
        let poll = self.opts.poll_interval;
        let pacing = self.pacing;
        self.tracker.back_off(ranges, Instant::now(), |retries| {
            pacing.error_retry(retries, poll)
        });
    }
}

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
