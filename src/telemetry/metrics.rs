//! The Prometheus names, their label values and descriptions, and each
//! store's [`Series`], which the healer writes through an [`Observer`].
//!
//! Invariant: the names, label values and HELP texts here are the public
//! contract of the scrape (the dashboard and alert rules in deploy/ and a
//! test that scrapes the binary rely on them); the label values are enums
//! whose every variant has its label and its part of the description, so a
//! new outcome or operation cannot be counted without being described.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub const OPEN_GAPS: &str = "gap_healer_open_gaps";
pub const OPEN_GAP_POSITIONS: &str = "gap_healer_open_gap_positions";
pub const OLDEST_GAP_AGE: &str = "gap_healer_oldest_gap_age_seconds";
pub const TOMBSTONES_INSERTED: &str = "gap_healer_tombstones_inserted_total";
pub const FILL_ATTEMPTS: &str = "gap_healer_fill_attempts_total";
pub const SCAN_DURATION: &str = "gap_healer_scan_duration_seconds";
pub const HEAD_POSITION: &str = "gap_healer_head_position";
pub const LEADER: &str = "gap_healer_leader";
pub const DB_ERRORS: &str = "gap_healer_db_errors_total";
pub const CHECKPOINT_LAG: &str = "gap_healer_checkpoint_lag_positions";
pub const BUILD_INFO: &str = "gap_healer_build_info";
pub const STORES: &str = "gap_healer_stores";
pub const CONTIGUOUS_POSITION: &str = "gap_healer_contiguous_position";
pub const BLOCKING_TRANSACTION_AGE: &str = "gap_healer_blocking_transaction_age_seconds";
pub const DRY_RUN: &str = "gap_healer_dry_run";

/// The label every per-store series carries.
pub const STORE_LABEL: &str = "store";

