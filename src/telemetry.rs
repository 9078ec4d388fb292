//! Logs, metrics, and the HTTP endpoints operators and Kubernetes read.
//!
//! - `GET /metrics`: Prometheus text exposition of the names below; every
//!   `gap_healer_*` series but the build info carries a `store` label.
//! - `GET /healthz`: 200 while every store's healer loop keeps turning (liveness).
//! - `GET /readyz`: 200 when every store has completed a scan since start and
//!   none has failed every scan for longer than its own grace (readiness);
//!   503 otherwise, with the reasons.
//! - `GET /status`: JSON per store: leader, open holes, head, watermark,
//!   last error.
//! - `GET /`: a page linking the four; any other path a 404 naming them.
//!
//! Each store reports into its own [`Health`]; the [`Board`] holds them all
//! for the endpoints.
//!
//! Architecture invariant: metric names and label values never carry a
//! connection string, and neither does `/status` (database errors are
//! scrubbed where they are made); the names here are the public contract the
//! dashboard and alert rules in deploy/ rely on (a test scrapes the binary
//! and checks).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics::{
    describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio_util::sync::CancellationToken;

use crate::config::LogFormat;

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

/// The label every per-store series carries.
pub const STORE_LABEL: &str = "store";

/// The `operation` label values of [`DB_ERRORS`], exported from the start so
/// `rate()` and alerts see a series before the first error.
pub const DB_OPERATIONS: &[&str] = &[
    "start",
    "scan",
    "probe",
    "fill",
    "checkpoints",
    "leader",
    "watermark",
];

const SCAN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How long a series may go unchanged before the exporter drops it: the
/// exporter's `idle_timeout`, the removal it supports. A store's counters
/// and gauges are touched at every scrape while it is on the [`Board`]
/// ([`Board::touch`]), so only a store that was let go (its database
/// dropped) loses them, at the first scrape this long after its last
/// update. The scan-duration histogram cannot be touched without a sample:
/// a store that completes no scan for this long (down, or one long fill
/// cycle) drops it until its next scan, which starts it again from zero.
/// At least 15 s, and 4 of the longest poll interval.
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
    describe_counter!(FILL_ATTEMPTS, "Fill transactions by outcome: filled, committed (an append got there), held (an open append holds a position), writer_waiting (another writer of the table was waiting for a lock, perhaps with a position drawn and no key yet: nothing written), table_locked (the table itself was locked, by DDL or LOCK TABLE: the store backs off), error.");
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
    describe_counter!(
        DB_ERRORS,
        "Database errors by operation (start, scan, probe, fill, checkpoints, leader, watermark)."
    );
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
        "Stores this process heals, by state: healthy (its last scan succeeded) or failing."
    );
    describe_gauge!(
        CONTIGUOUS_POSITION,
        "The highest position at or below which every position, from the scan's start on, is a committed event or a tombstone."
    );
    build_info().set(1.0);
    Ok(handle)
}

fn build_info() -> Gauge {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"))
}

/// The `outcome` label values of [`FILL_ATTEMPTS`], in [`Series::fill`]'s order.
const FILL_OUTCOMES: [&str; 6] = [
    "filled",
    "committed",
    "held",
    "writer_waiting",
    "table_locked",
    "error",
];

