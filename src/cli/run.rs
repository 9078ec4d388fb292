//! `gap-healer run`: the daemon. Every store heals in [`crate::fleet::run`]
//! behind the HTTP endpoints, until a signal or until every store has ended.

use tracing::info;

use super::{Failure, EXIT_INCOMPLETE, EXIT_OK};
use crate::config::{self, Settings, Store};
use crate::fleet::{self, Outcome};
use crate::telemetry::{self, Board};

/// How long the endpoints get to finish their answers once the daemon stops.
const SERVER_STOP: std::time::Duration = std::time::Duration::from_millis(300);

pub(super) const RUN_EXIT: &str = "\
Exit codes:
  0  stopped by SIGTERM or SIGINT (the fill in flight drains within 2 s)
  2  bad usage or configuration (before connecting), or start_from above the head of a table with events
  3  every scan failed for give_up_after, or metrics_addr cannot be bound

With NOTIFY_SOCKET set (systemd Type=notify), READY=1 is sent once the HTTP endpoints listen.";

/// Serves the HTTP endpoints and heals every store until a signal, or
/// until every store has ended: the exit code says which end.
pub(super) async fn daemon(settings: &Settings) -> Result<u8, Failure> {
    let stop = crate::shutdown::on_signal()
        .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
    let longest_poll = settings
        .stores
        .iter()
        .map(|s| s.poll_interval)
        .chain(settings.sets.iter().map(|s| s.template.poll_interval))
        .max()
        .unwrap_or_default();
    let metrics = telemetry::install_metrics(telemetry::retire_after(longest_poll))?;
    let board = Board::new();
    let (addr, server) = telemetry::bind(
        settings.daemon.metrics_addr,
        metrics,
        board.clone(),
        stop.clone(),
    )
    .await?;
    let names: Vec<&str> = settings.stores.iter().map(|s| s.name.as_str()).collect();
    info!(addr = %addr, stores = %names.join(","), "gap-healer listening on {addr}");
    let mut server = tokio::spawn(server);
    // Ready for systemd once the endpoints answer: a store's database may
    // be down for long (the daemon waits for it, /readyz says why), and a
    // start that waited for it would fail the unit at TimeoutStartSec.
    crate::systemd::ready(&format!(
        "serving /metrics, /healthz, /readyz, /status on {addr}; healing {} store(s) and {} store set(s)",
        settings.stores.len(),
        settings.sets.len()
    ));
    let ended = fleet::run(settings, board, stop.clone()).await;
    crate::systemd::stopping();
    stop.cancel();
    // The server stops with the token; one that does not within
    // SERVER_STOP is aborted and awaited, never left running detached.
    match tokio::time::timeout(SERVER_STOP, &mut server).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "metrics server stopped with an error"),
        Err(_) => {
            tracing::warn!("metrics server did not stop in time: aborted");
            server.abort();
            let _ = server.await;
        }
        _ => {}
    }
    Ok(match ended {
        Outcome::Stopped => EXIT_OK,
        Outcome::GaveUp { .. } => EXIT_INCOMPLETE,
        // The store that refused, handed back by its own task: no lookup
        // by name that could miss it and name another.
        Outcome::StartAboveHead(refused) => {
            let fleet::Refused { store, from, head } = *refused;
            return Err(start_above_head(&store, settings.fleet, from, head).into());
        }
    })
}

/// `run` refuses a `start_from` above the head of a table with events, as a
/// configuration problem (exit 2) naming the key, its value and origin.
fn start_above_head(settings: &Store, fleet: bool, from: i64, head: i64) -> config::ConfigError {
    let origin = settings
        .origins
        .iter()
        .find(|(key, _)| *key == "start_from")
        .map_or("default", |(_, origin)| origin.as_str());
    config::ConfigError {
        problems: vec![config::Problem {
            key: "start_from".into(),
            value: Some(settings.start_from.to_string()),
            origin: origin.into(),
            message: format!(
                "the scan would start at {from}, above the head {head} of {} (a table with events): no hole at or below {head} would ever be examined; give a position of at most {}, or head, or checkpoints",
                settings.store.profile.qualified(&settings.store.schema).name(),
                head + 1
            ),
            store: fleet.then(|| settings.name.to_string()),
        }],
    }
}
