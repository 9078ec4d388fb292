//! How replicas of the daemon divide the stores they all heal, with the
//! database's locks as the only coordination.
//!
//! Every replica has a number ([`Replica`], from its name). Its lock
//! session in each database puts it on that database's roll (a lock of its
//! own the others can see), and a reading of the roll ([`Roll`]) says which
//! replicas are there and which leader locks are held. Each store is
//! preferred by one replica of the roll, by rendezvous hashing of the
//! store's leader key and the replica numbers ([`preferred`]): every replica
//! computes the same answer from the same roll, and when a replica joins or
//! leaves only its own share moves. So without a protocol of our own:
//! - a free lock is tried at once by its preferred replica, by the others
//!   only once it has been free for [`TAKEOVER_GRACE`] (a preferred replica
//!   that cannot fill, or has not read the roll yet, delays a store by that
//!   long, never for good);
//! - a replica is on the roll only once every store of the database it
//!   heals has ended its first scan (the lock session joins it then): the
//!   others leave it no free lock and hand it no store before it can lead
//!   them;
//! - a leader that is not the preferred replica of a store whose preferred
//!   replica is on the roll hands the store over ([`HANDOVER_AFTER`] after
//!   it began leading); when the store comes back (the preferred replica did
//!   not keep it), it waits [`HANDOVER_BACKOFF_FIRST`] before the next try,
//!   twice as long after each further failure, up to [`HANDOVER_BACKOFF`]
//!   ([`Handovers`]);
//! - a follower of a held lock makes no statement of its own: the roll,
//!   read once per database and interval, says the lock is held.
//!
//! Invariant: preference only decides who *tries* a lock. Leadership is
//! still the lock, and every fill is still fenced by it; a roll read wrong
//! or late costs a delay or a hand-over, never two fillers.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

/// How long a free lock waits for its preferred replica before any other
/// replica tries it: three election intervals, so a preferred replica that
/// is alive and able takes it first.
pub const TAKEOVER_GRACE: Duration = Duration::from_secs(3);

/// How long a replica leads a store before it hands it to the store's
/// preferred replica: a replica that has just started has read the roll
/// and can fill by then.
pub const HANDOVER_AFTER: Duration = Duration::from_secs(5);

/// How long after a failed hand-over (the store came back to this replica
/// while the replica it went to is still preferred) a replica leads it on
/// before handing it to that replica again: short, because the usual cause
/// is passing (a preferred replica whose first scan of the store has not
/// ended, or a lock session just lost); doubled after each further failure
/// up to [`HANDOVER_BACKOFF`].
pub const HANDOVER_BACKOFF_FIRST: Duration = Duration::from_secs(30);

/// The longest wait between two hand-overs of a store to the same replica:
/// a preferred replica that never keeps it (it cannot fill the store, say)
/// costs a [`TAKEOVER_GRACE`] without a leader this often, not every few
/// seconds.
pub const HANDOVER_BACKOFF: Duration = Duration::from_secs(300);

/// A replica: the roll it is on and its number there (a 32-bit hash of
/// its name). Only replicas of one roll divide stores between them: the
/// daemons that heal the same stores, which share their configuration's
/// stores ([`roll_of`]); any other daemon with a lock session in the same
/// database is on a roll of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Replica {
    pub roll: u32,
    pub number: u32,
}

impl Replica {
    pub fn new(roll: u32, number: u32) -> Replica {
        Replica { roll, number }
    }

    /// The replica called `name`, on roll 0.
    pub fn named(name: &str) -> Replica {
        let h = mix(fnv1a(name.as_bytes()));
        Replica::new(0, (h ^ (h >> 32)) as u32)
    }

    /// The same replica on `roll`.
    pub fn on_roll(self, roll: u32) -> Replica {
        Replica::new(roll, self.number)
    }

    /// The name a replica has unless it is given one: the host's name
    /// (Kubernetes sets it to the pod's) and the process id, so two
    /// daemons on one host are two replicas.
    pub fn default_name() -> String {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "localhost".to_string());
        format!("{host}/{}", std::process::id())
    }
}

impl std::fmt::Display for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}", self.number)
    }
}

/// The roll of the daemons configured with the stores `parts` describe
/// (each store's name and leader key, each store set's name and pattern),
/// in any order: replicas of one deployment share it, other daemons whose
/// lock sessions are in the same database do not.
pub fn roll_of(parts: impl IntoIterator<Item = String>) -> u32 {
    let mut parts: Vec<String> = parts.into_iter().collect();
    parts.sort();
    let h = mix(fnv1a(parts.join("\n\n").as_bytes()));
    (h ^ (h >> 32)) as u32
}

