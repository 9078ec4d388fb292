//! The healer: scan for new rows, track holes, fill the ones that are due.
//!
//! One [`Healer`] serves one store. Its steps are public so `heal --once`,
//! `scan` and the tests drive them one at a time; [`Healer::run`] is the
//! daemon loop that strings them together until shutdown.
//!
//! Architecture invariants:
//! - A scan only ever reads above `examined` (the highest committed position it
//!   has read), so an idle poll costs one index probe whatever the table size.
//! - A hole is tried no earlier than `gap_timeout` after it was first seen, and
//!   only below `examined`: the tail above the head is never a hole.
//! - Nothing is written in dry-run mode or while [`Leader::is_leader`] is false;
//!   leadership is checked before every fill statement.
//! - A refused fill is split, never retried whole, so every cycle makes progress.
//! - A daemon poll with no hole tracked may skip its own scan when the head
//!   read for every store of its database at once, after the poll was due,
//!   is no higher than `examined` (nothing new can lie below it). Polls fall
//!   on one grid per poll interval, shared by the daemon's stores.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::config::{StartFrom, Store};
use crate::cycle;
use crate::engine::{
    DbError, DbResult, Engine, Fence, FillOutcome, Probe, SharedHeads, WatermarkTable,
};
use crate::gaps::{PosRange, Tracker};
use crate::leader::Leader;
use crate::plan::{self, AfterRefusal};
use crate::telemetry::{self as t, Gauges, Health, Observer, Operation, Outcome};

/// Pages read per scan step before the loop lets fills and metrics run.
const MAX_PAGES_PER_STEP: usize = 50;
/// How long shutdown waits for a fill in flight before abandoning it (it then
/// rolls back with its connection).
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(1500);
/// A batch for logs: `a..=b`, or `a..=b (+n more)` for several ranges.
fn describe(batch: &[PosRange]) -> String {
    match batch {
        [] => String::new(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!(
            "{first} (+{} more up to {})",
            rest.len(),
            rest[rest.len() - 1].end
        ),
    }
}

/// The lowest position a default start (`start_from = checkpoints`) scans
/// from: the identity's seed, or the first row when that lies above it (the
/// store was reseeded before its first append, which the seed does not show).
fn start_floor(seed: i64, first_row: Option<i64>) -> i64 {
    first_row.map_or(seed, |first| first.max(seed))
}

/// The first instant after now on a grid of `every` that all the daemon's
/// stores share: stores with one poll interval poll at the same moments, so
/// the stores of a database read their heads in one statement
/// ([`SharedHeads::shared_head`]). A poll comes at most `every` after the last.
fn next_tick(every: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = Instant::from_std(*EPOCH.get_or_init(std::time::Instant::now));
    let now = Instant::now();
    let every_ns = every.as_nanos().max(1);
    let since = now.saturating_duration_since(epoch).as_nanos();
    let ticks = since / every_ns + 1;
    let at = u64::try_from(ticks * every_ns).unwrap_or(u64::MAX);
    epoch + Duration::from_nanos(at)
}

/// The most holes (ranges) a healer tracks: about 30 MB. A scan step that
/// finds the tracker full reads no further, so `examined`, and with it the
/// contiguous position, stays below the holes not yet tracked; they are
/// found once some of the tracked ones are filled.
pub const MAX_TRACKED: usize = 250_000;

/// Tracked ranges a leader re-checks per poll (16 probe statements on
/// PostgreSQL): the rest are re-checked in later polls, in turns, and the
/// due ones again right before they are filled.
const RECHECK_RANGES: usize = 16_000;
/// The same for a follower or a dry run, whose holes only feed its figures.
const RECHECK_RANGES_IDLE: usize = 1_000;

/// Checkpoints are re-read at most this often (for lag metrics only, which
/// Prometheus scrapes every 15-60 s): two queries a store, which a fleet of
/// 500 stores at 5 s paid 200 times a second.
const CHECKPOINT_REFRESH: Duration = Duration::from_secs(15);

/// The healer's knobs, taken from a [`Store`]'s configuration.
#[derive(Clone, Debug)]
pub struct Options {
    pub gap_timeout: Duration,
    pub poll_interval: Duration,
    pub lock_timeout: Duration,
    pub scan_page_size: u32,
    pub start_from: StartFrom,
    pub lookback: u64,
    pub dry_run: bool,
    /// [`Healer::run`] ends with [`Ended::GaveUp`] once scans have failed
    /// this long in a row; `None`: never.
    pub give_up_after: Option<Duration>,
    /// Publish the contiguous watermark ([`WatermarkTable::publish_watermark`]) and
    /// start the scan no later than the one published before, so the proof
    /// that every position up to it is filled runs unbroken from the first
    /// publication on.
    pub publish_watermark: bool,
}

/// How [`Healer::run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Told to stop.
    Stopped,
    /// Every scan failed for `give_up_after` (the last one at `failing_for`).
    GaveUp { failing_for: Duration },
    /// `start_from` lies above the head of a table that has events: the
    /// daemon would never examine a hole at or below the head, so it refuses
    /// to run (an empty table may start anywhere).
    StartAboveHead { from: i64, head: i64 },
}