/// Declares the values of one label as an enum: each variant with its label
/// value, and `ALL`, every variant in declaration order (so
/// `ALL[v as usize] == v`). A variant cannot be added without its label.
macro_rules! label_values {
    ($(#[$meta:meta])* pub enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The label value in the scrape.
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

label_values! {
    /// The `outcome` label of [`FILL_ATTEMPTS`]: how one fill transaction
    /// ended, or why a fill cycle's due holes were not tried.
    pub enum Outcome {
        /// Every position of the batch holds a tombstone now.
        Filled => "filled",
        /// An append committed inside the batch (a duplicate key).
        Committed => "committed",
        /// An open append holds a position, or another filler holds the
        /// tombstone stream, or this process no longer leads.
        Held => "held",
        /// Due holes not tried: a transaction that may have drawn them is
        /// still open (counted once per fill cycle).
        OpenTransaction => "open_transaction",
        /// The table itself was locked.
        TableLocked => "table_locked",
        /// The database failed the statement.
        Error => "error",
    }
}

impl Outcome {
    /// What the outcome means, in [`FILL_ATTEMPTS`]'s description (`None`:
    /// the label says it).
    fn meaning(self) -> Option<&'static str> {
        match self {
            Outcome::Filled | Outcome::Error => None,
            Outcome::Committed => Some("an append got there"),
            Outcome::Held => Some("an open append holds a position"),
            Outcome::OpenTransaction => Some("not tried: a transaction that may have drawn a due position is still open; once per fill cycle"),
            Outcome::TableLocked => Some("the table itself was locked, by DDL or LOCK TABLE: the store backs off"),
        }
    }
}

label_values! {
    /// The `operation` label of [`DB_ERRORS`]: what the database failed.
    pub enum Operation {
        /// Resolving where the scan starts.
        Start => "start",
        Scan => "scan",
        /// Re-checking tracked holes.
        Probe => "probe",
        Fill => "fill",
        /// Reading the Checkpoints table (lag figures).
        Checkpoints => "checkpoints",
        /// The leader lock.
        Leader => "leader",
        /// Reading or publishing the contiguous watermark.
        Watermark => "watermark",
        /// Listing a store set's databases.
        Discover => "discover",
        /// Reading the open transactions (the transaction-end proof).
        Transactions => "transactions",
    }
}

impl Operation {
    /// Whether a store's series counts it (else a store set's does, under
    /// the set's name: see [`discovery_errors`]).
    fn per_store(self) -> bool {
        match self {
            Operation::Start
            | Operation::Scan
            | Operation::Probe
            | Operation::Fill
            | Operation::Checkpoints
            | Operation::Leader
            | Operation::Watermark
            | Operation::Transactions => true,
            Operation::Discover => false,
        }
    }

    /// The operations a store's series count, exported from the start so
    /// `rate()` and alerts see a series before the first error.
    fn of_a_store() -> impl Iterator<Item = Operation> {
        Operation::ALL.iter().copied().filter(|o| o.per_store())
    }
}

/// [`FILL_ATTEMPTS`]'s description, from the outcomes' meanings.
fn fill_attempts_help() -> String {
    let outcomes: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| match o.meaning() {
            Some(meaning) => format!("{} ({meaning})", o.label()),
            None => o.label().to_string(),
        })
        .collect();
    format!("Fill transactions by outcome: {}.", outcomes.join(", "))
}

/// [`DB_ERRORS`]'s description, from a store's operations.
fn db_errors_help() -> String {
    let operations: Vec<&str> = Operation::of_a_store().map(Operation::label).collect();
    format!("Database errors by operation ({}).", operations.join(", "))
}

const SCAN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How long a series may go unchanged before the exporter drops it: the
/// exporter's `idle_timeout`, the removal it supports. A store's counters
/// and gauges are touched at every scrape while it is on the
/// [`super::Board`] ([`Series::touch`]), so only a store that was let go
/// (its database dropped) loses them, at the first scrape this long after
/// its last update. The scan-duration histogram cannot be touched without a
/// sample: a store that completes no scan for this long (down, or one long
/// fill cycle) drops it until its next scan, which starts it again from
/// zero. At least 15 s, and 4 of the longest poll interval.
pub fn retire_after(longest_poll: Duration) -> Duration {
    (longest_poll * 4).max(Duration::from_secs(15))
}

/// Installs the global Prometheus recorder and describes every metric, so
/// each has a HELP line before its first sample. Series unchanged for
/// `retire_after` are dropped (see [`retire_after`]).
pub fn install_metrics(retire_after: Duration) -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets(SCAN_BUCKETS)
        .map_err(|e| anyhow::anyhow!("histogram buckets: {e}"))?
        .idle_timeout(MetricKindMask::ALL, Some(retire_after))
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("installing the metrics recorder: {e}"))?;
    describe_gauge!(
        OPEN_GAPS,
        "Holes (ranges of missing positions) tracked now."
    );
    describe_gauge!(
        OPEN_GAP_POSITIONS,
        "Missing positions inside the tracked holes."
    );
    describe_gauge!(
        OLDEST_GAP_AGE,
        Unit::Seconds,
        "Age of the oldest tracked hole since it was first seen; 0 when none."
    );
    describe_counter!(
        TOMBSTONES_INSERTED,
        "Tombstone rows committed by this process."
    );
    describe_counter!(FILL_ATTEMPTS, fill_attempts_help());
    describe_histogram!(
        SCAN_DURATION,
        Unit::Seconds,
        "Time of one scan step: reading new positions and re-checking tracked holes."
    );
    describe_gauge!(HEAD_POSITION, "Highest committed global position seen.");
    describe_gauge!(
        LEADER,
        "1 while this process may fill, 0 while it only watches."
    );
    describe_counter!(DB_ERRORS, db_errors_help());
    describe_gauge!(
        CHECKPOINT_LAG,
        "Head position minus the position of each row of the Checkpoints table."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label tells which build runs."
    );
    describe_gauge!(
        STORES,
        "Stores this process heals, by state: starting (no scan has ended yet), healthy (its last scan succeeded) or failing."
    );
    describe_gauge!(
        BLOCKING_TRANSACTION_AGE,
        Unit::Seconds,
        "Age, since first read, of the oldest open transaction that due holes wait for (it may have drawn their positions); 0 when none. A hole is never filled before such a transaction ends."
    );
    describe_gauge!(
        CONTIGUOUS_POSITION,
        "The highest position at or below which every position, from the scan's start on, is a committed event or a tombstone."
    );
    describe_gauge!(
        DRY_RUN,
        "1 when the store is healed as a dry run (it finds holes, never fills, never leads), else 0."
    );
    build_info().set(1.0);
    Ok(handle)
}