/// What one reading of a database's roll showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roll {
    /// The replicas with a lock session in the database.
    pub replicas: BTreeSet<Replica>,
    /// The engine's ids of the leader locks held, by any session.
    pub held: BTreeSet<i64>,
}

/// A store's lock as the roll shows it to one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Whether any session holds the store's leader lock.
    pub held: bool,
    /// The replica that prefers the store (this one included in the roll).
    pub preferred: Replica,
    /// Whether that replica is on the roll (not this one by default).
    pub preferred_on_roll: bool,
}

impl Standing {
    /// The standing of the lock named `key` with id `id` for `me`.
    pub fn of(roll: &Roll, key: &str, id: i64, me: Replica) -> Standing {
        let mut replicas = roll.replicas.clone();
        let on_roll = |r: &Replica| roll.replicas.contains(r);
        replicas.insert(me);
        let preferred = preferred(key, &replicas).unwrap_or(me);
        Standing {
            held: roll.held.contains(&id),
            preferred,
            preferred_on_roll: on_roll(&preferred),
        }
    }
}

/// What a follower does about a store's lock this turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Try the lock now.
    Try,
    /// Another session holds it: nothing to do.
    Held,
    /// It is free, and another replica prefers it: wait until it has been
    /// free for [`TAKEOVER_GRACE`].
    LeaveTo(Replica),
}

/// A follower's view of one store's lock between turns.
#[derive(Debug, Default)]
pub struct Follower {
    /// Since when the lock has been seen free while another replica is
    /// preferred.
    free_since: Option<Instant>,
}

impl Follower {
    /// This turn's move, given what the roll shows (`None`: the lock
    /// cannot read a roll, so every replica tries, as without one).
    pub fn turn(&mut self, standing: Option<&Standing>, me: Replica, now: Instant) -> Turn {
        let Some(s) = standing else {
            return Turn::Try;
        };
        if s.held {
            self.free_since = None;
            return Turn::Held;
        }
        if s.preferred == me {
            return Turn::Try;
        }
        let since = *self.free_since.get_or_insert(now);
        if now.duration_since(since) >= TAKEOVER_GRACE {
            Turn::Try
        } else {
            Turn::LeaveTo(s.preferred)
        }
    }

    /// Forgets what it saw (after leading, or when the roll fails).
    pub fn reset(&mut self) {
        self.free_since = None;
    }
}

/// One replica's hand-overs of one store: the last one (when, to which
/// replica) and how long it waits before handing the store to that replica
/// again. Kept across its reigns over the store.
#[derive(Clone, Debug, Default)]
pub struct Handovers {
    last: Option<Handed>,
}

#[derive(Clone, Copy, Debug)]
struct Handed {
    at: Instant,
    to: Replica,
    backoff: Duration,
}

impl Handovers {
    /// Whether a leader that has led the store since `leading_since`
    /// hands it to the preferred replica now: that replica is another one,
    /// on the roll, this one has led for [`HANDOVER_AFTER`], and, if this
    /// one handed the store to that same replica before (and it came back),
    /// the backoff since that hand-over has passed. A standing that names
    /// this replica preferred forgets the hand-overs: the store is led by
    /// its preferred replica.
    pub fn due(
        &mut self,
        standing: &Standing,
        me: Replica,
        leading_since: Instant,
        now: Instant,
    ) -> Option<Replica> {
        if standing.preferred == me {
            self.last = None;
            return None;
        }
        if !standing.preferred_on_roll || now.duration_since(leading_since) < HANDOVER_AFTER {
            return None;
        }
        match self.last {
            Some(h) if h.to == standing.preferred && now.duration_since(h.at) < h.backoff => None,
            _ => Some(standing.preferred),
        }
    }

    /// This replica handed the store to `to` at `now`. If it last handed
    /// it to the same replica less than twice that hand-over's backoff ago,
    /// that one failed (the store came back as soon as it could), and the
    /// next wait is twice as long, up to [`HANDOVER_BACKOFF`]; else it is
    /// [`HANDOVER_BACKOFF_FIRST`].
    pub fn handed_over(&mut self, to: Replica, now: Instant) {
        let backoff = match self.last {
            Some(h) if h.to == to && now.duration_since(h.at) < h.backoff * 2 => {
                (h.backoff * 2).min(HANDOVER_BACKOFF)
            }
            _ => HANDOVER_BACKOFF_FIRST,
        };
        self.last = Some(Handed {
            at: now,
            to,
            backoff,
        });
    }

    /// How long after the last hand-over this replica waits before handing
    /// the store to the same replica again (`None`: no hand-over to wait
    /// for).
    pub fn backoff(&self) -> Option<Duration> {
        self.last.map(|h| h.backoff)
    }
}