impl From<&Store> for Options {
    fn from(s: &Store) -> Self {
        Options {
            gap_timeout: s.gap_timeout,
            poll_interval: s.poll_interval,
            lock_timeout: s.lock_timeout,
            scan_page_size: s.scan_page_size,
            start_from: s.start_from,
            lookback: s.lookback,
            dry_run: s.dry_run,
            give_up_after: s.give_up_after,
            publish_watermark: s.store.watermark_table.is_some() && !s.dry_run,
        }
    }
}

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

/// What one scan step read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanStep {
    pub rows: u64,
    pub new_holes: usize,
    /// The step reached the head, or stopped at [`MAX_TRACKED`]
    /// ([`Healer::scan_paused`]).
    pub caught_up: bool,
    /// The tracked holes it re-checked first, and what the probe found.
    pub rechecked: Rechecked,
    /// The highest committed position examined after the step.
    pub examined: i64,
}

/// Tracked ranges (ascending, disjoint) and one probe of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rechecked {
    pub ranges: Vec<PosRange>,
    pub probe: Probe,
}

impl Rechecked {
    /// Whether `range` lies inside one of the probed ranges.
    fn covers(&self, range: PosRange) -> bool {
        let i = self.ranges.partition_point(|r| r.start <= range.start);
        i > 0 && self.ranges[i - 1].end >= range.end
    }
}

impl FillReport {
    /// Adds another step's figures to these.
    pub fn add(&mut self, other: &FillReport) {
        self.statements += other.statements;
        self.tombstones += other.tombstones;
        self.committed += other.committed;
        self.held += other.held;
        self.writer_waiting += other.writer_waiting;
        self.errors += other.errors;
    }
}

/// What one fill step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillReport {
    pub statements: u64,
    pub tombstones: u64,
    pub committed: u64,
    /// Refusals that mean "try later": held positions, a busy tombstone
    /// stream, a waiting writer.
    pub held: u64,
    /// Of `held`: fills refused because another writer was waiting for a
    /// lock ([`FillOutcome::WriterWaiting`]).
    pub writer_waiting: u64,
    pub errors: u64,
}

/// Who follows a healer's steps as they go: the daemon's log alone
/// ([`LogOnly`]), or a one-shot command that shows its own progress.
pub trait Progress: Send {
    /// Whether someone is shown the figures as they come: then each fill
    /// statement is logged at DEBUG (the figures tell), else at INFO (the
    /// log is the only report).
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

/// Nobody follows but the log: the daemon, and [`Healer::fill_due`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LogOnly;

impl Progress for LogOnly {
    fn shown(&self) -> bool {
        false
    }
}

pub struct Healer<E: Engine> {
    engine: Arc<E>,
    opts: Options,
    leader: Leader,
    health: Arc<Health>,
    /// Where the figures go: the store's health (its series) unless told
    /// otherwise ([`Healer::observed_by`]).
    observer: Arc<dyn Observer>,
    tracker: Tracker,
    /// Highest committed position read so far; `None` before [`Healer::begin`].
    examined: Option<i64>,
    /// What the first successful [`Healer::begin`] resolved.
    start: Option<Start>,
    last_checkpoints: Option<Instant>,
    /// The watermark last published (or read back at the start).
    published: Option<i64>,
    /// The scan began above the published watermark (an explicit
    /// `start_from`): the proof is broken, so nothing is published.
    watermark_unproven: bool,
    /// Where the next poll's re-check of tracked ranges goes on from.
    recheck_after: i64,
    /// The last scan step stopped at [`MAX_TRACKED`].
    paused: bool,
}

impl<E: Engine> Healer<E> {
    pub fn new(engine: Arc<E>, opts: Options, leader: Leader, health: Arc<Health>) -> Self {
        Healer {
            engine,
            opts,
            leader,
            observer: health.clone(),
            health,
            tracker: Tracker::new(),
            examined: None,
            start: None,
            last_checkpoints: None,
            published: None,
            watermark_unproven: false,
            recheck_after: i64::MIN,
            paused: false,
        }
    }

    /// Reports the figures to `observer` instead of the store's series.
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The last scan step stopped at [`MAX_TRACKED`] holes, short of the head.
    pub fn scan_paused(&self) -> bool {
        self.paused
    }

    pub fn examined(&self) -> Option<i64> {
        self.examined
    }

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

