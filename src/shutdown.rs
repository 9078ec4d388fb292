//! SIGTERM and SIGINT become one cancellation token that every wait selects on.

use tokio_util::sync::CancellationToken;

/// Cancels the returned token on the first SIGTERM or SIGINT. A second signal
/// is left to the default handler's effect through a hard exit, so an operator
/// can always stop a stuck process.
pub fn on_signal() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            "shutting down: finishing the fill in flight, then exiting"
        );
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130);
    });
    Ok(token)
}
