//! The healer: scan for new rows, track holes, fill the ones that are due.
//!
//! One [`Healer`] serves one store. Its steps are public so `heal --once`,
//! `scan` and the tests drive them one at a time; [`Healer::run`] is the
//! daemon loop that strings them together until shutdown.
//!
//! # Layout
//! The healer composes phases that each own their state, and owns only
//! what they share: the engine, the options and [`Pacing`], the leader,
//! the [`Sink`] it reports to, the tracker of holes and where it has begun
//! ([`Begun`]).
//! - `start.rs`: where a healer begins ([`Start`], [`Begun`]);
//! - `scan.rs`: the [`Scanner`] (pages of new rows, the tracked holes
//!   re-checked in turns; [`ScanStep`]);
//! - `waits.rs`: the [`Prover`] (the transaction-end proof: readings of
//!   open transactions, what due holes wait for);
//! - `fill.rs`: the [`Filler`] (one fill cycle's run: its queue, its
//!   report, each statement's answer applied in one place; [`FillReport`],
//!   [`Progress`]);
//! - `publish.rs`: the [`Publisher`] (gauges and status, checkpoint lag,
//!   the published watermark);
//! - `pacing.rs`: every delay ([`Pacing`]); `sink.rs`: where figures and
//!   status go ([`Sink`]); `daemon.rs`: the loop.
//!
//! # The route of a due hole
//! [`Healer::run`] (daemon) polls: `Healer::poll` → [`Scanner::step`] →
//! `Engine::scan` → `Tracker::observe`, then `Prover::read` (a reading of
//! open transactions after a scan that found new holes). When a hole is
//! due: `Healer::fill_due` → `Prover::proven_due` (what every transaction
//! that may have drawn it has ended for) → `Filler::fresh_probe` →
//! [`crate::cycle::plan`] → `Filler::run`: per statement
//! `Engine::fill_ranges`, then [`crate::cycle::react`] and
//! `Filler::apply`, the one place that touches the tracker, the report and
//! the sink.
//!
//! Architecture invariants:
//! - A scan only ever reads above `examined` (the highest committed position it
//!   has read), so an idle poll costs one index probe whatever the table size.
//! - A hole is tried no earlier than `gap_timeout` after it was first seen, and
//!   only below `examined`: the tail above the head is never a hole.
//! - A hole is filled only once every transaction that may have drawn its
//!   positions has ended ([`crate::proof`]).
//! - Nothing is written in dry-run mode or while [`Leader::is_leader`] is false;
//!   leadership is checked before every fill statement.
//! - A refused fill is split, never retried whole, so every cycle makes progress.
//! - A daemon poll with no hole tracked may skip its own scan when the head
//!   read for every store of its database at once, after the poll was due,
//!   is no higher than `examined` (nothing new can lie below it). Polls fall
//!   on one grid per poll interval, shared by the daemon's stores.
//! - A follower (an election another healer leads) reads no new rows after
//!   its first scan: its poll re-checks the holes it tracks and reads the
//!   head; `examined` stays, so a follower that takes over scans on from it
//!   and misses nothing.
//! - No phase reaches into another's state; figures and status go only
//!   through the [`Sink`].

mod daemon;
mod fill;
mod pacing;
mod publish;
mod scan;
mod sink;
mod start;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::fill::{FillReport, Filler, LogOnly, Progress};
pub use self::pacing::Pacing;
pub use self::publish::Publisher;
pub use self::scan::{Rechecked, ScanStep, Scanner};
pub use self::sink::Sink;
pub use self::start::{Begun, Start};
pub use self::waits::Prover;
use crate::config::{StartFrom, Store, StoreName};
use crate::engine::{DbResult, Engine, HeadReading, SharedHeads};
use crate::gaps::Tracker;
use crate::leader::Leader;
use crate::telemetry::{Health, Observer};

/// How many holes (ranges) a healer tracks before its scan pauses: about
/// 30 MB. A scan step reads no further page once the tracker holds this
/// many (the page before may have added up to `scan_page_size` more), so
/// `examined`, and with it the contiguous position, stays below the holes
/// not yet tracked; they are found once some of the tracked ones are filled.
pub const MAX_TRACKED: usize = 250_000;

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