    /// Re-checks tracked holes (committed since?) and reads up to
    /// [`MAX_PAGES_PER_STEP`] pages of new rows.
    pub async fn scan_step(&mut self) -> DbResult<ScanStep> {
        if self.examined.is_none() {
            self.begin().await?;
        }
        let started = std::time::Instant::now();
        let mut step = ScanStep::default();
        if !self.tracker.is_empty() {
            // A bounded share of the tracked ranges each poll, in turns: a
            // million holes cost a few statements a poll, not a thousand. A
            // healer that does not fill re-checks far less: its holes only
            // feed its figures.
            let budget = if self.leader.is_leader() && !self.opts.dry_run {
                RECHECK_RANGES
            } else {
                RECHECK_RANGES_IDLE
            };
            let ranges = self.tracker.ranges_after(self.recheck_after, budget);
            self.recheck_after = match ranges.last() {
                Some(last) if ranges.len() < self.tracker.len() => last.start,
                _ => i64::MIN,
            };
            let probe = self.engine.probe(&ranges).await?;
            self.tracker.remove_positions(&probe.committed);
            step.rechecked = Rechecked { ranges, probe };
        }
        for _ in 0..MAX_PAGES_PER_STEP {
            if self.tracker.len() >= MAX_TRACKED {
                // Bounded memory: nothing above `examined` is claimed, so the
                // holes beyond are found by the scans after some are filled.
                if !self.paused {
                    info!(
                        tracked = self.tracker.len(),
                        examined = self.examined.unwrap_or_default(),
                        "tracking the most holes the healer keeps: the scan pauses here until some are filled"
                    );
                }
                self.paused = true;
                step.caught_up = true;
                break;
            }
            self.paused = false;
            let after = self.examined.unwrap_or_default();
            let page = self.engine.scan(after, self.opts.scan_page_size).await?;
            let now = Instant::now();
            for hole in &page.holes {
                debug!(hole = %hole, width = hole.width(), "hole seen");
                self.tracker.observe(*hole, now, self.opts.gap_timeout);
            }
            step.rows += page.rows;
            step.new_holes += page.holes.len();
            self.examined = Some(page.high.max(after));
            if page.rows < u64::from(self.opts.scan_page_size) {
                step.caught_up = true;
                break;
            }
        }
        self.scanned(started);
        step.examined = self.examined.unwrap_or_default();
        Ok(step)
    }

    /// A poll's scan (its own, or the shared head) that began at `started`
    /// has read the database.
    fn scanned(&self, started: std::time::Instant) {
        self.observer.scanned(started.elapsed());
        self.health.scan_completed();
    }

    /// The daemon's poll, due at `due`: with no hole tracked, first the head
    /// read for every store of the database at once
    /// ([`SharedHeads::shared_head`]); the store scans itself only when that
    /// shows rows above `examined`, or is not to be had. With holes tracked
    /// it scans (the probe re-checks them).
    pub async fn poll(&mut self, due: Instant) -> DbResult<ScanStep> {
        if let (true, Some(examined)) = (self.tracker.is_empty(), self.examined) {
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
        self.scan_step().await
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

    /// Tries every hole that is due, unless in dry-run mode or not the
    /// leader; each statement is logged at INFO ([`LogOnly`]).
    pub async fn fill_due(&mut self, stop: &CancellationToken) -> FillReport {
        self.fill_due_after(stop, None, &mut LogOnly).await
    }

    /// [`Healer::fill_due`], telling `progress` after every statement.
    pub async fn fill_due_with(
        &mut self,
        stop: &CancellationToken,
        progress: &mut dyn Progress,
    ) -> FillReport {
        self.fill_due_after(stop, None, progress).await
    }

    /// [`Healer::fill_due`] right after a scan step: due holes that step
    /// re-checked are not probed again.
    async fn fill_due_after(
        &mut self,
        stop: &CancellationToken,
        rechecked: Option<Rechecked>,
        progress: &mut dyn Progress,
    ) -> FillReport {
        let mut report = FillReport::default();
        let now = Instant::now();
        let due = self.tracker.due(now);
        if due.is_empty() {
            return report;
        }
        if self.opts.dry_run {
            for hole in due {
                info!(range = %hole.range, width = hole.range.width(), age_ms = now.duration_since(hole.first_seen).as_millis() as u64, "dry run: would fill");
                self.tracker.defer(
                    hole.range,
                    now + self.opts.gap_timeout.max(Duration::from_secs(60)),
                );
            }
            return report;
        }
        if !self.leader.is_leader() {
            return report;
        }
        // Fresh look at the due ranges: what committed since, and (SQL Server)
        // which positions an open append holds right now; the ranges this
        // turn's scan step just re-checked are fresh already.
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
                    return report;
                }
            }
        }
        let limits = cycle::Limits {
            max_rows: self.engine.max_fill_rows(),
            max_ranges: self.engine.max_fill_ranges(),
            range_cost: self.engine.fill_range_cost(),
            gap_timeout: self.opts.gap_timeout,
        };
        let head = self.examined.unwrap_or(i64::MIN);
        let cycle = cycle::plan(&due, &probe.committed, &probe.in_flight, head, now, limits);
        self.apply(&cycle, head);
        let mut queue = cycle.statements;
        queue.reverse();
        while let Some(batch) = queue.pop() {
            if stop.is_cancelled() {
                break;
            }
            // Leadership as it stands now: the fill checks this very fence.
            let Some(fence) = self.leader.fence() else {
                break;
            };
            self.fill_batch(batch, &fence, &mut queue, &mut report, !progress.shown())
                .await;
            progress.filled(&report);
        }
        report
    }

