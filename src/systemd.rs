//! systemd's readiness protocol (`Type=notify`): `READY=1` once the HTTP
//! endpoints listen, `STOPPING=1` when a stop begins. Without
//! `NOTIFY_SOCKET` (not started by systemd as `Type=notify`) nothing is
//! sent.
//!
//! Ready means serving, not healed: a store's database may be down for
//! long, and the daemon waits for it (its `/readyz` says why); a start
//! that waited for every store's first scan would fail the unit at
//! `TimeoutStartSec` and restart it for nothing.

use sd_notify::NotifyState;

/// `READY=1`, with `status` as the unit's status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `STOPPING=1`.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
    }
}
