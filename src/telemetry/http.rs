//! The HTTP server: `/metrics`, `/healthz`, `/readyz`, `/status`, and `/`
//! linking them.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::Board;

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