    /// Applies a planned cycle to the tracker in one step: committed
    /// positions and pieces at or above the head forgotten, trusted
    /// sightings deferred as held with one more sighting counted.
    fn apply(&mut self, cycle: &cycle::Cycle, head: i64) {
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
    async fn fill_batch(
        &mut self,
        batch: plan::Batch,
        fence: &Fence,
        queue: &mut Vec<plan::Batch>,
        report: &mut FillReport,
        log_each: bool,
    ) {
        let (max_rows, max_ranges) = (self.engine.max_fill_rows(), self.engine.max_fill_ranges());
        let lock_timeout = plan::lock_timeout_for(&batch, self.opts.lock_timeout, queue.is_empty());
        let what = describe(&batch);
        let started = std::time::Instant::now();
        let outcome = self.engine.fill_ranges(&batch, lock_timeout, fence).await;
        let ms = started.elapsed().as_millis() as u64;
        report.statements += 1;
        match outcome {
            Ok(FillOutcome::Filled { rows }) => {
                self.health.forget_fill_refusal();
                if log_each {
                    info!(range = %what, ranges = batch.len(), rows, ms, outcome = "filled", "filled hole with tombstones");
                } else {
                    debug!(range = %what, ranges = batch.len(), rows, ms, outcome = "filled", "filled hole with tombstones");
                }
                self.observer.filled(Outcome::Filled, rows);
                report.tombstones += rows;
                for range in &batch {
                    self.tracker.remove(*range);
                }
            }
            Ok(FillOutcome::Committed) => {
                self.observer.filled(Outcome::Committed, 0);
                report.committed += 1;
                let found = match self.engine.probe(&batch).await {
                    Ok(p) => p.committed,
                    Err(e) => {
                        self.db_error(Operation::Probe, &e);
                        self.defer_after_error(&batch);
                        return;
                    }
                };
                info!(range = %what, ms, committed = found.len(), outcome = "committed", "an append committed inside the range; filling around it");
                self.tracker.remove_positions(&found);
                self.requeue(
                    plan::after_committed(
                        &batch,
                        &found,
                        max_rows,
                        max_ranges,
                        self.engine.fill_range_cost(),
                    ),
                    queue,
                );
            }
            Ok(FillOutcome::Busy) => {
                self.observer.filled(Outcome::Held, 0);
                report.held += 1;
                info!(range = %what, ms, outcome = "busy", "another healer is filling, or this one no longer leads; retrying later");
                let at = Instant::now() + self.opts.poll_interval;
                // The same holds for the rest of this cycle's batches.
                for range in batch.iter().chain(std::mem::take(queue).iter().flatten()) {
                    self.tracker.defer(*range, at);
                }
            }
            Ok(FillOutcome::TableLocked) => {
                self.observer.filled(Outcome::TableLocked, 0);
                report.held += 1;
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
                self.defer_cycle_after_error(&batch, queue);
            }
            Ok(FillOutcome::WriterWaiting {
                sessions,
                first_session,
            }) => {
                self.observer.filled(Outcome::WriterWaiting, 0);
                report.held += 1;
                report.writer_waiting += 1;
                info!(
                    range = %what,
                    ms,
                    sessions,
                    session = ?first_session,
                    outcome = "writer_waiting",
                    "another writer of the table is waiting for a lock, perhaps with a position of this range drawn and no key yet; not filling until it moves"
                );
                // The check is table-wide: the rest of the cycle would meet it
                // too. Such waits end with the transaction waited for, so the
                // holes are tried again a poll later, without growing backoff.
                let at = Instant::now() + self.opts.poll_interval.max(Duration::from_millis(100));
                for range in batch.iter().chain(std::mem::take(queue).iter().flatten()) {
                    self.tracker.postpone(*range, at);
                }
            }
            Ok(FillOutcome::Held) => {
                self.observer.filled(Outcome::Held, 0);
                report.held += 1;
                debug!(range = %what, ms, outcome = "held", "a position is locked by an open transaction");
                self.requeue(plan::after_held(&batch), queue);
            }
            Err(e) => {
                self.observer.filled(Outcome::Error, 0);
                report.errors += 1;
                self.db_error(Operation::Fill, &e);
                if e.kind == crate::engine::DbErrorKind::Permanent {
                    self.health.fill_refused(&prefixed("fill", &e));
                }
                warn!(range = %what, ms, outcome = "error", error = %e, "fill failed; retrying later");
                // Whatever broke (connection, rights) will break the rest too.
                self.defer_cycle_after_error(&batch, queue);
            }
        }
    }

    fn requeue(&mut self, after: AfterRefusal, queue: &mut Vec<plan::Batch>) {
        match after {
            AfterRefusal::Retry(mut batches) => {
                batches.reverse();
                queue.extend(batches);
            }
            AfterRefusal::Defer(p) => {
                info!(
                    position = p.start,
                    outcome = "held",
                    "an open append holds this position; retrying later"
                );
                self.defer_held(p);
            }
        }
    }

    fn defer_held(&mut self, range: PosRange) {
        let retries = self.tracker.retries_at(range.start);
        let cap = self.opts.lock_timeout.max(Duration::from_secs(2));
        let delay = plan::retry_delay(retries, self.opts.poll_interval, cap);
        self.tracker.defer(range, Instant::now() + delay);
    }

    /// `batch` and the rest of the cycle's `queue`, each with its error backoff.
    fn defer_cycle_after_error(&mut self, batch: &[PosRange], queue: &mut Vec<plan::Batch>) {
        self.defer_after_error(batch);
        for rest in std::mem::take(queue) {
            self.defer_after_error(&rest);
        }
    }

    fn defer_after_error(&mut self, batch: &[PosRange]) {
        for range in batch {
            let retries = self.tracker.retries_at(range.start);
            let base = self.opts.poll_interval.max(Duration::from_millis(500));
            let delay = plan::retry_delay(retries, base, Duration::from_secs(30));
            self.tracker.defer(*range, Instant::now() + delay);
        }
    }

    fn db_error(&self, operation: Operation, e: &DbError) {
        self.observer.db_error(operation);
        self.health.record_error(&prefixed(operation.label(), e));
    }

    /// Refreshes the checkpoint lag gauges, at most every few seconds.
    async fn checkpoint_lag(&mut self) {
        let now = Instant::now();
        if self
            .last_checkpoints
            .is_some_and(|t| now.duration_since(t) < CHECKPOINT_REFRESH)
        {
            return;
        }
        self.last_checkpoints = Some(now);
        let Some(head) = self.examined else { return };
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
            head: watermark.and(self.examined),
            contiguous: self.examined.and(watermark),
        });
        self.health.update(t::Status {
            leader,
            open_holes: stats.holes as u64,
            open_positions: stats.positions,
            head: self.examined,
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
                self.health.watermark_failed(&prefixed("publish", &e));
                warn!(error = %e, "cannot publish the contiguous watermark; retrying next turn");
            }
        }
    }

    /// The highest position at or below which every position from the
    /// scan's start on is a committed event or a tombstone: just below the
    /// lowest tracked hole, else the highest position examined. `None`
    /// before the first scan.
    pub fn contiguous(&self) -> Option<i64> {
        let head = self.examined?;
        Some(self.tracker.lowest().map_or(head, |low| low - 1))
    }

    /// The daemon loop: poll every `poll_interval`, fill each hole the moment
    /// it comes due, back off on database errors, stop on `stop`.
    pub async fn run(mut self, stop: CancellationToken) -> Ended {
        let mut backoff = Backoff::new(
            self.opts.poll_interval.max(Duration::from_millis(200)),
            Duration::from_secs(30),
        );
        let mut next_poll = Instant::now();
        let mut was_leader = self.leader.is_leader();
        // Since when every scan has failed (None after a success).
        let mut failing_since: Option<Instant> = None;
        let mut ended = Ended::Stopped;
        loop {
            self.health.loop_turned();
            let wake = match self.tracker.next_due() {
                Some(due) if self.leader.is_leader() || self.opts.dry_run => due.min(next_poll),
                _ => next_poll,
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.leader.changed() => {}
            }
            let is_leader = self.leader.is_leader();
            if is_leader != was_leader {
                info!(leader = is_leader, "leadership changed");
                was_leader = is_leader;
            }
            let mut rechecked = None;
            if Instant::now() >= next_poll {
                let scan_started = Instant::now();
                let result = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = self.poll(next_poll) => r,
                };
                if let Some(start) = self.start.filter(|s| s.above_head() && !s.empty) {
                    error!(
                        from = start.after + 1,
                        head = start.head,
                        start_from = %self.opts.start_from,
                        "start_from is above the head of a table with events: not running, since no hole at or below the head would ever be examined"
                    );
                    ended = Ended::StartAboveHead {
                        from: start.after + 1,
                        head: start.head,
                    };
                    break;
                }
                match result {
                    Ok(step) => {
                        if backoff.attempts() > 0 {
                            info!("database reachable again");
                        }
                        backoff.reset();
                        failing_since = None;
                        // Behind (a backfill): go on at once instead of waiting a poll.
                        next_poll = if step.caught_up {
                            next_tick(self.opts.poll_interval)
                        } else {
                            Instant::now()
                        };
                        rechecked = Some(step.rechecked);
                        self.checkpoint_lag().await;
                    }
                    Err(e) => {
                        self.db_error(
                            if self.examined.is_none() {
                                Operation::Start
                            } else {
                                Operation::Scan
                            },
                            &e,
                        );
                        self.health.scan_failed(&e.message);
                        let delay = backoff.next_delay();
                        if e.is_transient() {
                            warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed");
                        } else {
                            error!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed; this needs a change in the database (run `gap-healer check`)");
                        }
                        next_poll = Instant::now() + delay;
                        self.publish();
                        let since = *failing_since.get_or_insert(scan_started);
                        if let Some(limit) = self.opts.give_up_after {
                            // The last retry falls on the limit, not up to a
                            // backoff step after it.
                            next_poll = next_poll.min(since + limit);
                            let failing_for = since.elapsed();
                            if failing_for >= limit {
                                error!(
                                    failing_for_ms = failing_for.as_millis() as u64,
                                    give_up_after = %humantime::format_duration(limit),
                                    "every scan has failed for longer than give_up_after: giving up"
                                );
                                ended = Ended::GaveUp { failing_for };
                                break;
                            }
                        }
                        continue;
                    }
                }
            }
            let drained = {
                let mut log = LogOnly;
                let fill = self.fill_due_after(&stop, rechecked, &mut log);
                tokio::pin!(fill);
                tokio::select! {
                    _ = &mut fill => true,
                    _ = async { stop.cancelled().await; tokio::time::sleep(DRAIN_DEADLINE).await } => false,
                }
            };
            if !drained {
                warn!("shutdown deadline: abandoning the fill in flight (it rolls back)");
                break;
            }
            self.publish();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.publish_watermark() => {}
            }
        }
        self.publish();
        info!("healer stopped");
        ended
    }
}

