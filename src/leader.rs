//! Whether this process may fill now.
//!
//! Leadership is published as a value: `Some(fence)` while this process may
//! fill, `None` while it follows. The healer takes [`Leader::fence`] before
//! every fill statement, never fills without one, and hands it to the fill,
//! which checks it inside its transaction. Followers keep scanning and
//! exporting metrics. [`Leader::always`] serves single-instance deployments
//! (`--no-leader-election`: [`Fence::Unfenced`]); an election keeps a
//! [`LeaderSender`] and publishes the winning session's [`Fence::Leader`].
//!
//! Architecture invariant: the sender is set to `None` before the lock that
//! justified the fence can be lost, never after.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::engine::{DbResult, Fence, FenceToken, LeaderLock, LeaderSession};
use crate::telemetry as t;

/// How often a follower tries the lock and a leader checks it still holds it.
/// A follower takes over within this long after the server ends the old
/// leader's session (at once for a killed process: its socket closes).
pub const ELECTION_INTERVAL: Duration = Duration::from_secs(1);

/// How long one successful check of a shared lock session vouches for the
/// other stores' locks on it.
pub const SHARED_CHECK_FRESH: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct Leader {
    rx: watch::Receiver<Option<Fence>>,
}

#[derive(Debug)]
pub struct LeaderSender {
    tx: watch::Sender<Option<Fence>>,
}

impl Leader {
    /// Always the leader, unfenced: one healer per store, no election.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(Some(Fence::Unfenced));
        // Keep the value forever: a dropped sender leaves the last value readable.
        drop(tx);
        Leader { rx }
    }

    /// Never the leader: a dry run, which fills nothing and so must not
    /// keep a healer that can fill from leading.
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(None);
        drop(tx);
        Leader { rx }
    }

    /// A leadership flag someone else sets; starts as a follower.
    pub fn channel() -> (LeaderSender, Leader) {
        let (tx, rx) = watch::channel(None);
        (LeaderSender { tx }, Leader { rx })
    }

    /// The fence to fill under, `None` while following.
    pub fn fence(&self) -> Option<Fence> {
        self.rx.borrow().clone()
    }

    pub fn is_leader(&self) -> bool {
        self.rx.borrow().is_some()
    }

    /// Resolves when leadership changes (never, for [`Leader::always`]).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl LeaderSender {
    /// Publishes leadership: `Some(fence)` to lead under it, `None` to follow.
    pub fn set(&self, fence: Option<Fence>) {
        self.tx.send_replace(fence);
    }
}

