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

use crate::engine::{Fence, LeaderLock, LeaderSession};
use crate::replicas::{self, Follower, Handovers, Replica, Turn};
use crate::telemetry as t;

/// How often a follower tries the lock and a leader checks it still holds it.
/// A follower takes over within this long after the server ends the old
/// leader's session (at once for a killed process: its socket closes).
pub const ELECTION_INTERVAL: Duration = Duration::from_secs(1);

pub use crate::engine::shared_lock::{SharedLock, SharedPart, SHARED_CHECK_FRESH};

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

impl Drop for LeaderSender {
    /// An election that ends however it ends (aborted included) leaves its
    /// healer following: a watch keeps its last value after the sender
    /// goes, and that value must not be a fence whose lock is gone.
    fn drop(&mut self) {
        self.tx.send_replace(None);
    }
}

/// A running election, owned: [`Election::stop`] ends it and waits for its
/// task; dropped without that, the task is aborted. Either way the task
/// never outlives its owner, and its session (the lock with it) closes.
#[must_use = "an election dropped at once is aborted at once"]
pub struct Election {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

impl Election {
    /// Starts an election for the lock named `key` on `lock` as replica
    /// `me`, publishing through `tx`; it ends with `stop` or with
    /// [`Election::stop`].
    pub fn start<L: LeaderLock>(
        lock: Arc<L>,
        key: String,
        me: Replica,
        health: Arc<t::Health>,
        tx: LeaderSender,
        stop: &CancellationToken,
    ) -> Election {
        use tracing::Instrument;
        let stop = stop.child_token();
        let first_scan = FirstScan::new(lock.clone());
        let elector = Elector {
            lock,
            first_scan,
            key,
            me,
            health,
            tx,
            stop: stop.clone(),
        };
        let task = tokio::spawn(elector.elect().in_current_span());
        Election { task, stop }
    }

    /// Ends the election and waits for its task: within
    /// [`ELECTION_INTERVAL`] it has seen the stop (every wait of it watches
    /// the token); past that (a statement the driver cannot interrupt) it is
    /// aborted and awaited.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(ELECTION_INTERVAL, &mut self.task)
            .await
            .is_err()
        {
            warn!("the leader election did not stop within a second: aborted");
            self.task.abort();
            let _ = (&mut self.task).await;
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

/// One store's election: its lock, key and replica, what it reports to,
/// where it publishes, and when it ends.
struct Elector<L: LeaderLock> {
    lock: Arc<L>,
    first_scan: FirstScan<L>,
    key: String,
    me: Replica,
    health: Arc<t::Health>,
    tx: LeaderSender,
    stop: CancellationToken,
}

/// What a follower's turn came to, for what it says once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    Nothing,
    Following,
    LeavingTo(Replica),
}

impl<L: LeaderLock> Elector<L> {
    /// Runs the election until `stop`. While a follower, each
    /// [`ELECTION_INTERVAL`] asks the roll ([`replicas`]) what to do: a
    /// lock held elsewhere costs no statement of its own; a free one is
    /// tried at once by the replica that prefers the store, by the others
    /// once it has been free for [`replicas::TAKEOVER_GRACE`]; where the
    /// lock reads no roll, every replica tries it every interval. While the
    /// leader, checks every interval that the lock's session is alive and
    /// still holds it, and steps down (the sender goes false first) as soon
    /// as a check fails or does not answer within the interval, or to hand
    /// the store to its preferred replica.
    ///
    /// Only a healer that can fill takes part: while `health` says it cannot
    /// (its scans fail, or its fills are refused for good: no rights, a
    /// shape it must not fill), it does not try the lock, and a leader gives
    /// the lock up at its next check, so a healthy replica takes over within
    /// about two intervals. It tries again after its next successful scan.
    async fn elect(mut self) {
        let key = self.key.as_str();
        info!(key = %key, replica = %self.me, "leader election: trying the store's leader lock");
        let mut said = Said::Nothing;
        // Say it once when the database goes away, not every second.
        let mut unreachable = false;
        // Why this healer stays out of the election, once said.
        let mut said_unable: Option<t::CannotFill> = None;
        // A follower's session, kept between tries.
        let mut idle: Option<L::Session> = None;
        let mut follower = Follower::default();
        let mut handovers = Handovers::default();
        loop {
            let cannot = self.health.cannot_fill();
            if cannot != Some(t::CannotFill::NotScannedYet) {
                self.first_scan.ended();
            }
            if let Some(why) = cannot {
                if said_unable.as_ref() != Some(&why) {
                    if why == t::CannotFill::NotScannedYet {
                        debug!(key = %key, "not taking the leader lock before the first scan");
                    } else {
                        warn!(key = %key, reason = %why, "not taking the leader lock: this healer cannot fill the store");
                    }
                    said_unable = Some(why);
                }
                said = Said::Nothing;
                follower.reset();
                if self.pause().await {
                    return;
                }
                continue;
            }
            said_unable = None;
            let turn = tokio::select! {
                _ = self.stop.cancelled() => return,
                turn = self.turn(&mut follower) => turn,
            };
            match turn {
                Turn::Held => said = self.say(said, Said::Following),
                Turn::LeaveTo(other) => said = self.say(said, Said::LeavingTo(other)),
                Turn::Try => {
                    let tried = tokio::select! {
                        _ = self.stop.cancelled() => return,
                        tried = self.lock.try_lead_reusing(key, &mut idle) => tried,
                    };
                    match tried {
                        Ok(Some(session)) => {
                            said = Said::Nothing;
                            unreachable = false;
                            follower.reset();
                            match self.lead(session, &mut handovers).await {
                                Reign::Stopped => return,
                                // `said_unable` is `None` here: it was cleared before the try.
                                Reign::SteppedDown { unable } => said_unable = unable,
                                Reign::HandedOver(to) => {
                                    handovers.handed_over(to, tokio::time::Instant::now())
                                }
                            }
                        }
                        Ok(None) => {
                            unreachable = false;
                            said = self.say(said, Said::Following);
                            debug!("leader lock taken by another session");
                        }
                        Err(e) => {
                            t::Observer::db_error(&*self.health, t::Operation::Leader);
                            if unreachable {
                                debug!(error = %e, "leader election: cannot reach the database");
                            } else {
                                warn!(error = %e, "leader election: cannot reach the database; retrying every second");
                                unreachable = true;
                            }
                            said = Said::Nothing;
                        }
                    }
                }
            }
            if self.pause().await {
                return;
            }
        }
    }