/// The healer's knobs, taken from a [`Store`]'s configuration.
#[derive(Clone, Debug)]
pub struct Options {
    /// The store healed: the key of its row in the watermark table.
    pub store: StoreName,
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
    /// Publish the contiguous watermark
    /// ([`crate::engine::WatermarkTable::publish_watermark`]) and start the
    /// scan no later than the one published before, so the proof that every
    /// position up to it is filled runs unbroken from the first publication
    /// on.
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
            store: s.name.clone(),
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

/// One store's healer: the phases, and what they share.
pub struct Healer<E: Engine> {
    engine: Arc<E>,
    opts: Options,
    pacing: Pacing,
    leader: Leader,
    sink: Sink,
    tracker: Tracker,
    /// Set by the first successful start: a healer has begun exactly when
    /// it has a start and a position examined.
    begun: Option<Begun>,
    scanner: Scanner,
    prover: Prover,
    filler: Filler,
    publisher: Publisher,
}

impl<E: Engine> Healer<E> {
    pub fn new(engine: Arc<E>, opts: Options, leader: Leader, health: Arc<Health>) -> Self {
        Healer {
            engine,
            opts,
            pacing: Pacing::default(),
            leader,
            sink: Sink::new(health),
            tracker: Tracker::new(),
            begun: None,
            scanner: Scanner::default(),
            prover: Prover::default(),
            filler: Filler::default(),
            publisher: Publisher::default(),
        }
    }

    /// Reports the figures to `observer` instead of the store's series.
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.sink.observed_by(observer);
        self
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The last scan step stopped at [`MAX_TRACKED`] holes, short of the head.
    pub fn scan_paused(&self) -> bool {
        self.scanner.paused()
    }

    /// The highest committed position read so far; `None` before
    /// [`Healer::begin`].
    pub fn examined(&self) -> Option<i64> {
        self.begun.map(|b| b.examined)
    }

    /// Whether this healer fills (leads, and not in a dry run): only then
    /// are open transactions read.
    fn fills(&self) -> bool {
        self.leader.is_leader() && !self.opts.dry_run
    }

    /// Whether another healer fills this store (an election this one does
    /// not lead; a dry run is no follower: it reports what it finds).
    fn follows(&self) -> bool {
        !self.leader.is_leader() && !self.opts.dry_run
    }

    /// A follower's poll: the holes it tracks re-checked (its figures of
    /// them stay true while the leader fills them) and the store's head
    /// read (the database's shared reading, else one statement of its
    /// own), so a store it can no longer read fails as a scan would; no
    /// new row is read. The leader reads them; a follower that takes over
    /// scans on from where it was.
    async fn follower_check(&mut self, begun: Begun, due: Instant) -> DbResult<ScanStep> {
        let started = std::time::Instant::now();
        let mut step = ScanStep {
            caught_up: true,
            examined: begun.examined,
            ..ScanStep::default()
        };
        if !self.tracker.is_empty() {
            step.rechecked = self
                .scanner
                .recheck(
                    &*self.engine,
                    &mut self.tracker,
                    scan::recheck_budget(false),
                )
                .await?;
        }
        let shared = match self.engine.shared_heads() {
            Some(heads) => heads.shared_head(due).await,
            None => HeadReading::NotShared,
        };
        if matches!(shared, HeadReading::NotShared | HeadReading::Failed(_)) {
            self.engine.head().await?;
        }
        self.sink.scanned(started.elapsed());
        Ok(step)
    }

    /// Re-checks tracked holes (committed since?) and reads up to a few
    /// dozen pages of new rows; when it found new holes and this healer
    /// fills, the open transactions are read after it ([`crate::proof`]).
    pub async fn scan_step(&mut self) -> DbResult<ScanStep> {
        self.scan_step_due(Instant::now()).await
    }

