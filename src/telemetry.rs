//! Logs, metrics, and the HTTP endpoints operators and Kubernetes read.
//!
//! - `GET /metrics`: Prometheus text exposition of the names below.
//! - `GET /healthz`: 200 while the healer loop keeps turning (liveness).
//! - `GET /readyz`: 200 when the database answered and a scan completed
//!   recently (readiness); 503 otherwise, with the reason.
//!
//! Architecture invariant: metric names and label values never carry a
//! connection string; the names here are the public contract the dashboard
//! and alert rules in deploy/ rely on (a test scrapes the binary and checks).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::config::LogFormat;

pub const OPEN_GAPS: &str = "gap_healer_open_gaps";
pub const OPEN_GAP_POSITIONS: &str = "gap_healer_open_gap_positions";
pub const OLDEST_GAP_AGE: &str = "gap_healer_oldest_gap_age_seconds";
pub const TOMBSTONES_INSERTED: &str = "gap_healer_tombstones_inserted_total";
pub const FILL_ATTEMPTS: &str = "gap_healer_fill_attempts_total";
pub const SCAN_DURATION: &str = "gap_healer_scan_duration_seconds";
pub const HEAD_POSITION: &str = "gap_healer_head_position";
pub const WATERMARK_POSITION: &str = "gap_healer_watermark_position";
pub const LEADER: &str = "gap_healer_leader";
pub const DB_ERRORS: &str = "gap_healer_db_errors_total";
pub const CHECKPOINT_LAG: &str = "gap_healer_checkpoint_lag_positions";
pub const BUILD_INFO: &str = "gap_healer_build_info";

/// The `operation` label values of [`DB_ERRORS`], exported from the start so
/// `rate()` and alerts see a series before the first error.
pub const DB_OPERATIONS: &[&str] = &["start", "scan", "probe", "fill", "checkpoints", "leader"];

const SCAN_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the global Prometheus recorder and describes every metric, so
/// each has a HELP line before its first sample.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets(SCAN_BUCKETS)
        .map_err(|e| anyhow::anyhow!("histogram buckets: {e}"))?
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
    describe_counter!(FILL_ATTEMPTS, "Fill transactions by outcome: filled, committed (an append got there), held (an open append holds a position), error.");
    describe_histogram!(
        SCAN_DURATION,
        Unit::Seconds,
        "Time of one scan step: reading new positions and re-checking tracked holes."
    );
    describe_gauge!(HEAD_POSITION, "Highest committed global position seen.");
    describe_gauge!(
        WATERMARK_POSITION,
        "Every position at or below this one is an event or a tombstone (from the scan start on)."
    );
    describe_gauge!(
        LEADER,
        "1 while this process may fill, 0 while it only watches."
    );
    describe_counter!(
        DB_ERRORS,
        "Database errors by operation (start, scan, probe, fill, checkpoints, leader)."
    );
    describe_gauge!(
        CHECKPOINT_LAG,
        "Head position minus the position of each row of the Checkpoints table."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label tells which build runs."
    );
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    metrics::gauge!(LEADER).set(0.0);
    metrics::gauge!(OPEN_GAPS).set(0.0);
    metrics::gauge!(OPEN_GAP_POSITIONS).set(0.0);
    metrics::gauge!(OLDEST_GAP_AGE).set(0.0);
    metrics::counter!(TOMBSTONES_INSERTED).absolute(0);
    for outcome in ["filled", "committed", "held", "error"] {
        metrics::counter!(FILL_ATTEMPTS, "outcome" => outcome).absolute(0);
    }
    for operation in DB_OPERATIONS {
        metrics::counter!(DB_ERRORS, "operation" => *operation).absolute(0);
    }
    Ok(handle)
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

/// What the probes report, written by the healer loop.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    last_loop_ms: AtomicU64,
    last_scan_ms: AtomicU64,
    db_ok: AtomicBool,
    live_within: Duration,
    ready_within: Duration,
}

impl Health {
    pub fn new(poll_interval: Duration, lock_timeout: Duration) -> Arc<Self> {
        Arc::new(Health {
            epoch: Instant::now(),
            last_loop_ms: AtomicU64::new(0),
            last_scan_ms: AtomicU64::new(u64::MAX),
            db_ok: AtomicBool::new(false),
            // A fill may wait on lock timeouts for a while; the loop is only
            // dead when it stops turning for much longer than that.
            live_within: Duration::from_secs(60) + poll_interval * 4 + lock_timeout * 8,
            ready_within: Duration::from_secs(30) + poll_interval * 5,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn loop_turned(&self) {
        self.last_loop_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    pub fn scan_completed(&self) {
        self.last_scan_ms.store(self.now_ms(), Ordering::Relaxed);
        self.db_ok.store(true, Ordering::Relaxed);
    }

    pub fn db_failed(&self) {
        self.db_ok.store(false, Ordering::Relaxed);
    }

    pub fn live(&self) -> Result<(), String> {
        let idle = self
            .now_ms()
            .saturating_sub(self.last_loop_ms.load(Ordering::Relaxed));
        if Duration::from_millis(idle) <= self.live_within {
            Ok(())
        } else {
            Err(format!("the healer loop has not turned for {idle} ms"))
        }
    }

    pub fn ready(&self) -> Result<(), String> {
        if !self.db_ok.load(Ordering::Relaxed) {
            return Err("the database is not reachable (or no scan has succeeded yet)".into());
        }
        let last = self.last_scan_ms.load(Ordering::Relaxed);
        let age = self.now_ms().saturating_sub(last);
        if last == u64::MAX || Duration::from_millis(age) > self.ready_within {
            return Err(format!("no scan completed for {age} ms"));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// Binds `addr` (fails loudly: a daemon whose metrics silently vanish is worse
/// than one that does not start) and returns the bound address and the server.
pub async fn bind(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
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
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health });
    let server = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    };
    Ok((local, server))
}

async fn metrics_handler(
    State(s): State<AppState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
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
    match s.health.live() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.health.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
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
        h.db_failed();
        assert!(h.ready().unwrap_err().contains("database"));
    }
}