/// One store's series, registered once with its `store` label, so the
/// healer loop sets handles instead of building keys every turn. Made with
/// the store's [`Health`]; created at zero, so `rate()` and alerts see each
/// one before its first sample, except head and contiguous position, which
/// appear with the first scan (a zero there would be a false claim).
/// [`Series::touch`] keeps them all from being dropped as idle while the
/// store is healed; the scan histogram is looked up at each scan instead,
/// so it comes back after being dropped (see [`retire_after`]).
pub struct Series {
    store: String,
    pub open_gaps: Gauge,
    pub open_gap_positions: Gauge,
    pub oldest_gap_age: Gauge,
    pub leader: Gauge,
    pub tombstones: Counter,
    fills: [Counter; 6],
    db_errors: Vec<(&'static str, Counter)>,
    head: OnceLock<Gauge>,
    contiguous: OnceLock<Gauge>,
    checkpoints: Mutex<BTreeMap<String, Gauge>>,
}

impl Series {
    fn new(store: &str) -> Self {
        let label = || (STORE_LABEL, store.to_string());
        let zero = |g: Gauge| {
            g.set(0.0);
            g
        };
        let fills = FILL_OUTCOMES.map(|outcome| {
            let c = metrics::counter!(FILL_ATTEMPTS, &[("outcome", outcome.to_string()), label()]);
            c.absolute(0);
            c
        });
        let db_errors = DB_OPERATIONS
            .iter()
            .map(|operation| {
                let c =
                    metrics::counter!(DB_ERRORS, &[("operation", operation.to_string()), label()]);
                c.absolute(0);
                (*operation, c)
            })
            .collect();
        let tombstones = metrics::counter!(TOMBSTONES_INSERTED, &[label()]);
        tombstones.absolute(0);
        Series {
            store: store.to_string(),
            open_gaps: zero(metrics::gauge!(OPEN_GAPS, &[label()])),
            open_gap_positions: zero(metrics::gauge!(OPEN_GAP_POSITIONS, &[label()])),
            oldest_gap_age: zero(metrics::gauge!(OLDEST_GAP_AGE, &[label()])),
            leader: zero(metrics::gauge!(LEADER, &[label()])),
            tombstones,
            fills,
            db_errors,
            head: OnceLock::new(),
            contiguous: OnceLock::new(),
            checkpoints: Mutex::new(BTreeMap::new()),
        }
    }

    /// [`SCAN_DURATION`]: one scan step took `seconds`.
    pub fn scan_took(&self, seconds: f64) {
        let h: Histogram = metrics::histogram!(SCAN_DURATION, STORE_LABEL => self.store.clone());
        h.record(seconds);
    }

    /// Marks every counter and gauge as updated, without changing a value,
    /// so the exporter keeps them ([`retire_after`]).
    fn touch(&self) {
        let gauges = [
            &self.open_gaps,
            &self.open_gap_positions,
            &self.oldest_gap_age,
            &self.leader,
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

    /// [`FILL_ATTEMPTS`] for `outcome` (one of `filled`, `committed`,
    /// `held`, `writer_waiting`, `table_locked`, `error`).
    pub fn fill(&self, outcome: &str) -> &Counter {
        let i = FILL_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(FILL_OUTCOMES.len() - 1);
        &self.fills[i]
    }

    /// [`DB_ERRORS`] for `operation`.
    pub fn db_error(&self, operation: &'static str) -> Counter {
        match self.db_errors.iter().find(|(op, _)| *op == operation) {
            Some((_, c)) => c.clone(),
            None => {
                metrics::counter!(DB_ERRORS, "operation" => operation, STORE_LABEL => self.store.clone())
            }
        }
    }

    /// [`CHECKPOINT_LAG`] for one Checkpoints row (kept, so it is touched).
    /// Forgets the lag series of every checkpoint not in `present` (its
    /// row was deleted): no longer touched, the exporter drops it after
    /// [`retire_after`] instead of exporting its last lag for ever.
    pub fn retain_checkpoints(&self, present: &[String]) {
        if let Ok(mut kept) = self.checkpoints.lock() {
            kept.retain(|id, _| present.contains(id));
        }
    }

    /// How many checkpoints' lag series are kept.
    pub fn checkpoint_series(&self) -> usize {
        self.checkpoints.lock().map_or(0, |kept| kept.len())
    }

    pub fn checkpoint_lag(&self, checkpoint: String) -> Gauge {
        let make = |c: &str| metrics::gauge!(CHECKPOINT_LAG, "checkpoint" => c.to_string(), STORE_LABEL => self.store.clone());
        match self.checkpoints.lock() {
            Ok(mut kept) => kept
                .entry(checkpoint)
                .or_insert_with_key(|c| make(c))
                .clone(),
            Err(_) => make(&checkpoint),
        }
    }

    pub fn head(&self) -> &Gauge {
        self.head
            .get_or_init(|| metrics::gauge!(HEAD_POSITION, STORE_LABEL => self.store.clone()))
    }

    pub fn contiguous(&self) -> &Gauge {
        self.contiguous
            .get_or_init(|| metrics::gauge!(CONTIGUOUS_POSITION, STORE_LABEL => self.store.clone()))
    }
}

impl fmt::Debug for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Series")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Starts logging to stderr. `RUST_LOG`, when set, overrides `level`.
pub fn init_logging(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    // tiberius logs every transaction at INFO and every server error (our
    // expected 2627/1222 refusals included) at ERROR; the engine reports each
    // real failure itself, with context. RUST_LOG=tiberius=debug brings it back.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("tiberius=off,{level}")));
    let colour = use_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Colour in text logs only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>): journald,
/// `kubectl logs` and files get plain text.
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Why a healer cannot fill its store (and so stays out of the election).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CannotFill {
    /// It has not scanned yet: it starts as a follower.
    NotScannedYet,
    /// Its scans fail (the error).
    ScansFail(String),
    /// A fill was refused for good (the error).
    FillsRefused(String),
}

impl std::fmt::Display for CannotFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CannotFill::NotScannedYet => f.write_str("no scan has succeeded yet"),
            CannotFill::ScansFail(e) => write!(f, "its scans fail: {e}"),
            CannotFill::FillsRefused(e) => write!(f, "its fills are refused: {e}"),
        }
    }
}