pub(super) fn build_info() -> Gauge {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"))
}

/// A store's state in `/status` and [`STORES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreState {
    /// No scan has ended yet, and none has failed: it has just started
    /// (never counted as failing).
    Starting,
    /// Its last scan succeeded.
    Healthy,
    /// Its last scan failed.
    Failing,
}

impl StoreState {
    /// Every state, as [`m::STORES`] exports them.
    pub const ALL: [StoreState; 3] = [
        StoreState::Starting,
        StoreState::Healthy,
        StoreState::Failing,
    ];

    pub fn label(self) -> &'static str {
        match self {
            StoreState::Starting => "starting",
            StoreState::Healthy => "healthy",
            StoreState::Failing => "failing",
        }
    }
}

/// [`STORES`], by state: how many stores are in each.
pub(super) fn count_stores(count: impl Fn(StoreState) -> usize) {
    for state in StoreState::ALL {
        metrics::gauge!(STORES, "state" => state.label()).set(count(state) as f64);
    }
}

/// A store set's discovery errors ([`DB_ERRORS`] for
/// [`Operation::Discover`], under the set's name).
pub fn discovery_errors(set: &str) -> Counter {
    metrics::counter!(DB_ERRORS, "operation" => Operation::Discover.label(), STORE_LABEL => set.to_string())
}

/// A store's figures after a turn of its healer, for [`Observer::gauges`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauges {
    /// Holes (ranges) tracked.
    pub holes: usize,
    /// Missing positions inside them.
    pub positions: u64,
    /// Age of the oldest since it was first seen; zero when none.
    pub oldest_age: Duration,
    pub leader: bool,
    /// The highest committed position examined; `None` before the first
    /// scan (the head and contiguous series appear with it).
    pub head: Option<i64>,
    /// See [`CONTIGUOUS_POSITION`]; `None` exactly when `head` is.
    pub contiguous: Option<i64>,
    /// See [`BLOCKING_TRANSACTION_AGE`].
    pub blocking_age: Duration,
}

/// What a store's healer tells about its work. The daemon's is the store's
/// [`Series`] (through its [`super::Health`]); a test may record instead.
/// The healer touches no metric but through this.
pub trait Observer: Send + Sync {
    /// A scan step (or the shared head reading that stood for it) took `took`.
    fn scanned(&self, took: Duration);
    /// A fill transaction ended with `outcome`, committing `rows` tombstones.
    fn filled(&self, outcome: Outcome, rows: u64);
    /// The database failed `operation`.
    fn db_error(&self, operation: Operation);
    /// The figures after a turn.
    fn gauges(&self, gauges: &Gauges);
    /// Head minus position of every row of the Checkpoints table, by id: the
    /// rows not listed are gone.
    fn checkpoint_lags(&self, lags: &[(String, i64)]);
}

/// One store's series, registered once with its `store` label, so the
/// healer loop sets handles instead of building keys every turn. Made with
/// the store's [`super::Health`]; created at zero, so `rate()` and alerts
/// see each one before its first sample, except head and contiguous
/// position, which appear with the first scan (a zero there would be a false
/// claim). [`Series::touch`] keeps them all from being dropped as idle while
/// the store is healed; the scan histogram is looked up at each scan
/// instead, so it comes back after being dropped (see [`retire_after`]).
pub struct Series {
    store: String,
    open_gaps: Gauge,
    open_gap_positions: Gauge,
    oldest_gap_age: Gauge,
    blocking_age: Gauge,
    leader: Gauge,
    dry_run: Gauge,
    tombstones: Counter,
    /// By [`Outcome`], in `Outcome::ALL`'s order.
    fills: Vec<Counter>,
    db_errors: Vec<(Operation, Counter)>,
    head: OnceLock<Gauge>,
    contiguous: OnceLock<Gauge>,
    checkpoints: Mutex<BTreeMap<String, Gauge>>,
}

