//! Each store's [`Health`] (liveness, readiness, `/status` figures, whether
//! it may lead) and the [`Board`] that holds every store's for the
//! endpoints.
//!
//! Invariant: nothing here carries a connection string (database errors
//! are scrubbed where they are made).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use metrics::Counter;

use super::metrics::{self as m, Gauges, Observer, Operation, Outcome, Series, StoreState};
use crate::config::StoreName;

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
    store: StoreName,
    /// The store's series, written through [`Observer`].
    series: Series,
    epoch: Instant,
    last_loop_ms: AtomicU64,
    /// `u64::MAX` before the first completed scan.
    last_scan_ms: AtomicU64,
    /// When the scans started failing; `u64::MAX` while they succeed.
    failing_since_ms: AtomicU64,
    /// A fill was refused for good (no rights, a shape it must not fill)
    /// since the last fill that succeeded: this healer cannot fill.
    fill_refused: AtomicBool,
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
    /// See [`m::CONTIGUOUS_POSITION`].
    pub watermark: Option<i64>,
    pub last_error: Option<String>,
    /// Why the watermark could not be read or published, until it is
    /// published again (`None`: it is, or none is configured).
    pub watermark_error: Option<String>,
}

impl Health {
    /// The health of the store called `default` ([`StoreName::default`]).
    pub fn new(poll_interval: Duration, lock_timeout: Duration) -> Arc<Self> {
        Self::for_store(&StoreName::default(), poll_interval, lock_timeout)
    }

    pub fn for_store(
        store: &StoreName,
        poll_interval: Duration,
        lock_timeout: Duration,
    ) -> Arc<Self> {
        // One failed scan is a blip; several polls' worth is an outage.
        let fail_grace = (poll_interval * 5).max(Duration::from_secs(3));
        Arc::new(Self::build(store, poll_interval, lock_timeout, fail_grace))
    }

    fn build(
        store: &StoreName,
        poll_interval: Duration,
        lock_timeout: Duration,
        fail_grace: Duration,
    ) -> Self {
        Health {
            store: store.clone(),
            series: Series::new(store.as_str()),
            epoch: Instant::now(),
            last_loop_ms: AtomicU64::new(0),
            last_scan_ms: AtomicU64::new(u64::MAX),
            failing_since_ms: AtomicU64::new(u64::MAX),
            fill_refused: AtomicBool::new(false),
            status: Mutex::new(Status::default()),
            // A fill may wait on lock timeouts for a while; the loop is only
            // dead when it stops turning for much longer than that.
            live_within: Duration::from_secs(60) + poll_interval * 4 + lock_timeout * 8,
            ready_within: Duration::from_secs(30) + poll_interval * 5,
            fail_grace,
        }
    }

    /// Says in the store's series whether it is healed as a dry run.
    pub fn dry_run(&self, on: bool) {
        self.series.set_dry_run(on);
    }