/// What one store reports: written by its healer loop, read by the
/// endpoints.
#[derive(Debug)]
pub struct Health {
    store: String,
    /// The store's series, for the healer loop.
    pub series: Series,
    epoch: Instant,
    last_loop_ms: AtomicU64,
    /// `u64::MAX` before the first completed scan.
    last_scan_ms: AtomicU64,
    /// When the scans started failing; `u64::MAX` while they succeed.
    failing_since_ms: AtomicU64,
    /// A fill was refused for good (no rights, a shape it must not fill)
    /// since the last fill that succeeded: this healer cannot fill.
    fill_refused: std::sync::atomic::AtomicBool,
    status: Mutex<Status>,
    live_within: Duration,
    ready_within: Duration,
    /// How long the scans may fail before the store counts against readiness.
    fail_grace: Duration,
}

/// A store's figures for `/status`; free of secrets (database errors are
/// scrubbed where they are made).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Status {
    pub leader: bool,
    pub open_holes: u64,
    pub open_positions: u64,
    pub head: Option<i64>,
    /// See [`CONTIGUOUS_POSITION`].
    pub watermark: Option<i64>,
    pub last_error: Option<String>,
    /// Why the watermark could not be read or published, until it is
    /// published again (`None`: it is, or none is configured).
    pub watermark_error: Option<String>,
}

impl Health {
    /// The health of the store called [`crate::config`]'s `default`.
    pub fn new(poll_interval: Duration, lock_timeout: Duration) -> Arc<Self> {
        Self::for_store("default", poll_interval, lock_timeout)
    }

    pub fn for_store(store: &str, poll_interval: Duration, lock_timeout: Duration) -> Arc<Self> {
        // One failed scan is a blip; several polls' worth is an outage.
        let fail_grace = (poll_interval * 5).max(Duration::from_secs(3));
        Arc::new(Self::build(store, poll_interval, lock_timeout, fail_grace))
    }

    fn build(
        store: &str,
        poll_interval: Duration,
        lock_timeout: Duration,
        fail_grace: Duration,
    ) -> Self {
        Health {
            store: store.to_string(),
            series: Series::new(store),
            epoch: Instant::now(),
            last_loop_ms: AtomicU64::new(0),
            last_scan_ms: AtomicU64::new(u64::MAX),
            failing_since_ms: AtomicU64::new(u64::MAX),
            fill_refused: std::sync::atomic::AtomicBool::new(false),
            status: Mutex::new(Status::default()),
            // A fill may wait on lock timeouts for a while; the loop is only
            // dead when it stops turning for much longer than that.
            live_within: Duration::from_secs(60) + poll_interval * 4 + lock_timeout * 8,
            ready_within: Duration::from_secs(30) + poll_interval * 5,
            fail_grace,
        }
    }