    /// [`Healer::scan_step`] for a poll due at `due`: a reading of the open
    /// transactions that began since then serves it (the stores of a
    /// database share one).
    async fn scan_step_due(&mut self, due: Instant) -> DbResult<ScanStep> {
        let mut begun = match self.begun {
            Some(begun) => begun,
            None => self.start().await?,
        };
        let started = std::time::Instant::now();
        let recheck = scan::recheck_budget(self.fills());
        let step = self
            .scanner
            .step(
                &*self.engine,
                &mut self.tracker,
                &mut begun,
                &self.opts,
                recheck,
            )
            .await;
        // A step cut short keeps what it read.
        self.begun = Some(begun);
        let step = step?;
        self.sink.scanned(started.elapsed());
        for (at, high) in &step.pages {
            self.prover.examined(*at, *high);
        }
        if step.new_holes > 0 && self.fills() {
            self.prover.read(&*self.engine, due, &self.sink).await;
        }
        Ok(step)
    }

    /// The daemon's poll, due at `due`: with no hole tracked, first the head
    /// read for every store of the database at once
    /// ([`SharedHeads::shared_head`]); the store scans itself only when that
    /// shows rows above `examined`, or is not to be had. With holes tracked
    /// it scans (the probe re-checks them).
    pub async fn poll(&mut self, due: Instant) -> DbResult<ScanStep> {
        if let (true, Some(begun)) = (self.follows(), self.begun) {
            return self.follower_check(begun, due).await;
        }
        if let (true, Some(examined)) = (self.tracker.is_empty(), self.examined()) {
            let started = std::time::Instant::now();
            // A failed shared reading is not this store's failure: its own
            // scan decides.
            if let Some(heads) = self.engine.shared_heads() {
                if heads.shared_head(due).await.shows_nothing_above(examined) {
                    self.sink.scanned(started.elapsed());
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

    /// Tries every hole that is due, unless in dry-run mode or not the
    /// leader; each statement is logged at DEBUG, the cycle at INFO.
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
    async fn fill_due_after(
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
            fill::would_fill(&mut self.tracker, due, now, &self.opts, &self.pacing);
            return report;
        }
        if !self.leader.is_leader() {
            return report;
        }
        let due = self
            .prover
            .proven_due(
                &*self.engine,
                due,
                not_before,
                &mut self.tracker,
                &self.sink,
                &self.opts,
                &self.pacing,
                &mut report,
            )
            .await;
        if due.is_empty() {
            return report;
        }
        // A long cycle publishes its figures as it goes.
        let (publisher, prover, sink, leader) =
            (&self.publisher, &self.prover, &self.sink, &self.leader);
        let examined = self.begun.map(|b| b.examined);
        let publish = |tracker: &Tracker| {
            let blocking = prover.blocking_age(tracker, Instant::now());
            publisher.publish(tracker, examined, leader.is_leader(), blocking, sink);
        };
        let mut run = fill::Run {
            engine: &*self.engine,
            tracker: &mut self.tracker,
            sink,
            leader,
            opts: &self.opts,
            pacing: &self.pacing,
            publish: &publish,
            report,
        };
        let Some(probe) = run.fresh_probe(&due, rechecked).await else {
            return run.report;
        };
        let report = run.cycle(&due, &probe, head, now, stop, progress).await;
        self.filler.log_cycle(&report, &self.pacing);
        report
    }

    /// Publishes the tracker's figures (gauges and `/status`).
    pub fn publish(&self) {
        self.publisher.publish(
            &self.tracker,
            self.examined(),
            self.leader.is_leader(),
            self.prover.blocking_age(&self.tracker, Instant::now()),
            &self.sink,
        );
    }

    /// Publishes the contiguous watermark when it has moved (with a
    /// watermark table configured and not in a dry run).
    pub async fn publish_watermark(&mut self) {
        let Some(watermark) = self.contiguous() else {
            return;
        };
        self.publisher
            .publish_watermark(&*self.engine, watermark, &self.opts, &self.sink)
            .await;
    }

    /// The highest position at or below which every position from the
    /// scan's start on is a committed event or a tombstone: just below the
    /// lowest tracked hole, else the highest position examined. `None`
    /// before the first scan.
    pub fn contiguous(&self) -> Option<i64> {
        publish::contiguous(&self.tracker, self.examined())
    }
}

#[cfg(test)]
mod tests;