    /// Waits an interval; whether the election was stopped meanwhile.
    async fn pause(&self) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => true,
            _ = tokio::time::sleep(ELECTION_INTERVAL) => false,
        }
    }

    /// A follower's move this turn, from the roll (a roll that cannot be
    /// read makes it try, as without one: the try reports the error).
    async fn turn(&self, follower: &mut Follower) -> Turn {
        let standing = match self.lock.standing(&self.key, self.me).await {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "the roll of replicas could not be read: trying the lock");
                follower.reset();
                None
            }
        };
        follower.turn(standing.as_ref(), self.me, tokio::time::Instant::now())
    }

    /// Says what a follower does, once for as long as it does it.
    fn say(&self, said: Said, now: Said) -> Said {
        if said != now {
            let key = self.key.as_str();
            match now {
                Said::Following => {
                    info!(key = %key, "another healer holds the leader lock: following (not filling)")
                }
                Said::LeavingTo(other) => info!(
                    key = %key,
                    preferred = %other,
                    "the leader lock is free and replica {other} prefers the store: leaving it to that replica for {}",
                    humantime::format_duration(replicas::TAKEOVER_GRACE)
                ),
                Said::Nothing => {}
            }
        }
        now
    }

    /// Leads with `session`'s lock: publishes its fence, then checks every
    /// interval that the healer can still fill and the session still holds
    /// the lock, and steps down (the fence goes to `None` first) when either
    /// fails, or when the roll says another replica on it prefers the store
    /// ([`replicas::hand_over`]).
    async fn lead(&self, mut session: L::Session, handovers: &mut Handovers) -> Reign {
        let (key, tx, stop) = (self.key.as_str(), &self.tx, &self.stop);
        let token = session.fence_token();
        info!(key = %key, session = token.session_id, "became the leader: this process fills");
        tx.set(Some(Fence::Leader(token)));
        let since = tokio::time::Instant::now();
        loop {
            if self.pause().await {
                tx.set(None);
                return Reign::Stopped;
            }
            if let Some(why) = self.health.cannot_fill() {
                // Step down before giving the lock up.
                tx.set(None);
                warn!(key = %key, reason = %why, "stepped down as leader: this healer cannot fill the store; another may take over");
                tokio::select! {
                    _ = stop.cancelled() => return Reign::Stopped,
                    _ = self.lock.release(session, key) => {}
                }
                self.health.forget_fill_refusal();
                return Reign::SteppedDown { unable: Some(why) };
            }
            let check = tokio::select! {
                _ = stop.cancelled() => {
                    tx.set(None);
                    return Reign::Stopped;
                }
                check = tokio::time::timeout(ELECTION_INTERVAL, self.lock.still_held(&mut session, key)) => check,
            };
            let why = match check {
                Ok(Ok(true)) => match self.hand_over_to(since, handovers).await {
                    None => continue,
                    Some(other) => {
                        // Step down before giving the lock up.
                        tx.set(None);
                        info!(key = %key, preferred = %other, "handing the store to the replica that prefers it: stepped down and released the lock");
                        tokio::select! {
                            _ = stop.cancelled() => return Reign::Stopped,
                            _ = self.lock.release(session, key) => {}
                        }
                        return Reign::HandedOver(other);
                    }
                },
                Ok(Ok(false)) => "the lock is no longer held".to_string(),
                Ok(Err(e)) => {
                    t::Observer::db_error(&*self.health, t::Operation::Leader);
                    format!("the lock's session failed: {e}")
                }
                Err(_) => {
                    // Step down before anything else: no fill may start from now on.
                    tx.set(None);
                    warn!(key = %key, reason = "the lock's session did not answer in time", "stepped down as leader; giving the lock up");
                    // The lock may still be held: a session shared by many
                    // stores outlives this store's reign, and kept the lock
                    // with no leader behind it (no other replica could take
                    // it, and this one followed its own lock). Released, it
                    // is free for whoever can lead; on a session of its own
                    // this closes it, as before.
                    tokio::select! {
                        _ = stop.cancelled() => return Reign::Stopped,
                        _ = self.lock.release(session, key) => {}
                    }
                    return Reign::SteppedDown { unable: None };
                }
            };
            // Step down before anything else: no fill may start from now on.
            tx.set(None);
            warn!(key = %key, reason = %why, "stepped down as leader");
            return Reign::SteppedDown { unable: None };
        }
    }

    /// The replica to hand the store to now, if any (a roll that cannot be
    /// read hands nothing over).
    async fn hand_over_to(
        &self,
        since: tokio::time::Instant,
        handovers: &mut Handovers,
    ) -> Option<Replica> {
        let now = tokio::time::Instant::now();
        if now.duration_since(since) < replicas::HANDOVER_AFTER {
            return None;
        }
        let standing =
            tokio::time::timeout(ELECTION_INTERVAL, self.lock.standing(&self.key, self.me))
                .await
                .ok()?
                .ok()??;
        handovers.due(&standing, self.me, since, now)
    }
}

