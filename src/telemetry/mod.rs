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
//! for the endpoints. The healer writes its figures through an
//! [`Observer`] (the store's [`Health`] in the daemon), never a series.
//!
//! - [`logging`]: stderr, text or JSON;
//! - [`metrics`]: the names, the [`Outcome`] and [`Operation`] label
//!   values, each store's [`Series`];
//! - [`health`]: [`Health`], [`Status`], [`CannotFill`], the [`Board`];
//! - [`http`]: the server.
//!
//! Architecture invariant: metric names and label values never carry a
//! connection string, and neither does `/status` (database errors are
//! scrubbed where they are made); the names here are the public contract the
//! dashboard and alert rules in deploy/ rely on (a test scrapes the binary
//! and checks).

pub mod health;
pub mod http;
pub mod logging;
pub mod metrics;

pub use self::metrics::{
    discovery_errors, install_metrics, retire_after, Gauges, Observer, Operation, Outcome, Series,
    BUILD_INFO, CHECKPOINT_LAG, CONTIGUOUS_POSITION, DB_ERRORS, FILL_ATTEMPTS, HEAD_POSITION,
    LEADER, OLDEST_GAP_AGE, OPEN_GAPS, OPEN_GAP_POSITIONS, SCAN_DURATION, STORES, STORE_LABEL,
    TOMBSTONES_INSERTED,
};
pub use health::{Board, CannotFill, Health, Status};
pub use http::{bind, ENDPOINTS};
pub use logging::init_logging;
