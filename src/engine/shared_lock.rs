//! One leader lock session shared by the elections of many stores of one
//! database, for engines whose locks are per session and re-entrant
//! (PostgreSQL's advisory locks). Which engine shares is the factory's
//! business ([`mod@super::open`]); the election ([`crate::leader`]) sees a
//! [`LeaderLock`] like any other.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{DbResult, FenceToken, LeaderLock, LeaderSession};
use crate::replicas::{Replica, Roll, Standing};

/// How long one successful check of a shared lock session vouches for the
/// other stores' locks on it.
pub const SHARED_CHECK_FRESH: Duration = Duration::from_millis(500);

/// How long one reading of the roll serves every store's election: the
/// stores of a database that follow ask once an interval each, and share
/// about two readings a second between them.
pub const ROLL_FRESH: Duration = Duration::from_millis(500);

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
    /// The session put on the roll (its generation), and the last reading
    /// of the roll with its time.
    roll: std::sync::Mutex<RollState>,
    /// The stores of this lock whose first scan has not ended: the session
    /// joins the roll only when there are none.
    unscanned: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct RollState {
    joined: u64,
    read: Option<(tokio::time::Instant, Roll)>,
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
    /// The lock whose session is shared.
    pub fn inner(&self) -> &L {
        &self.lock
    }

    /// Shares one session of `lock` (an engine of the database).
    pub fn new(lock: Arc<L>) -> Self {
        SharedLock {
            lock,
            verified: std::sync::Mutex::new(None),
            session: tokio::sync::Mutex::new((0, None)),
            roll: std::sync::Mutex::new(RollState::default()),
            unscanned: std::sync::atomic::AtomicUsize::new(0),
        }
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

    fn first_scan_pending(&self) {
        self.unscanned
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn first_scan_ended(&self) {
        self.unscanned
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// From the last reading of the roll when it is fresh; else reads it on
    /// the shared session (opening one if there is none, and putting it on
    /// the roll first once every store of the lock has ended its first
    /// scan: on the roll, a replica is left free locks and handed stores,
    /// so it joins when it can lead every store it heals).
    async fn standing(&self, key: &str, me: Replica) -> DbResult<Option<Standing>> {
        let id = self.lock.roll_id(key);
        let fresh = |state: &RollState| {
            state
                .read
                .as_ref()
                .filter(|(at, _)| at.elapsed() < ROLL_FRESH)
                .map(|(_, roll)| Standing::of(roll, key, id, me))
        };
        if let Some(s) = fresh(&self.roll.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(Some(s));
        }
        let mut slot = self.session.lock().await;
        // Another store's election may have read it while this one waited.
        if let Some(s) = fresh(&self.roll.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(Some(s));
        }
        let mut session = match slot.1.take().filter(|s| self.lock.reusable(s)) {
            Some(session) => session,
            None => {
                let session = self.lock.open_session(key).await?;
                slot.0 += 1;
                session
            }
        };
        let joined = self.roll.lock().unwrap_or_else(|e| e.into_inner()).joined;
        let unscanned = self.unscanned.load(std::sync::atomic::Ordering::SeqCst);
        if joined != slot.0 && unscanned == 0 {
            // On an error the session is dropped here: every lock on it goes.
            if self.lock.join_roll(&mut session, me).await? {
                info!(replica = %me, "on the roll of replicas: every store of this database has been scanned once");
            } else {
                warn!(replica = %me, "another live session is on the roll as this replica's number: the other replicas do not see this one, and leave it no stores of their own accord");
            }
            self.roll.lock().unwrap_or_else(|e| e.into_inner()).joined = slot.0;
        }
        let read = self.lock.read_roll(&mut session, me).await?;
        slot.1 = Some(session);
        let Some(roll) = read else {
            return Ok(None);
        };
        let standing = Standing::of(&roll, key, id, me);
        self.roll.lock().unwrap_or_else(|e| e.into_inner()).read =
            Some((tokio::time::Instant::now(), roll));
        Ok(Some(standing))
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

    /// How often the election checks a lock (`leader::ELECTION_INTERVAL`).
    const ELECTION_INTERVAL: Duration = Duration::from_secs(1);

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

    /// A lock with a roll, counting the sessions put on it.
    #[derive(Default)]
    struct Rolling {
        joins: AtomicUsize,
    }

    impl LeaderLock for Rolling {
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
            Ok(true)
        }
        async fn join_roll(&self, _session: &mut Session, _me: Replica) -> DbResult<bool> {
            self.joins.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }
        async fn read_roll(&self, _session: &mut Session, _me: Replica) -> DbResult<Option<Roll>> {
            Ok(Some(Roll::default()))
        }
    }

    /// The 1,000-store run: stores were handed to a replica on the roll
    /// whose first scan of them had not ended, so it could not take them.
    /// A replica's lock session joins the roll only once every store of
    /// the lock has ended its first scan; until then it reads the roll
    /// (as every store's election does) without being on it.
    #[tokio::test(start_paused = true)]
    async fn a_replica_joins_the_roll_once_every_store_has_been_scanned() {
        let inner = Arc::new(Rolling::default());
        let shared = SharedLock::new(inner.clone());
        let me = Replica::new(0, 1);
        shared.first_scan_pending();
        shared.first_scan_pending();
        assert!(shared.standing("k0", me).await.unwrap().is_some());
        assert_eq!(
            inner.joins.load(Ordering::SeqCst),
            0,
            "two stores unscanned"
        );
        shared.first_scan_ended();
        tokio::time::sleep(ROLL_FRESH).await;
        assert!(shared.standing("k0", me).await.unwrap().is_some());
        assert_eq!(inner.joins.load(Ordering::SeqCst), 0, "one store unscanned");
        shared.first_scan_ended();
        tokio::time::sleep(ROLL_FRESH).await;
        assert!(shared.standing("k1", me).await.unwrap().is_some());
        assert_eq!(inner.joins.load(Ordering::SeqCst), 1, "joined");
        tokio::time::sleep(ROLL_FRESH).await;
        shared.first_scan_pending();
        assert!(shared.standing("k2", me).await.unwrap().is_some());
        assert_eq!(
            inner.joins.load(Ordering::SeqCst),
            1,
            "a store found later does not take the session off the roll"
        );
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
}