/// How a turn as leader ended.
enum Reign {
    /// Told to stop: the fence is already `None`.
    Stopped,
    /// Stepped down (the fence is `None`); `unable` is why, when this
    /// healer cannot fill the store and gave the lock up.
    SteppedDown { unable: Option<t::CannotFill> },
    /// Gave the store to the replica that prefers it (the fence is `None`,
    /// the lock released).
    HandedOver(Replica),
}

/// A store of the lock whose first scan has not ended yet, from the
/// election's start until [`FirstScan::ended`] or the election's end: a
/// lock shared by a database's stores puts its replica on the roll only
/// once none is left ([`LeaderLock::first_scan_pending`]).
struct FirstScan<L: LeaderLock> {
    lock: Arc<L>,
    pending: bool,
}

impl<L: LeaderLock> FirstScan<L> {
    fn new(lock: Arc<L>) -> Self {
        lock.first_scan_pending();
        FirstScan {
            lock,
            pending: true,
        }
    }

    /// The store's first scan ended (succeeded or failed); said once.
    fn ended(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.lock.first_scan_ended();
        }
    }
}

impl<L: LeaderLock> Drop for FirstScan<L> {
    fn drop(&mut self) {
        self.ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    use crate::engine::{DbResult, FenceToken};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its drops: a session, or a statement's future, that ended.
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A lock whose session opens only when `hang` is false, and then
    /// takes the lock and holds it; every session and every hung login
    /// counts its end in `ended`.
    struct Lock {
        hang: bool,
        ended: Arc<AtomicUsize>,
    }
    struct Session(#[allow(dead_code)] Dropped);
    impl LeaderSession for Session {
        fn fence_token(&self) -> FenceToken {
            FenceToken {
                session_id: 1,
                lock: "k".into(),
            }
        }
    }
    impl LeaderLock for Lock {
        type Session = Session;
        async fn open_session(&self, _key: &str) -> DbResult<Session> {
            let login = Dropped(self.ended.clone());
            if self.hang {
                std::future::pending::<()>().await;
            }
            std::mem::forget(login);
            Ok(Session(Dropped(self.ended.clone())))
        }
        fn reusable(&self, _: &Session) -> bool {
            true
        }
        async fn try_lock(&self, session: Session, _key: &str) -> DbResult<(bool, Session)> {
            Ok((true, session))
        }
        async fn still_held(&self, _: &mut Session, _key: &str) -> DbResult<bool> {
            Ok(true)
        }
    }

    fn election(hang: bool) -> (Election, Leader, Arc<AtomicUsize>, CancellationToken) {
        let ended = Arc::new(AtomicUsize::new(0));
        let health = t::Health::new(Duration::from_millis(100), Duration::from_secs(1));
        health.scan_completed();
        let (tx, leader) = Leader::channel();
        let parent = CancellationToken::new();
        let lock = Arc::new(Lock {
            hang,
            ended: ended.clone(),
        });
        let e = Election::start(lock, "k".into(), Replica::new(0, 1), health, tx, &parent);
        (e, leader, ended, parent)
    }

    /// Issue 28: the election's task was dropped after 200 ms and left
    /// running. A stopped election has ended before `stop` returns, even
    /// one waiting on a login that never answers, and a leader's session
    /// is closed (its lock released) and its fence withdrawn.
    #[tokio::test(start_paused = true)]
    async fn a_stopped_election_has_ended_and_closed_its_session() {
        let (e, _leader, ended, _parent) = election(true);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(ended.load(Ordering::SeqCst), 0, "the login still hangs");
        let asked = tokio::time::Instant::now();
        e.stop().await;
        assert_eq!(ended.load(Ordering::SeqCst), 1, "the hung login ended");
        assert!(asked.elapsed() < ELECTION_INTERVAL);

        let (e, leader, ended, _parent) = election(false);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(leader.is_leader());
        e.stop().await;
        assert!(!leader.is_leader(), "the fence is withdrawn");
        assert_eq!(ended.load(Ordering::SeqCst), 1, "the session is closed");
    }

    /// A lock whose checks never answer, counting its releases.
    struct Slow {
        released: Arc<AtomicUsize>,
    }
    impl LeaderLock for Slow {
        type Session = Session;
        async fn open_session(&self, _key: &str) -> DbResult<Session> {
            Ok(Session(Dropped(Arc::new(AtomicUsize::new(0)))))
        }
        fn reusable(&self, _: &Session) -> bool {
            true
        }
        async fn try_lock(&self, session: Session, _key: &str) -> DbResult<(bool, Session)> {
            Ok((true, session))
        }
        async fn still_held(&self, _: &mut Session, _key: &str) -> DbResult<bool> {
            std::future::pending().await
        }
        async fn release(&self, _session: Session, _key: &str) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The 1,000-store run on a loaded machine: a leader whose check of a
    /// shared lock session did not answer within the interval stepped down
    /// but left its lock held on the session, which outlives the store's
    /// reign, so no replica could lead the store (532 of 1,000 unled). A
    /// leader that steps down for a check that did not answer gives the
    /// lock up.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_check_does_not_answer_gives_its_lock_up() {
        let released = Arc::new(AtomicUsize::new(0));
        let health = t::Health::new(Duration::from_millis(100), Duration::from_secs(1));
        health.scan_completed();
        let (tx, leader) = Leader::channel();
        let parent = CancellationToken::new();
        let lock = Arc::new(Slow {
            released: released.clone(),
        });
        let e = Election::start(lock, "k".into(), Replica::new(0, 1), health, tx, &parent);
        tokio::time::sleep(ELECTION_INTERVAL / 2).await;
        assert!(leader.is_leader());
        tokio::time::sleep(ELECTION_INTERVAL * 2).await;
        assert!(released.load(Ordering::SeqCst) >= 1, "the lock is given up");
        e.stop().await;
    }

    /// Dropped without `stop` (its owner ended by a panic, say), the
    /// election is aborted: its session closes and nothing runs on.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_election_is_aborted() {
        let (e, leader, ended, parent) = election(false);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(leader.is_leader());
        drop(e);
        tokio::task::yield_now().await;
        assert_eq!(ended.load(Ordering::SeqCst), 1, "the session is closed");
        assert!(!leader.is_leader(), "no fence outlives its election");
        assert!(!parent.is_cancelled(), "only the election's own token");
    }
}