/// The replica of `replicas` that prefers the store with leader key `key`:
/// the highest score of the pair (rendezvous hashing), ties to the lower
/// number. `None` for an empty set.
pub fn preferred(key: &str, replicas: &BTreeSet<Replica>) -> Option<Replica> {
    replicas
        .iter()
        .copied()
        .max_by_key(|r| (score(key, *r), std::cmp::Reverse(*r)))
}

/// The rendezvous score of a store and a replica.
fn score(key: &str, replica: Replica) -> u64 {
    let mut h = fnv1a(key.as_bytes());
    for b in replica.number.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// FNV-1a over `bytes`: stable across versions and processes.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A finaliser (MurmurHash3's fmix64), so that keys that differ only in
/// their last bytes still score independently.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<Replica> {
        names.iter().map(|n| Replica::named(n)).collect()
    }

    fn shares(keys: usize, replicas: &BTreeSet<Replica>) -> Vec<(Replica, usize)> {
        let mut counts: std::collections::BTreeMap<Replica, usize> =
            replicas.iter().map(|r| (*r, 0)).collect();
        for i in 0..keys {
            *counts
                .get_mut(&preferred(&format!("gap-healer:tenant_{i}"), replicas).unwrap())
                .unwrap() += 1;
        }
        counts.into_iter().collect()
    }

    /// 1,000 stores over three replicas: each prefers about a third, and
    /// every replica computes the same owner.
    #[test]
    fn three_replicas_divide_a_thousand_stores_about_evenly() {
        let three = set(&["gap-healer-0", "gap-healer-1", "gap-healer-2"]);
        for (r, n) in shares(1000, &three) {
            assert!((290..=377).contains(&n), "{r}: {n} of 1000");
        }
        let reversed: BTreeSet<Replica> = three.iter().rev().copied().collect();
        assert_eq!(
            preferred("gap-healer:x", &three),
            preferred("gap-healer:x", &reversed)
        );
    }

    /// A replica that leaves takes only its own share with it: every other
    /// store keeps its preferred replica, and the leaver's stores spread
    /// over the rest.
    #[test]
    fn a_replica_that_leaves_moves_only_its_own_stores() {
        let three = set(&["a", "b", "c"]);
        let two = set(&["a", "b"]);
        let c = Replica::named("c");
        let mut moved_to = std::collections::BTreeMap::new();
        for i in 0..1000 {
            let key = format!("k{i}");
            let before = preferred(&key, &three).unwrap();
            let after = preferred(&key, &two).unwrap();
            if before != c {
                assert_eq!(before, after, "{key} moved though its replica stayed");
            } else {
                *moved_to.entry(after).or_insert(0) += 1;
            }
        }
        assert_eq!(moved_to.len(), 2, "{moved_to:?}");
        assert!(moved_to.values().all(|n| *n > 100), "{moved_to:?}");
    }

    #[test]
    fn a_roll_is_its_stores_in_any_order() {
        let a = || ["store\na".to_string(), "store\nb".to_string()];
        assert_eq!(roll_of(a()), roll_of(a().into_iter().rev()));
        assert_ne!(roll_of(a()), roll_of(["store\na".to_string()]));
    }

    #[test]
    fn names_give_stable_distinct_numbers() {
        assert_eq!(Replica::named("pod-0"), Replica::named("pod-0"));
        assert_ne!(Replica::named("pod-0"), Replica::named("pod-1"));
        // Pinned: replicas of different versions must agree.
        assert_eq!(Replica::named("gap-healer-0").to_string().len(), 8);
        assert!(Replica::default_name().contains('/'));
    }

    fn standing(held: bool, preferred: Replica, on_roll: bool) -> Standing {
        Standing {
            held,
            preferred,
            preferred_on_roll: on_roll,
        }
    }

    #[test]
    fn a_follower_tries_its_own_at_once_and_others_after_the_grace() {
        let me = Replica::new(0, 1);
        let other = Replica::new(0, 2);
        let t0 = Instant::now();
        let mut f = Follower::default();
        assert_eq!(f.turn(None, me, t0), Turn::Try, "no roll: as before");
        assert_eq!(f.turn(Some(&standing(true, me, true)), me, t0), Turn::Held);
        assert_eq!(f.turn(Some(&standing(false, me, true)), me, t0), Turn::Try);
        let free = standing(false, other, true);
        assert_eq!(f.turn(Some(&free), me, t0), Turn::LeaveTo(other));
        let later = t0 + TAKEOVER_GRACE - Duration::from_millis(1);
        assert_eq!(f.turn(Some(&free), me, later), Turn::LeaveTo(other));
        assert_eq!(
            f.turn(Some(&free), me, t0 + TAKEOVER_GRACE),
            Turn::Try,
            "free for the grace: taken"
        );
        // Held in between: the grace starts again.
        assert_eq!(
            f.turn(Some(&standing(true, other, true)), me, t0 + TAKEOVER_GRACE),
            Turn::Held
        );
        let again = t0 + TAKEOVER_GRACE * 2;
        assert_eq!(f.turn(Some(&free), me, again), Turn::LeaveTo(other));
    }

    #[test]
    fn a_leader_hands_over_only_to_a_preferred_replica_on_the_roll() {
        let me = Replica::new(0, 1);
        let other = Replica::new(0, 2);
        let t0 = Instant::now();
        let after = t0 + HANDOVER_AFTER;
        let mut h = Handovers::default();
        assert_eq!(h.due(&standing(true, me, true), me, t0, after), None);
        assert_eq!(
            h.due(&standing(true, other, false), me, t0, after),
            None,
            "the preferred replica is not on the roll"
        );
        assert_eq!(
            h.due(&standing(true, other, true), me, t0, t0),
            None,
            "just began leading"
        );
        assert_eq!(
            h.due(&standing(true, other, true), me, t0, after),
            Some(other)
        );
    }

    /// The 1,000-store run: a store handed to a replica that could not
    /// lead it yet came back and was kept for the whole 5-minute backoff.
    /// Now the wait after a failed hand-over starts at 30 s and doubles
    /// with each further failure, up to 5 minutes.
    #[test]
    fn a_failed_hand_over_is_tried_again_after_30_s_then_ever_less_often() {
        let me = Replica::new(0, 1);
        let other = Replica::new(0, 2);
        let to_other = standing(true, other, true);
        let mut h = Handovers::default();
        let mut now = Instant::now() + HANDOVER_AFTER;
        let since = now - HANDOVER_AFTER;
        assert_eq!(h.due(&to_other, me, since, now), Some(other));
        h.handed_over(other, now);
        let mut waits = Vec::new();
        for _ in 0..6 {
            // Back 4 s later (the 3 s grace and a turn): this replica leads
            // it again, and hands it over once the backoff has passed.
            let back = now + Duration::from_secs(4);
            let wait = h.backoff().unwrap();
            let ready = now + wait;
            assert_eq!(
                h.due(&to_other, me, back, ready - Duration::from_secs(1)),
                None,
                "within the {wait:?} backoff"
            );
            assert_eq!(h.due(&to_other, me, back, ready), Some(other));
            h.handed_over(other, ready);
            waits.push(wait.as_secs());
            now = ready;
        }
        assert_eq!(waits, [30, 60, 120, 240, 300, 300]);
    }

    #[test]
    fn hand_over_backoffs_start_again_once_the_store_was_led_by_its_preferred_replica() {
        let me = Replica::new(0, 1);
        let (b, c) = (Replica::new(0, 2), Replica::new(0, 3));
        let t0 = Instant::now();
        let mut h = Handovers::default();
        h.handed_over(b, t0);
        h.handed_over(b, t0 + Duration::from_secs(30));
        assert_eq!(h.backoff(), Some(Duration::from_secs(60)));
        // Another replica is preferred now (the roll changed): no waiting
        // on what happened with the first.
        let t1 = t0 + Duration::from_secs(40);
        assert_eq!(
            h.due(&standing(true, c, true), me, t1 - HANDOVER_AFTER, t1),
            Some(c)
        );
        // Led by its preferred replica (this one): forgotten.
        assert_eq!(h.due(&standing(true, me, true), me, t0, t1), None);
        assert_eq!(h.backoff(), None);
        assert_eq!(
            h.due(&standing(true, b, true), me, t1 - HANDOVER_AFTER, t1),
            Some(b)
        );
        // A store that comes back long after a hand-over (that one held)
        // starts at the first backoff again.
        let mut h = Handovers::default();
        h.handed_over(b, t0);
        h.handed_over(b, t0 + Duration::from_secs(3600));
        assert_eq!(h.backoff(), Some(HANDOVER_BACKOFF_FIRST));
    }

    #[test]
    fn a_standing_counts_this_replica_in_and_says_whether_the_preferred_is_on_the_roll() {
        let me = Replica::named("me");
        let roll = Roll {
            replicas: set(&["x", "y"]),
            held: [42].into(),
        };
        let s = Standing::of(&roll, "k", 42, me);
        assert!(s.held);
        let mut all = roll.replicas.clone();
        all.insert(me);
        assert_eq!(s.preferred, preferred("k", &all).unwrap());
        assert_eq!(s.preferred_on_roll, s.preferred != me);
        assert!(!Standing::of(&roll, "k", 7, me).held);
    }
}