    /// The store's name, the `store` label of its series.
    pub fn store(&self) -> &str {
        &self.store
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn loop_turned(&self) {
        self.last_loop_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    pub fn scan_completed(&self) {
        self.last_scan_ms.store(self.now_ms(), Ordering::Relaxed);
        self.failing_since_ms.store(u64::MAX, Ordering::Relaxed);
    }

    /// A scan failed with `error` (already free of secrets).
    pub fn scan_failed(&self, error: &str) {
        let now = self.now_ms();
        let _ = self.failing_since_ms.compare_exchange(
            u64::MAX,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.record_error(error);
    }

    /// Any other database error, for `/status`.
    pub fn record_error(&self, error: &str) {
        if let Ok(mut status) = self.status.lock() {
            status.last_error = Some(error.to_string());
        }
    }

    /// Replaces the figures `/status` shows (keeping the last error and
    /// the watermark's).
    pub fn update(&self, figures: Status) {
        if let Ok(mut status) = self.status.lock() {
            let last_error = status.last_error.take();
            let watermark_error = status.watermark_error.take();
            *status = Status {
                last_error,
                watermark_error,
                ..figures
            };
        }
    }

    /// The watermark could not be read or published (`error` free of
    /// secrets); healing goes on.
    pub fn watermark_failed(&self, error: &str) {
        if let Ok(mut status) = self.status.lock() {
            status.watermark_error = Some(error.to_string());
        }
    }

    pub fn watermark_published(&self) {
        if let Ok(mut status) = self.status.lock() {
            status.watermark_error = None;
        }
    }

    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// A fill failed in a way retrying will not mend (`error`, free of
    /// secrets): until a fill succeeds, this healer does not lead.
    pub fn fill_refused(&self, error: &str) {
        self.fill_refused.store(true, Ordering::Relaxed);
        self.record_error(error);
    }

    /// A fill succeeded, or the election gave the lock up for a refused
    /// one: after its next successful scan this healer may lead again (and
    /// learn whether the fill still fails).
    pub fn forget_fill_refusal(&self) {
        self.fill_refused.store(false, Ordering::Relaxed);
    }

    /// Why this healer cannot fill its store now; `None`: it can.
    pub fn cannot_fill(&self) -> Option<CannotFill> {
        let last = || self.status().last_error.unwrap_or_default();
        if self.last_scan_ms.load(Ordering::Relaxed) == u64::MAX
            && self.failing_since_ms.load(Ordering::Relaxed) == u64::MAX
        {
            return Some(CannotFill::NotScannedYet);
        }
        if self.failing() {
            return Some(CannotFill::ScansFail(last()));
        }
        if self.fill_refused.load(Ordering::Relaxed) {
            return Some(CannotFill::FillsRefused(last()));
        }
        None
    }

    /// Its last scan failed (and none has succeeded since).
    pub fn failing(&self) -> bool {
        self.failing_since_ms.load(Ordering::Relaxed) != u64::MAX
            || self.last_scan_ms.load(Ordering::Relaxed) == u64::MAX
    }

    pub fn live(&self) -> Result<(), String> {
        let idle = self
            .now_ms()
            .saturating_sub(self.last_loop_ms.load(Ordering::Relaxed));
        if Duration::from_millis(idle) <= self.live_within {
            Ok(())
        } else {
            Err(format!(
                "store {}: the healer loop has not turned for {idle} ms",
                self.store
            ))
        }
    }

    pub fn ready(&self) -> Result<(), String> {
        let now = self.now_ms();
        let error = || {
            self.status()
                .last_error
                .map_or(String::new(), |e| format!(": {e}"))
        };
        let last = self.last_scan_ms.load(Ordering::Relaxed);
        let since = self.failing_since_ms.load(Ordering::Relaxed);
        if last == u64::MAX && since != u64::MAX {
            // The database may well have answered: with a refusal.
            return Err(format!(
                "store {}: no scan has succeeded since start; every scan has failed, for {} ms (the database is not reachable, or the store is broken){}",
                self.store,
                now.saturating_sub(since),
                error()
            ));
        }
        if last == u64::MAX {
            return Err(format!(
                "store {}: no scan has completed since start (the first is under way){}",
                self.store,
                error()
            ));
        }
        if since != u64::MAX && Duration::from_millis(now.saturating_sub(since)) > self.fail_grace {
            return Err(format!(
                "store {}: every scan has failed for {} ms (the database is not reachable, or the store is broken){}",
                self.store,
                now.saturating_sub(since),
                error()
            ));
        }
        let age = now.saturating_sub(last);
        if Duration::from_millis(age) > self.ready_within {
            return Err(format!(
                "store {}: no scan completed for {age} ms",
                self.store
            ));
        }
        Ok(())
    }
}

/// Every store's [`Health`], for the endpoints; stores come and go, and a
/// store taken off the board loses its series ([`retire_after`]).
#[derive(Debug, Default)]
pub struct Board {
    stores: RwLock<BTreeMap<String, Arc<Health>>>,
    /// Series of the daemon's own (a store set's discovery errors), kept
    /// like the stores'.
    kept: Mutex<Vec<Counter>>,
    /// The configured stores are on the board ([`Board::open`]): before,
    /// an empty board is a daemon still starting, not one with nothing to
    /// wait for.
    open: std::sync::atomic::AtomicBool,
}

impl Board {
    pub fn new() -> Arc<Self> {
        Arc::new(Board::default())
    }

    pub fn add(&self, health: Arc<Health>) {
        if let Ok(mut stores) = self.stores.write() {
            stores.insert(health.store().to_string(), health);
        }
    }

    pub fn remove(&self, store: &str) {
        if let Ok(mut stores) = self.stores.write() {
            stores.remove(store);
        }
    }

    /// Keeps `counter` in the scrape as long as the process runs.
    pub fn keep(&self, counter: Counter) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.push(counter);
        }
    }

    /// Marks the series of every store on the board, and the kept ones, as
    /// updated: what is not touched is dropped once idle for
    /// [`retire_after`]. Called before every render.
    fn touch(&self) {
        self.each(|h| h.series.touch());
        if let Ok(kept) = self.kept.lock() {
            for c in kept.iter() {
                c.increment(0);
            }
        }
        build_info().set(1.0);
    }

    fn each<T>(&self, f: impl Fn(&Health) -> T) -> Vec<T> {
        self.stores
            .read()
            .map(|stores| stores.values().map(|h| f(h)).collect())
            .unwrap_or_default()
    }

    /// Every store's reason not to be live (or ready), joined.
    fn verdict(reasons: Vec<Result<(), String>>) -> Result<(), String> {
        let why: Vec<String> = reasons.into_iter().filter_map(Result::err).collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }

    pub fn live(&self) -> Result<(), String> {
        Self::verdict(self.each(Health::live))
    }

    pub fn ready(&self) -> Result<(), String> {
        if !self.open.load(Ordering::Acquire) {
            return Err("starting: the stores are not on the board yet".into());
        }
        Self::verdict(self.each(Health::ready))
    }

    /// Every configured store is on the board: readiness is theirs from
    /// now on (the HTTP server answers before they are).
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    /// `/status`: one object per store.
    pub fn status(&self) -> serde_json::Value {
        let stores: Vec<serde_json::Value> = self.each(|h| {
            let mut v = serde_json::to_value(h.status()).unwrap_or_default();
            v["store"] = h.store().into();
            v["state"] = if h.failing() { "failing" } else { "healthy" }.into();
            v["ready"] = h.ready().is_ok().into();
            v
        });
        serde_json::json!({ "stores": stores })
    }

    /// Sets [`STORES`] from the stores' states.
    fn count_states(&self) {
        let failing = self.each(Health::failing);
        let n = failing.iter().filter(|f| **f).count();
        metrics::gauge!(STORES, "state" => "failing").set(n as f64);
        metrics::gauge!(STORES, "state" => "healthy").set((failing.len() - n) as f64);
    }
}

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    board: Arc<Board>,
}

