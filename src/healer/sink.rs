//! Where a healer reports: [`Sink`], the one place its figures (the
//! store's series, through the [`Observer`]) and its status (`/status`,
//! readiness, whether it may lead: the store's [`Health`]) go.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::DbError;
use crate::telemetry::{Gauges, Health, Observer, Operation, Outcome, Status};

/// A healer's figures and status, reported in one place.
pub struct Sink {
    health: Arc<Health>,
    /// The store's series unless told otherwise ([`Sink::observed_by`]).
    observer: Arc<dyn Observer>,
}

impl Sink {
    pub(super) fn new(health: Arc<Health>) -> Self {
        Sink {
            observer: health.clone(),
            health,
        }
    }

    /// The figures go to `observer` instead of the store's series.
    pub(super) fn observed_by(&mut self, observer: Arc<dyn Observer>) {
        self.observer = observer;
    }

    /// The store's health, as the endpoints read it.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    pub(super) fn loop_turned(&self) {
        self.health.loop_turned();
    }

    /// A poll read the store (its own scan, or the shared head reading
    /// that stood for it) in `took`.
    pub(super) fn scanned(&self, took: Duration) {
        self.observer.scanned(took);
        self.health.scan_completed();
    }

    /// A poll's scan (or the start, before the first) failed.
    pub(super) fn scan_failed(&self, operation: Operation, e: &DbError) {
        self.db_error(operation, e);
        self.health.scan_failed(&e.message);
    }

    /// The database failed `operation`: counted, and the store's last error.
    pub(super) fn db_error(&self, operation: Operation, e: &DbError) {
        self.observer.db_error(operation);
        self.health.record_error(&e.in_words(operation.label()));
    }

    /// A fill cycle's statement, or its deferral, ended with `outcome`.
    pub(super) fn filled(&self, outcome: Outcome, rows: u64) {
        self.observer.filled(outcome, rows);
    }

    /// A fill succeeded: a refusal before it no longer keeps this healer
    /// from leading.
    pub(super) fn fills_work(&self) {
        self.health.forget_fill_refusal();
    }

    /// A fill was refused in a way retrying will not mend: this healer
    /// does not lead until a fill succeeds.
    pub(super) fn fill_refused(&self, e: &DbError) {
        self.health.fill_refused(&e.in_words("fill"));
    }

    /// The store's table is locked (DDL, an index build).
    pub(super) fn table_locked(&self) {
        self.health.record_error(
            "fill: the table is locked by another session (DDL, CREATE INDEX, LOCK TABLE)",
        );
    }

    pub(super) fn watermark_published(&self) {
        self.health.watermark_published();
    }

    /// Reading (`what`: "read") or publishing ("publish") the watermark failed.
    pub(super) fn watermark_failed(&self, what: &str, e: &DbError) {
        self.db_error(Operation::Watermark, e);
        self.health.watermark_failed(&e.in_words(what));
    }

    pub(super) fn checkpoint_lags(&self, lags: &[(String, i64)]) {
        self.observer.checkpoint_lags(lags);
    }

    /// The figures after a turn: the gauges, and `/status`'s.
    pub(super) fn figures(&self, gauges: &Gauges, status: Status) {
        self.observer.gauges(gauges);
        self.health.update(status);
    }
}
