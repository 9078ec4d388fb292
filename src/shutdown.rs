//! SIGTERM and SIGINT become one cancellation token that every wait selects on.

use std::sync::atomic::{AtomicI32, Ordering};

use tokio_util::sync::CancellationToken;

/// The first SIGTERM or SIGINT this process received (0: none yet).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// A signal that stops gap-healer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Term,
    Int,
}

impl Stop {
    /// Its name, as `kill -l` says it.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Term => "SIGTERM",
            Stop::Int => "SIGINT",
        }
    }

    /// 128 + the signal's number: what a shell reports for a process the
    /// signal's default action ended (143, 130), so a supervisor or script
    /// reads a command that stopped on it as it would read one killed by it.
    pub fn exit_code(self) -> u8 {
        128 + self.number() as u8
    }

    fn number(self) -> i32 {
        match self {
            Stop::Term => 15,
            Stop::Int => 2,
        }
    }
}

/// The first stopping signal received, if any (process-wide: a one-shot
/// command over a fleet stops at the store it was on, and does not go on).
pub fn received() -> Option<Stop> {
    match RECEIVED.load(Ordering::Relaxed) {
        15 => Some(Stop::Term),
        2 => Some(Stop::Int),
        _ => None,
    }
}

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
        let first = tokio::select! {
            _ = term.recv() => Stop::Term,
            _ = int.recv() => Stop::Int,
        };
        let _ = RECEIVED.compare_exchange(0, first.number(), Ordering::Relaxed, Ordering::Relaxed);
        tracing::info!(
            signal = first.name(),
            "shutting down: finishing the fill in flight, then exiting"
        );
        cancel.cancel();
        let second = tokio::select! {
            _ = term.recv() => Stop::Term,
            _ = int.recv() => Stop::Int,
        };
        tracing::warn!(signal = second.name(), "second signal: exiting at once");
        std::process::exit(second.exit_code().into());
    });
    Ok(token)
}