/// `operation: error`, unless the engine's own prefix (the message up to
/// its first `:`) begins or ends with the operation's word: PostgreSQL's
/// errors name it (`probe: 57014: ...`, `fill 2..=3: ...`, `read the
/// watermark: ...`), SQL Server's do not. One prefix per message.
fn prefixed(operation: &str, e: &DbError) -> String {
    let lead = e.message.split(':').next().unwrap_or_default();
    let words: Vec<&str> = lead
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    if words.first() == Some(&operation) || words.last() == Some(&operation) {
        e.message.clone()
    } else {
        format!("{operation}: {e}")
    }
}

#[cfg(test)]
mod tests {
    //! The loop's timing rules under a paused clock, against an in-memory
    //! model of a store. This is a unit test of scheduling logic only: the
    //! database behaviour is proven against real PostgreSQL in tests/.
    use super::*;
    use crate::engine::{Checkpoint, EngineKind, Finding, HeadReading, Probe, ScanPage};
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Model {
        committed: BTreeSet<i64>,
        held: BTreeSet<i64>,
        filled: Vec<(PosRange, Instant)>,
        scans: Vec<i64>,
        probes: Vec<(Instant, Vec<PosRange>)>,
        /// The fence each fill was handed.
        fences: Vec<Fence>,
        checkpoints: Vec<Checkpoint>,
        /// Positions a dirty read shows in flight (whatever their key says).
        dirty: BTreeSet<i64>,
        /// Every fill: its ranges and lock timeout.
        attempts: Vec<(Vec<PosRange>, Duration)>,
        /// The published watermark's row.
        watermark: Option<i64>,
        /// Answer [`SharedHeads::shared_head`] (else `NotShared`, as a
        /// store outside the readings), counting the readings.
        shared: bool,
        shared_reads: usize,
        /// What every probe fails with, when set.
        probe_error: Option<DbError>,
    }