/// Binds `addr` (fails loudly: a daemon whose metrics silently vanish is worse
/// than one that does not start) and returns the bound address and the server.
pub async fn bind(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    board: Arc<Board>,
    shutdown: CancellationToken,
) -> anyhow::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on metrics_addr {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .fallback(not_found)
        .with_state(AppState { metrics, board });
    let server = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    };
    Ok((local, server))
}

/// The endpoints, as `/` lists them.
pub const ENDPOINTS: [(&str, &str); 4] = [
    ("/metrics", "Prometheus metrics, every store's series labelled store"),
    ("/healthz", "liveness: 200 while every store's healer loop turns"),
    ("/readyz", "readiness: 200 once every store has scanned and none fails all its scans; 503 with the reasons"),
    ("/status", "JSON, per store: state, leader, holes, head, watermark, last error"),
];

/// `/`: a page linking the endpoints (a browser pointed at the port finds
/// them, rather than a bare 404).
async fn index() -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let items: String = ENDPOINTS
        .iter()
        .map(|(path, what)| format!("<li><a href=\"{path}\">{path}</a>: {what}</li>\n"))
        .collect();
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        format!(
            "<!DOCTYPE html>\n<html><head><title>gap-healer</title></head><body>\n<h1>gap-healer {}</h1>\n<ul>\n{items}</ul>\n</body></html>\n",
            env!("CARGO_PKG_VERSION")
        ),
    )
}