impl Series {
    pub(super) fn new(store: &str) -> Self {
        let label = || (STORE_LABEL, store.to_string());
        let zero = |g: Gauge| {
            g.set(0.0);
            g
        };
        let counter = |name: &'static str, (key, value): (&'static str, &'static str)| {
            let c = metrics::counter!(name, &[(key, value.to_string()), label()]);
            c.absolute(0);
            c
        };
        let fills = Outcome::ALL
            .iter()
            .map(|o| counter(FILL_ATTEMPTS, ("outcome", o.label())))
            .collect();
        let db_errors = Operation::of_a_store()
            .map(|op| (op, counter(DB_ERRORS, ("operation", op.label()))))
            .collect();
        let tombstones = metrics::counter!(TOMBSTONES_INSERTED, &[label()]);
        tombstones.absolute(0);
        Series {
            store: store.to_string(),
            open_gaps: zero(metrics::gauge!(OPEN_GAPS, &[label()])),
            open_gap_positions: zero(metrics::gauge!(OPEN_GAP_POSITIONS, &[label()])),
            oldest_gap_age: zero(metrics::gauge!(OLDEST_GAP_AGE, &[label()])),
            blocking_age: zero(metrics::gauge!(BLOCKING_TRANSACTION_AGE, &[label()])),
            leader: zero(metrics::gauge!(LEADER, &[label()])),
            dry_run: zero(metrics::gauge!(DRY_RUN, &[label()])),
            tombstones,
            fills,
            db_errors,
            head: OnceLock::new(),
            contiguous: OnceLock::new(),
            checkpoints: Mutex::new(BTreeMap::new()),
        }
    }

    /// Marks every counter and gauge as updated, without changing a value,
    /// so the exporter keeps them ([`retire_after`]).
    pub(super) fn touch(&self) {
        let gauges = [
            &self.open_gaps,
            &self.open_gap_positions,
            &self.oldest_gap_age,
            &self.blocking_age,
            &self.leader,
            &self.dry_run,
        ];
        for g in gauges
            .into_iter()
            .chain(self.head.get())
            .chain(self.contiguous.get())
        {
            g.increment(0.0);
        }
        if let Ok(checkpoints) = self.checkpoints.lock() {
            for g in checkpoints.values() {
                g.increment(0.0);
            }
        }
        for c in self
            .fills
            .iter()
            .chain(self.db_errors.iter().map(|(_, c)| c))
            .chain([&self.tombstones])
        {
            c.increment(0);
        }
    }

    /// [`DB_ERRORS`] for `operation`: the store's own series, registered
    /// at zero, or (an operation a store does not count) made for it.
    fn db_errors(&self, operation: Operation) -> Counter {
        match self.db_errors.iter().find(|(op, _)| *op == operation) {
            Some((_, c)) => c.clone(),
            None => {
                metrics::counter!(DB_ERRORS, "operation" => operation.label(), STORE_LABEL => self.store.clone())
            }
        }
    }

    /// Forgets the lag series of every checkpoint not in `present` (its
    /// row was deleted): no longer touched, the exporter drops it after
    /// [`retire_after`] instead of exporting its last lag for ever.
    fn retain_checkpoints(&self, present: &[&str]) {
        if let Ok(mut kept) = self.checkpoints.lock() {
            kept.retain(|id, _| present.contains(&id.as_str()));
        }
    }

    /// How many checkpoints' lag series are kept.
    #[cfg(test)]
    fn checkpoint_series(&self) -> usize {
        self.checkpoints.lock().map_or(0, |kept| kept.len())
    }

    /// [`CHECKPOINT_LAG`] for one Checkpoints row (kept, so it is touched).
    fn checkpoint_lag(&self, checkpoint: &str) -> Gauge {
        let make = |c: &str| metrics::gauge!(CHECKPOINT_LAG, "checkpoint" => c.to_string(), STORE_LABEL => self.store.clone());
        match self.checkpoints.lock() {
            Ok(mut kept) => kept
                .entry(checkpoint.to_string())
                .or_insert_with_key(|c| make(c))
                .clone(),
            Err(_) => make(checkpoint),
        }
    }

    /// [`DRY_RUN`]: whether the store is healed as a dry run, so an alert
    /// can tell "no leader" from "none may lead".
    pub(super) fn set_dry_run(&self, on: bool) {
        self.dry_run.set(f64::from(u8::from(on)));
    }

    fn head(&self) -> &Gauge {
        self.head
            .get_or_init(|| metrics::gauge!(HEAD_POSITION, STORE_LABEL => self.store.clone()))
    }

    fn contiguous(&self) -> &Gauge {
        self.contiguous
            .get_or_init(|| metrics::gauge!(CONTIGUOUS_POSITION, STORE_LABEL => self.store.clone()))
    }
}

