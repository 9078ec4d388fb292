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
//! - a leader that is not the preferred replica of a store whose preferred
//!   replica is on the roll hands the store over ([`HANDOVER_AFTER`] after
//!   it began leading, at most once per [`HANDOVER_BACKOFF`] per store);
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

/// How long after handing a store over a replica leads it on before handing
/// it over again: a preferred replica that did not take it (it cannot fill
/// the store, say) costs a [`TAKEOVER_GRACE`] without a leader this often,
/// not every few seconds.
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

/// Whether a leader hands its store to the preferred replica now: that
/// replica is another one, on the roll, this one has led for
/// [`HANDOVER_AFTER`], and it has not handed the store over within
/// [`HANDOVER_BACKOFF`].
pub fn hand_over(
    standing: &Standing,
    me: Replica,
    leading_since: Instant,
    last_handover: Option<Instant>,
    now: Instant,
) -> Option<Replica> {
    let due = standing.preferred != me
        && standing.preferred_on_roll
        && now.duration_since(leading_since) >= HANDOVER_AFTER
        && last_handover.is_none_or(|at| now.duration_since(at) >= HANDOVER_BACKOFF);
    due.then_some(standing.preferred)
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
    fn a_leader_hands_over_only_to_a_preferred_replica_on_the_roll_and_not_often() {
        let me = Replica::new(0, 1);
        let other = Replica::new(0, 2);
        let t0 = Instant::now();
        let after = t0 + HANDOVER_AFTER;
        assert_eq!(
            hand_over(&standing(true, me, true), me, t0, None, after),
            None
        );
        assert_eq!(
            hand_over(&standing(true, other, false), me, t0, None, after),
            None,
            "the preferred replica is not on the roll"
        );
        assert_eq!(
            hand_over(&standing(true, other, true), me, t0, None, t0),
            None,
            "just began leading"
        );
        assert_eq!(
            hand_over(&standing(true, other, true), me, t0, None, after),
            Some(other)
        );
        assert_eq!(
            hand_over(&standing(true, other, true), me, t0, Some(t0), after),
            None,
            "handed over a moment ago"
        );
        assert_eq!(
            hand_over(
                &standing(true, other, true),
                me,
                t0,
                Some(t0),
                t0 + HANDOVER_BACKOFF
            ),
            Some(other)
        );
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
