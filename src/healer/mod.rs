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

mod daemon;
mod fill;
mod report;
mod scan;
mod start;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::config::{StartFrom, Store};
use crate::cycle;
use crate::engine::{
    DbError, DbResult, Engine, Fence, FillOutcome, Probe, SharedHeads, WatermarkTable,
};
use crate::gaps::{PosRange, Tracker};
use crate::leader::Leader;
use crate::plan::{self, AfterRefusal};
use crate::proof::Proof;
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
            rest[rest.len() - 1].end()
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

/// A healer that has begun: what [`Healer::begin`] resolved, and the
/// highest committed position read since (never below `start.after`).
#[derive(Clone, Copy, Debug)]
struct Begun {
    start: Start,
    examined: i64,
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
        let i = self.ranges.partition_point(|r| r.start() <= range.start());
        i > 0 && self.ranges[i - 1].end() >= range.end()
    }
}

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
    /// Set by the first successful [`Healer::begin`]: a healer has begun
    /// exactly when it has a start and a position examined.
    begun: Option<Begun>,
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
    /// What the transactions that drew the tracked positions have done.
    proof: Proof,
    /// The latest positions examined and when their scan page answered
    /// (oldest first, a few): a reading that began after a page answered
    /// covers the positions up to it.
    scanned_at: std::collections::VecDeque<(Instant, i64)>,
    /// The engine gives no reading of open transactions (SQL Server
    /// without `VIEW SERVER STATE`): its key order alone stands.
    key_order_only: bool,
    /// How far the identity had handed out at the latest reading, where
    /// the engine could say.
    handed_out: Option<i64>,
    /// Due holes wait for an open transaction first read at this moment
    /// (the oldest they wait for); `None` when none waits.
    blocked_since: Option<Instant>,
    /// The last "waiting for an open transaction" line: when, and for which.
    waits_logged: Option<(Instant, String)>,
    /// Fill cycles that wrote nothing since their last line: since when,
    /// and how many.
    quiet_cycles: Option<(Instant, u64)>,
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
            begun: None,
            last_checkpoints: None,
            published: None,
            watermark_unproven: false,
            recheck_after: i64::MIN,
            paused: false,
            proof: Proof::new(),
            scanned_at: std::collections::VecDeque::new(),
            key_order_only: false,
            handed_out: None,
            blocked_since: None,
            waits_logged: None,
            quiet_cycles: None,
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

    /// The highest committed position read so far; `None` before
    /// [`Healer::begin`].
    pub fn examined(&self) -> Option<i64> {
        self.begun.map(|b| b.examined)
    }
}

#[cfg(test)]
mod tests;