impl Observer for Series {
    fn scanned(&self, took: Duration) {
        let h: Histogram = metrics::histogram!(SCAN_DURATION, STORE_LABEL => self.store.clone());
        h.record(took.as_secs_f64());
    }

    fn filled(&self, outcome: Outcome, rows: u64) {
        self.fills[outcome as usize].increment(1);
        if outcome == Outcome::Filled {
            self.tombstones.increment(rows);
        }
    }

    fn db_error(&self, operation: Operation) {
        self.db_errors(operation).increment(1);
    }

    fn gauges(&self, g: &Gauges) {
        self.open_gaps.set(g.holes as f64);
        self.open_gap_positions.set(g.positions as f64);
        self.oldest_gap_age.set(g.oldest_age.as_secs_f64());
        self.blocking_age.set(g.blocking_age.as_secs_f64());
        self.leader.set(f64::from(u8::from(g.leader)));
        if let Some(head) = g.head {
            self.head().set(head as f64);
        }
        if let Some(contiguous) = g.contiguous {
            self.contiguous().set(contiguous as f64);
        }
    }

    fn checkpoint_lags(&self, lags: &[(String, i64)]) {
        let ids: Vec<&str> = lags.iter().map(|(id, _)| id.as_str()).collect();
        self.retain_checkpoints(&ids);
        for (id, lag) in lags {
            self.checkpoint_lag(id).set(*lag as f64);
        }
    }
}

impl fmt::Debug for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Series")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_checkpoint_s_series_is_no_longer_kept() {
        let series = Series::new("s");
        series.checkpoint_lag("a").set(1.0);
        series.checkpoint_lag("b").set(2.0);
        assert_eq!(series.checkpoint_series(), 2);
        series.retain_checkpoints(&["b"]);
        assert_eq!(series.checkpoint_series(), 1);
        series.touch();
    }

    /// The label values and HELP texts are the scrape's contract: made
    /// from the enums, they read exactly as they always have.
    #[test]
    fn label_values_and_descriptions_are_the_published_ones() {
        let labels = |all: &[&str]| all.join(",");
        let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.label()).collect();
        assert_eq!(
            labels(&outcomes),
            "filled,committed,held,open_transaction,table_locked,error"
        );
        let ops: Vec<&str> = Operation::of_a_store().map(Operation::label).collect();
        assert_eq!(
            labels(&ops),
            "start,scan,probe,fill,checkpoints,leader,watermark,transactions"
        );
        assert_eq!(Operation::Discover.label(), "discover");
        assert!(Outcome::ALL
            .iter()
            .enumerate()
            .all(|(i, o)| *o as usize == i));
        assert_eq!(
            fill_attempts_help(),
            "Fill transactions by outcome: filled, committed (an append got there), held (an open append holds a position), open_transaction (not tried: a transaction that may have drawn a due position is still open; once per fill cycle), table_locked (the table itself was locked, by DDL or LOCK TABLE: the store backs off), error."
        );
        assert_eq!(
            db_errors_help(),
            "Database errors by operation (start, scan, probe, fill, checkpoints, leader, watermark, transactions)."
        );
    }
}
