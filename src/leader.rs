//! Whether this process may fill now.
//!
//! The healer asks [`Leader::is_leader`] before every fill statement and never
//! fills while it is false. Followers keep scanning and exporting metrics.
//! [`Leader::always`] serves single-instance deployments
//! (`--no-leader-election`); an election keeps a [`LeaderSender`] and flips it.
//!
//! Architecture invariant: the sender is set to false before the lock that
//! justified it can be lost, never after.

use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct Leader {
    rx: watch::Receiver<bool>,
}

#[derive(Debug)]
pub struct LeaderSender {
    tx: watch::Sender<bool>,
}

impl Leader {
    /// Always the leader: one healer per store, no election.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // Keep the value forever: a dropped sender leaves the last value readable.
        drop(tx);
        Leader { rx }
    }

    /// A leadership flag someone else sets; starts as a follower.
    pub fn channel() -> (LeaderSender, Leader) {
        let (tx, rx) = watch::channel(false);
        (LeaderSender { tx }, Leader { rx })
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves when leadership changes (never, for [`Leader::always`]).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl LeaderSender {
    pub fn set(&self, leader: bool) {
        self.tx.send_replace(leader);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_and_channel() {
        assert!(Leader::always().is_leader());
        let (tx, rx) = Leader::channel();
        assert!(!rx.is_leader());
        tx.set(true);
        assert!(rx.is_leader());
        tx.set(false);
        assert!(!rx.is_leader());
    }
}