    struct Fake(Mutex<Model>);

    impl Engine for Fake {
        type Heads = Self;
        type Watermark = Self;
        fn kind(&self) -> EngineKind {
            EngineKind::Postgres
        }
        fn max_fill_rows(&self) -> u64 {
            4_000
        }
        async fn identity_floor(&self) -> DbResult<i64> {
            Ok(1)
        }
        async fn head(&self) -> DbResult<Option<i64>> {
            Ok(self.0.lock().unwrap().committed.last().copied())
        }
        async fn first_position(&self) -> DbResult<Option<i64>> {
            Ok(self.0.lock().unwrap().committed.first().copied())
        }
        async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
            Ok(self.0.lock().unwrap().checkpoints.clone())
        }
        async fn scan(&self, after: i64, limit: u32) -> DbResult<ScanPage> {
            let mut m = self.0.lock().unwrap();
            m.scans.push(after);
            let rows: Vec<i64> = m
                .committed
                .range(after + 1..)
                .take(limit as usize)
                .copied()
                .collect();
            let mut prev = after;
            let mut holes = vec![];
            for &p in &rows {
                if let Some(h) = PosRange::new(prev + 1, p - 1) {
                    holes.push(h);
                }
                prev = p;
            }
            Ok(ScanPage {
                holes,
                high: prev,
                rows: rows.len() as u64,
            })
        }
        fn shared_heads(&self) -> Option<&Self> {
            Some(self)
        }
        async fn probe(&self, ranges: &[PosRange]) -> DbResult<Probe> {
            let mut m = self.0.lock().unwrap();
            m.probes.push((Instant::now(), ranges.to_vec()));
            if let Some(e) = m.probe_error.clone() {
                return Err(e);
            }
            let committed = ranges
                .iter()
                .flat_map(|r| m.committed.range(r.start..=r.end).copied())
                .collect();
            let in_flight = ranges
                .iter()
                .flat_map(|r| m.dirty.range(r.start..=r.end).copied())
                .filter(|p| !m.committed.contains(p))
                .collect();
            Ok(Probe {
                committed,
                in_flight,
            })
        }
        async fn fill_ranges(
            &self,
            ranges: &[PosRange],
            lock_timeout: Duration,
            fence: &Fence,
        ) -> DbResult<FillOutcome> {
            let mut m = self.0.lock().unwrap();
            m.fences.push(fence.clone());
            m.attempts.push((ranges.to_vec(), lock_timeout));
            for range in ranges {
                if m.committed.range(range.start..=range.end).next().is_some() {
                    return Ok(FillOutcome::Committed);
                }
                if m.held.range(range.start..=range.end).next().is_some() {
                    return Ok(FillOutcome::Held);
                }
            }
            for range in ranges {
                m.committed.extend(range.start..=range.end);
                m.filled.push((*range, Instant::now()));
            }
            Ok(FillOutcome::Filled {
                rows: ranges.iter().map(|r| r.width()).sum(),
            })
        }
        async fn preflight(&self) -> DbResult<Vec<Finding>> {
            Ok(vec![])
        }
        fn schema(&self) -> &str {
            "fake"
        }
        fn watermark_table(&self) -> Option<&Self> {
            Some(self)
        }
    }

    impl SharedHeads for Fake {
        async fn shared_head(&self, _not_before: Instant) -> HeadReading {
            let mut m = self.0.lock().unwrap();
            if !m.shared {
                return HeadReading::NotShared;
            }
            m.shared_reads += 1;
            m.committed
                .last()
                .map_or(HeadReading::Empty, |&h| HeadReading::At(h))
        }
    }

    impl WatermarkTable for Fake {
        async fn read_watermark(&self, _store: &str) -> DbResult<Option<i64>> {
            Ok(self.0.lock().unwrap().watermark)
        }
        async fn publish_watermark(&self, _store: &str, position: i64) -> DbResult<()> {
            let mut m = self.0.lock().unwrap();
            m.watermark = Some(m.watermark.map_or(position, |w| w.max(position)));
            Ok(())
        }
    }

    /// The first proof of a published watermark starts at the identity's
    /// seed, not at the first row: positions 1..4 below the first row may
    /// be an append still open (PostgreSQL shows none of it), so the
    /// watermark must stay below them until they are filled.
    #[tokio::test(start_paused = true)]
    async fn the_first_watermark_proof_starts_at_the_seed_not_the_first_row() {
        let o = Options {
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
            start_from: StartFrom::Checkpoints,
            lookback: 1_000,
            ..opts()
        };
        let (fake, mut h) = healer([5, 6, 8], o);
        h.begin().await.unwrap();
        h.scan_step().await.unwrap();
        assert_eq!(fake.0.lock().unwrap().scans.first(), Some(&4));
    }

    fn opts() -> Options {
        Options {
            gap_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(250),
            lock_timeout: Duration::from_secs(2),
            scan_page_size: 100,
            start_from: StartFrom::Position(1),
            lookback: 0,
            dry_run: false,
            give_up_after: None,
            publish_watermark: false,
        }
    }

    fn healer(committed: impl IntoIterator<Item = i64>, o: Options) -> (Arc<Fake>, Healer<Fake>) {
        let fake = Arc::new(Fake(Mutex::new(Model {
            committed: committed.into_iter().collect(),
            ..Default::default()
        })));
        let h = Healer::new(
            fake.clone(),
            o,
            Leader::always(),
            Health::new(Duration::from_millis(250), Duration::from_secs(2)),
        );
        (fake, h)
    }

    /// Issue 20: `/status` read "probe: probe: 57014: ...": the healer named
    /// the operation, and PostgreSQL's error had named it already.
    #[tokio::test(start_paused = true)]
    async fn an_error_names_its_operation_once() {
        for (engine_said, shown) in [
            (
                "probe: 57014: canceling statement due to statement timeout",
                "probe: 57014: canceling statement due to statement timeout",
            ),
            (
                "SQL Server error 1205: deadlock victim",
                "probe: SQL Server error 1205: deadlock victim",
            ),
            (
                "cannot connect to PostgreSQL at probe.db:5432: Connection refused",
                "probe: cannot connect to PostgreSQL at probe.db:5432: Connection refused",
            ),
        ] {
            let (fake, mut h) = healer([1, 3], opts());
            h.begin().await.unwrap();
            h.scan_step().await.unwrap();
            fake.0.lock().unwrap().probe_error = Some(DbError::transient(engine_said));
            tokio::time::advance(Duration::from_secs(6)).await;
            // The due hole is probed again before its fill, and that fails.
            let report = h.fill_due(&CancellationToken::new()).await;
            assert_eq!(report.errors, 1);
            assert_eq!(h.health.status().last_error.as_deref(), Some(shown));
        }
        let e = |m: &str| DbError::permanent(m);
        assert_eq!(
            prefixed("fill", &e("fill 2..=3: 42501: denied")),
            "fill 2..=3: 42501: denied"
        );
        assert_eq!(
            prefixed("read", &e("read the watermark: 42P01: no table")),
            "read the watermark: 42P01: no table"
        );
        assert_eq!(
            prefixed("watermark", &e("publish the watermark: 42501: denied")),
            "publish the watermark: 42501: denied"
        );
        assert_eq!(
            prefixed("fill", &e("SQL Server error 229: denied")),
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

    #[test]
    fn rechecked_covers_only_ranges_inside_a_probed_one() {
        let r = |a, b| PosRange::new(a, b).unwrap();
        let checked = Rechecked {
            ranges: vec![r(2, 5), r(9, 9), r(20, 30)],
            probe: Probe::default(),
        };
        for (range, covered) in [
            (r(2, 5), true),
            (r(3, 4), true),
            (r(9, 9), true),
            (r(25, 30), true),
            (r(1, 2), false),
            (r(5, 6), false),
            (r(8, 9), false),
            (r(10, 10), false),
            (r(31, 31), false),
        ] {
            assert_eq!(checked.covers(range), covered, "{range}");
        }
        assert!(!Rechecked::default().covers(r(1, 1)));
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

    /// With a shared head reading, an idle store sends no scan of its own;
    /// a row above what it examined brings its own scan back, and so do
    /// tracked holes (their probe) until they are filled.
    #[tokio::test(start_paused = true)]
    async fn idle_polls_use_the_shared_head_until_something_moves() {
        let (fake, h) = healer(1..=10, opts());
        fake.0.lock().unwrap().shared = true;
        let stop = CancellationToken::new();
        let task = tokio::spawn(h.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (scans, reads) = {
            let m = fake.0.lock().unwrap();
            (m.scans.clone(), m.shared_reads)
        };
        assert_eq!(
            scans,
            vec![0],
            "one scan at the start, then shared readings"
        );
        assert!(
            (10..=13).contains(&reads),
            "{reads} shared readings in 3 s at 250 ms"
        );
        // A row two above the head: the next poll scans and finds hole 11.
        fake.0.lock().unwrap().committed.insert(12);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(fake.0.lock().unwrap().scans, vec![0, 10]);
        // Tracked until filled at gap_timeout (5 s): scans and probes meanwhile.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let scans_after_fill = {
            let m = fake.0.lock().unwrap();
            assert_eq!(m.filled.len(), 1);
            assert!(!m.probes.is_empty());
            m.scans.len()
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
        task.await.unwrap();
        let m = fake.0.lock().unwrap();
        assert!(
            m.scans.len() <= scans_after_fill + 1,
            "idle again: {} scans after the fill, {scans_after_fill} before",
            m.scans.len()
        );
    }

    #[test]
    fn polls_fall_on_one_grid_at_most_one_interval_apart() {
        let every = Duration::from_millis(250);
        let a = next_tick(every);
        std::thread::sleep(Duration::from_millis(30));
        let b = next_tick(every);
        let now = Instant::now();
        assert!(b > now && b <= now + every);
        let apart = b
            .duration_since(a)
            .as_nanos()
            .max(a.duration_since(b).as_nanos());
        assert_eq!(apart % every.as_nanos(), 0, "{apart} ns apart");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_polls_read_only_above_the_head() {
        let (fake, h) = healer(1..=1_000, opts());
        let stop = CancellationToken::new();
        let task = tokio::spawn(h.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
        task.await.unwrap();
        let scans = fake.0.lock().unwrap().scans.clone();
        // 10 pages to reach the head, then every poll starts at the head.
        assert!(scans.len() >= 10 + 10, "{}", scans.len());
        assert!(scans[10..].iter().all(|&after| after == 1_000), "{scans:?}");
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
}