/// Runs an election until `stop`: tries the lock every [`ELECTION_INTERVAL`]
/// while a follower; while the leader, checks every interval that the lock's
/// session is alive and still holds it, and steps down (the sender goes false
/// first) as soon as a check fails or does not answer within the interval.
///
/// Only a healer that can fill takes part: while `health` says it cannot
/// (its scans fail, or its fills are refused for good: no rights, a
/// shape it must not fill), it does not try the lock, and a leader gives
/// the lock up at its next check, so a healthy replica takes over within
/// about two intervals. It tries again after its next successful scan.
pub async fn elect<L: LeaderLock>(
    lock: Arc<L>,
    key: String,
    health: Arc<t::Health>,
    tx: LeaderSender,
    stop: CancellationToken,
) {
    info!(key = %key, "leader election: trying the store's leader lock");
    let mut said_follower = false;
    // Say it once when the database goes away, not every second.
    let mut unreachable = false;
    // Why this healer stays out of the election, once said.
    let mut said_unable: Option<t::CannotFill> = None;
    // A follower's session, kept between tries.
    let mut idle: Option<L::Session> = None;
    loop {
        if let Some(why) = health.cannot_fill() {
            if said_unable.as_ref() != Some(&why) {
                if why == t::CannotFill::NotScannedYet {
                    debug!(key = %key, "not taking the leader lock before the first scan");
                } else {
                    warn!(key = %key, reason = %why, "not taking the leader lock: this healer cannot fill the store");
                }
                said_unable = Some(why);
            }
            said_follower = false;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(ELECTION_INTERVAL) => {}
            }
            continue;
        }
        said_unable = None;
        match lock.try_lead_reusing(&key, &mut idle).await {
            Ok(Some(mut session)) => {
                let token = session.fence_token();
                info!(key = %key, session = token.session_id, "became the leader: this process fills");
                tx.set(Some(Fence::Leader(token)));
                said_follower = false;
                unreachable = false;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => {
                            tx.set(None);
                            return;
                        }
                        _ = tokio::time::sleep(ELECTION_INTERVAL) => {}
                    }
                    if let Some(why) = health.cannot_fill() {
                        // Step down before giving the lock up.
                        tx.set(None);
                        warn!(key = %key, reason = %why, "stepped down as leader: this healer cannot fill the store; another may take over");
                        lock.release(session, &key).await;
                        health.forget_fill_refusal();
                        said_unable = Some(why);
                        break;
                    }
                    let check = tokio::time::timeout(
                        ELECTION_INTERVAL,
                        lock.still_held(&mut session, &key),
                    )
                    .await;
                    let why = match check {
                        Ok(Ok(true)) => continue,
                        Ok(Ok(false)) => "the lock is no longer held".to_string(),
                        Ok(Err(e)) => {
                            t::Observer::db_error(&*health, t::Operation::Leader);
                            format!("the lock's session failed: {e}")
                        }
                        Err(_) => "the lock's session did not answer in time".to_string(),
                    };
                    // Step down before anything else: no fill may start from now on.
                    tx.set(None);
                    warn!(key = %key, reason = %why, "stepped down as leader");
                    break;
                }
            }
            Ok(None) => {
                unreachable = false;
                if !said_follower {
                    info!(key = %key, "another healer holds the leader lock: following (scanning and reporting, not filling)");
                    said_follower = true;
                }
                debug!("leader lock taken by another session");
            }
            Err(e) => {
                t::Observer::db_error(&*health, t::Operation::Leader);
                if unreachable {
                    debug!(error = %e, "leader election: cannot reach the database");
                } else {
                    warn!(error = %e, "leader election: cannot reach the database; retrying every second");
                    unreachable = true;
                }
                said_follower = false;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ELECTION_INTERVAL) => {}
        }
    }
}

/// One dedicated lock session for the elections of many stores of one
/// database: each store still has its own lock (its `leader_key`), so
/// leadership stays per store, but 500 stores need one lock session, not
/// 500. Engines whose locks are per session and re-entrant (PostgreSQL's
/// advisory locks) can share one.
///
/// Invariant: a store's leadership is tied to the session that won it. When
/// the shared session fails it is dropped (the server releases every lock
/// on it), and every store that led through it steps down at its next
/// check, because the session it won on is gone, even if a new session
/// has since taken its lock again.
///
/// A lock of a session-level kind is lost only with its session, so one
/// store's check that found its lock held proves the session alive for
/// every store on it: checks within [`SHARED_CHECK_FRESH`] of one that
/// succeeded answer without a query (500 stores cost about two queries a
/// second, not 500). Every fill still checks its own lock inside its
/// transaction.
pub struct SharedLock<L: LeaderLock> {
    lock: Arc<L>,
    /// The generation and time of the last check that found a lock held.
    verified: std::sync::Mutex<Option<(u64, tokio::time::Instant)>>,
    /// The session, and which one it is (counted from 1 as they are opened).
    session: tokio::sync::Mutex<(u64, Option<L::Session>)>,
}

/// A store's part of a [`SharedLock`]: the fence of the session it won on,
/// and which session that was.
pub struct SharedPart {
    won: Option<(u64, FenceToken)>,
}

impl LeaderSession for SharedPart {
    fn fence_token(&self) -> FenceToken {
        self.won.as_ref().map_or(
            FenceToken {
                session_id: 0,
                lock: String::new(),
            },
            |(_, token)| token.clone(),
        )
    }
}

impl<L: LeaderLock> SharedLock<L> {
    /// Shares one session of `lock` (an engine of the database).
    pub fn new(lock: Arc<L>) -> Arc<Self> {
        Arc::new(SharedLock {
            lock,
            verified: std::sync::Mutex::new(None),
            session: tokio::sync::Mutex::new((0, None)),
        })
    }
}

impl<L: LeaderLock> LeaderLock for SharedLock<L> {
    type Session = SharedPart;

    async fn open_session(&self, _key: &str) -> DbResult<SharedPart> {
        Ok(SharedPart { won: None })
    }

    fn reusable(&self, _part: &SharedPart) -> bool {
        true
    }