    /// The store's name, the `store` label of its series.
    pub fn store(&self) -> &StoreName {
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

    /// Where the store stands: starting (no scan has ended yet, none
    /// failed), healthy (its last scan succeeded) or failing.
    pub fn state(&self) -> StoreState {
        let never_scanned = self.last_scan_ms.load(Ordering::Relaxed) == u64::MAX;
        let failing = self.failing_since_ms.load(Ordering::Relaxed) != u64::MAX;
        match (never_scanned, failing) {
            (_, true) => StoreState::Failing,
            (true, false) => StoreState::Starting,
            (false, false) => StoreState::Healthy,
        }
    }

    /// Its last scan failed (and none has succeeded since), or none has
    /// ended yet: it cannot fill.
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
                "store {}: no scan has completed since start (starting: the first is under way){}",
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

/// A store's health is where its healer's figures go: into its series.
impl Observer for Health {
    fn scanned(&self, took: Duration) {
        self.series.scanned(took);
    }

    fn filled(&self, outcome: Outcome, rows: u64) {
        self.series.filled(outcome, rows);
    }

    fn db_error(&self, operation: Operation) {
        self.series.db_error(operation);
    }

    fn gauges(&self, gauges: &Gauges) {
        self.series.gauges(gauges);
    }

    fn checkpoint_lags(&self, lags: &[(String, i64)]) {
        self.series.checkpoint_lags(lags);
    }
}

/// Every store's [`Health`], for the endpoints; stores come and go, and a
/// store taken off the board loses its series ([`m::retire_after`]).
#[derive(Debug, Default)]
pub struct Board {
    stores: RwLock<BTreeMap<StoreName, Arc<Health>>>,
    /// Series of the daemon's own (a store set's discovery errors), kept
    /// like the stores'.
    kept: Mutex<Vec<Counter>>,
    /// The configured stores are on the board ([`Board::open`]): before,
    /// an empty board is a daemon still starting, not one with nothing to
    /// wait for.
    open: AtomicBool,
}

impl Board {
    pub fn new() -> Arc<Self> {
        Arc::new(Board::default())
    }

    pub fn add(&self, health: Arc<Health>) {
        if let Ok(mut stores) = self.stores.write() {
            stores.insert(health.store().clone(), health);
        }
    }

    pub fn remove(&self, store: &StoreName) {
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
    /// [`m::retire_after`]. Called before every render.
    pub(super) fn touch(&self) {
        self.each(|h| h.series.touch());
        if let Ok(kept) = self.kept.lock() {
            for c in kept.iter() {
                c.increment(0);
            }
        }
        m::build_info().set(1.0);
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
            v["store"] = h.store().as_str().into();
            v["state"] = h.state().label().into();
            v["ready"] = h.ready().is_ok().into();
            v
        });
        serde_json::json!({ "stores": stores })
    }

    /// Sets [`m::STORES`] from the stores' states.
    pub(super) fn count_states(&self) {
        let states = self.each(Health::state);
        m::count_stores(|state| states.iter().filter(|s| **s == state).count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> StoreName {
        StoreName::parse(s).unwrap()
    }

    /// Issue 27: while its first scan ran, a store was `failing` in
    /// `/status` and `gap_healer_stores`: every restart looked like a
    /// failure. It is `starting` until a scan ends.
    #[test]
    fn a_store_is_starting_until_its_first_scan_ends() {
        let board = Board::new();
        let h = Health::for_store(
            &name("s"),
            Duration::from_millis(250),
            Duration::from_secs(2),
        );
        board.add(h.clone());
        board.open();
        assert_eq!(h.state(), StoreState::Starting);
        assert_eq!(board.status()["stores"][0]["state"], "starting");
        let why = board.ready().unwrap_err();
        assert!(
            why.contains("store s: no scan has completed since start (starting:"),
            "{why}"
        );
        assert!(h.cannot_fill().is_some(), "it does not lead before a scan");
        h.scan_completed();
        assert_eq!(h.state(), StoreState::Healthy);
        assert_eq!(board.status()["stores"][0]["state"], "healthy");
        h.scan_failed("boom");
        assert_eq!(h.state(), StoreState::Failing);
        let never = Health::for_store(
            &name("t"),
            Duration::from_millis(250),
            Duration::from_secs(2),
        );
        never.scan_failed("refused");
        assert_eq!(
            never.state(),
            StoreState::Failing,
            "a first scan that failed"
        );
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
            &StoreName::default(),
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
            Health::for_store(
                &name("a"),
                Duration::from_millis(250),
                Duration::from_secs(2),
            ),
            Health::for_store(
                &name("b"),
                Duration::from_millis(250),
                Duration::from_secs(2),
            ),
        );
        board.add(a.clone());
        board.add(b.clone());
        a.scan_completed();
        b.scan_completed();
        let why = board.ready().unwrap_err();
        assert!(why.starts_with("starting"), "not open yet: {why}");
        board.open();
        let b = Health::for_store(
            &name("b"),
            Duration::from_millis(250),
            Duration::from_secs(2),
        );
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
        board.remove(&name("b"));
        assert_eq!(board.status()["stores"].as_array().unwrap().len(), 1);
    }
}