/// Any other path: 404, naming the endpoints there are.
async fn not_found(uri: axum::http::Uri) -> (StatusCode, String) {
    let paths: Vec<&str> = ENDPOINTS.iter().map(|(p, _)| *p).collect();
    (
        StatusCode::NOT_FOUND,
        format!(
            "no endpoint {}: gap-healer serves {} (and / lists them)\n",
            uri.path(),
            paths.join(", ")
        ),
    )
}

async fn metrics_handler(
    State(s): State<AppState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    s.board.count_states();
    s.board.touch();
    s.metrics.run_upkeep();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}

async fn healthz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.board.live() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.board.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn status(
    State(s): State<AppState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        format!("{}\n", s.board.status()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new(""))));
    }

    #[test]
    fn readiness_needs_a_scan_and_the_database() {
        let h = Health::new(Duration::from_millis(250), Duration::from_secs(2));
        assert!(h.ready().is_err());
        h.loop_turned();
        assert!(h.live().is_ok());
        h.scan_completed();
        assert!(h.ready().is_ok());
        h.scan_failed("boom");
        assert!(h.ready().is_ok(), "one failed scan is within the grace");
        assert!(h.failing());
        let h = Health::build(
            "default",
            Duration::from_millis(250),
            Duration::ZERO,
            Duration::ZERO,
        );
        h.scan_completed();
        h.scan_failed("boom");
        std::thread::sleep(Duration::from_millis(5));
        let why = h.ready().unwrap_err();
        assert!(
            why.contains("store default: every scan has failed") && why.contains(": boom"),
            "{why}"
        );
        h.scan_completed();
        assert!(!h.failing());
    }

    /// A store whose database answers with a refusal says so: never "the
    /// database has not answered yet".
    #[test]
    fn readiness_before_the_first_scan_says_why() {
        let h = Health::new(Duration::from_millis(250), Duration::from_secs(2));
        let why = h.ready().unwrap_err();
        assert!(why.contains("the first is under way"), "{why}");
        h.scan_failed("permission denied for table messages (42501)");
        let why = h.ready().unwrap_err();
        assert!(
            why.starts_with("store default: no scan has succeeded since start; every scan has failed, for ")
                && why.ends_with(" ms (the database is not reachable, or the store is broken): permission denied for table messages (42501)"),
            "{why}"
        );
        assert!(!why.contains("not answered"), "{why}");
    }

    #[test]
    fn the_board_joins_every_stores_reasons() {
        let board = Board::new();
        let (a, b) = (
            Health::for_store("a", Duration::from_millis(250), Duration::from_secs(2)),
            Health::for_store("b", Duration::from_millis(250), Duration::from_secs(2)),
        );
        board.add(a.clone());
        board.add(b.clone());
        a.scan_completed();
        b.scan_completed();
        let why = board.ready().unwrap_err();
        assert!(why.starts_with("starting"), "not open yet: {why}");
        board.open();
        let b = Health::for_store("b", Duration::from_millis(250), Duration::from_secs(2));
        board.add(b.clone());
        let why = board.ready().unwrap_err();
        assert!(
            why.starts_with("store b: no scan") && !why.contains("store a"),
            "{why}"
        );
        b.scan_completed();
        assert!(board.ready().is_ok());
        a.update(Status {
            head: Some(7),
            ..Status::default()
        });
        let status = board.status();
        assert_eq!(status["stores"][0]["store"], "a");
        assert_eq!(status["stores"][0]["head"], 7);
        assert_eq!(status["stores"][1]["state"], "healthy");
        board.remove("b");
        assert_eq!(board.status()["stores"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_deleted_checkpoint_s_series_is_no_longer_kept() {
        let series = Series::new("s");
        series.checkpoint_lag("a".into()).set(1.0);
        series.checkpoint_lag("b".into()).set(2.0);
        assert_eq!(series.checkpoint_series(), 2);
        series.retain_checkpoints(&["b".to_string()]);
        assert_eq!(series.checkpoint_series(), 1);
        series.touch();
    }
}