    async fn try_lock(&self, _part: SharedPart, key: &str) -> DbResult<(bool, SharedPart)> {
        let mut slot = self.session.lock().await;
        let session = match slot.1.take().filter(|s| self.lock.reusable(s)) {
            Some(session) => session,
            None => {
                let session = self.lock.open_session(key).await?;
                slot.0 += 1;
                session
            }
        };
        // On an error the session is dropped here: every lock on it goes.
        let (taken, session) = self.lock.try_lock(session, key).await?;
        let won = taken.then(|| (slot.0, session.fence_token()));
        slot.1 = Some(session);
        Ok((taken, SharedPart { won }))
    }

    async fn release(&self, part: SharedPart, key: &str) {
        let mut slot = self.session.lock().await;
        if part.won.as_ref().is_none_or(|(g, _)| *g != slot.0) {
            return;
        }
        let Some(mut session) = slot.1.take() else {
            return;
        };
        match self.lock.unlock(&mut session, key).await {
            Ok(()) => slot.1 = Some(session),
            // The session is dropped: every lock on it goes, and the stores
            // that led through it step down at their next check.
            Err(e) => {
                warn!(key = %key, error = %e, "could not release one leader lock; closing the shared lock session")
            }
        }
    }

    async fn still_held(&self, part: &mut SharedPart, key: &str) -> DbResult<bool> {
        let mut slot = self.session.lock().await;
        let generation = slot.0;
        if part.won.as_ref().is_none_or(|(g, _)| *g != generation) {
            return Ok(false);
        }
        let fresh = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|(g, at)| g == generation && at.elapsed() < SHARED_CHECK_FRESH);
        if fresh && slot.1.is_some() {
            return Ok(true);
        }
        let Some(mut session) = slot.1.take() else {
            return Ok(false);
        };
        // On an error the session is dropped here: every lock on it goes.
        let held = self.lock.still_held(&mut session, key).await?;
        slot.1 = Some(session);
        if held {
            *self.verified.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((generation, tokio::time::Instant::now()));
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A session-level lock that is always held, counting the checks that
    /// reach the server.
    #[derive(Default)]
    struct Counting {
        checks: AtomicUsize,
    }

    struct Session;

    impl LeaderSession for Session {
        fn fence_token(&self) -> FenceToken {
            FenceToken {
                session_id: 7,
                lock: "k".into(),
            }
        }
    }

    impl LeaderLock for Counting {
        type Session = Session;
        async fn open_session(&self, _key: &str) -> DbResult<Session> {
            Ok(Session)
        }
        fn reusable(&self, _session: &Session) -> bool {
            true
        }
        async fn try_lock(&self, session: Session, _key: &str) -> DbResult<(bool, Session)> {
            Ok((true, session))
        }
        async fn still_held(&self, _session: &mut Session, _key: &str) -> DbResult<bool> {
            self.checks.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }
    }

    /// 100 stores on one shared session: their checks within the freshness
    /// window cost one query, the next round one more.
    #[tokio::test(start_paused = true)]
    async fn a_shared_session_is_checked_once_for_all_its_stores() {
        let inner = Arc::new(Counting::default());
        let shared = SharedLock::new(inner.clone());
        let mut parts = Vec::new();
        for i in 0..100 {
            let key = format!("k{i}");
            let part = shared.open_session(&key).await.unwrap();
            let (won, part) = shared.try_lock(part, &key).await.unwrap();
            assert!(won);
            parts.push((key, part));
        }
        for _round in 0..2 {
            for (key, part) in &mut parts {
                assert!(shared.still_held(part, key).await.unwrap());
            }
            tokio::time::sleep(ELECTION_INTERVAL).await;
        }
        assert_eq!(inner.checks.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn always_and_channel() {
        assert!(Leader::always().is_leader());
        assert_eq!(Leader::always().fence(), Some(Fence::Unfenced));
        let (tx, rx) = Leader::channel();
        assert!(!rx.is_leader());
        let token = crate::engine::FenceToken {
            session_id: 40_000,
            lock: "k".into(),
        };
        tx.set(Some(Fence::Leader(token.clone())));
        assert!(rx.is_leader());
        assert_eq!(rx.fence(), Some(Fence::Leader(token)));
        tx.set(None);
        assert!(!rx.is_leader());
        assert_eq!(rx.fence(), None);
    }
}
