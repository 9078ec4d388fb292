//! The transaction-end proof: a hole's position is filled only once every
//! transaction that may have drawn it has ended.
//!
//! Why it holds, whatever the writer does between drawing a position and
//! inserting its key (triggers, CHECK constraints, defaults, policies,
//! expressions, COPY, a slow disk, a frozen backend): every transaction
//! that draws a position takes a lock before it draws and keeps it until
//! it ends (PostgreSQL: RowExclusiveLock on the identity's sequence, kept
//! through `ROLLBACK TO SAVEPOINT` and exception blocks; SQL Server: the
//! intent-exclusive lock on the table). A reading
//! ([`crate::engine::Engine::open_transactions`]) first learns how far the
//! identity had handed positions out (`covered`), then which transactions
//! hold that lock. A position at or below `covered` was drawn before the
//! locks were read, by a transaction that either had ended by then or is in
//! the reading. So once every transaction of a reading has ended (a later
//! reading no longer shows it), every position the reading covers belongs to
//! a transaction that has ended: committed (its key is there, and the fill
//! meets it as a duplicate) or rolled back (the position is free for good).
//!
//! The set of a reading is fixed, so no stream of new appends can renew it:
//! a hole waits only for the transactions that were open when it was read.
//!
//! Memory is bounded by the number of open transactions, not holes: a
//! transaction still open in an older reading is in every later one, so the
//! readings still waited for form a chain of strictly growing sets, and a
//! reading whose set equals the next one's is dropped (the next one covers
//! more and ends at the same moment).
//!
//! Pure: no database, no clock but the instants it is given.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::{OpenTransaction, TransactionReading};

/// A reading some of whose transactions are still open.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    /// Every position at or below it had been handed out before the reading.
    through: i64,
    /// The reading's transactions not yet seen to end.
    open: Vec<OpenTransaction>,
}

/// What a position waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting<'a> {
    /// Nothing: every transaction that may have drawn it has ended.
    Nothing,
    /// A reading that covers it: no reading since it was handed out.
    Reading,
    /// These transactions, of the first reading that covers it.
    Transactions(&'a [OpenTransaction]),
}

/// The proof's state for one store.
#[derive(Clone, Debug)]
pub struct Proof {
    /// Every position at or below it belongs to a transaction that has
    /// ended (or was never handed out and never will be).
    proven: i64,
    /// Readings still waited for, ascending by `through`, each one's set a
    /// strict subset of the next one's.
    pending: Vec<Pending>,
    /// When the latest reading recorded began.
    last_began: Option<Instant>,
    /// When each transaction still waited for was first read.
    first_read: HashMap<String, Instant>,
}

impl Default for Proof {
    fn default() -> Self {
        Proof {
            proven: i64::MIN,
            pending: Vec::new(),
            last_began: None,
            first_read: HashMap::new(),
        }
    }
}

impl Proof {
    pub fn new() -> Self {
        Proof::default()
    }

    /// Every position at or below it may be filled, as far as the proof
    /// goes (the fill's key check still decides).
    pub fn proven(&self) -> i64 {
        self.proven
    }

    /// Whether a reading that began at or after `not_before` is recorded.
    pub fn read_since(&self, not_before: Instant) -> bool {
        self.last_began.is_some_and(|b| b >= not_before)
    }

    /// When the latest reading recorded began.
    pub fn last_began(&self) -> Option<Instant> {
        self.last_began
    }

    /// Records `reading`, taken at `now`, which covers every position at or
    /// below `covered` (handed out before it began). A reading that began
    /// no later than one already recorded is ignored: its absences prove
    /// nothing about a transaction first read after it began. Returns
    /// whether it was recorded.
    pub fn record(&mut self, reading: &TransactionReading, covered: i64, now: Instant) -> bool {
        if self.last_began.is_some_and(|last| reading.began <= last) {
            return false;
        }
        self.last_began = Some(reading.began);
        let holders = &reading.open;
        for pending in &mut self.pending {
            pending.open = pending
                .open
                .iter()
                .filter_map(|t| still_open(t, holders))
                .collect();
        }
        let reach = self.pending.last().map_or(self.proven, |p| p.through);
        if covered > reach {
            let mut open: Vec<OpenTransaction> = Vec::with_capacity(holders.len());
            for t in holders {
                if !open.iter().any(|o: &OpenTransaction| o.same_as(t)) {
                    open.push(t.clone());
                }
            }
            self.pending.push(Pending {
                through: covered,
                open,
            });
        }
        if let Some(last_clear) = self.pending.iter().rposition(|p| p.open.is_empty()) {
            self.proven = self.proven.max(self.pending[last_clear].through);
            self.pending.drain(..=last_clear);
        }
        self.pending = drop_dominated(std::mem::take(&mut self.pending));
        for t in self.pending.iter().flat_map(|p| &p.open) {
            self.first_read.entry(t.id.clone()).or_insert(now);
        }
        let pending = &self.pending;
        self.first_read
            .retain(|id, _| pending.iter().any(|p| p.open.iter().any(|t| &t.id == id)));
        true
    }

    /// What `position` waits for before it may be filled.
    pub fn waiting_for(&self, position: i64) -> Waiting<'_> {
        if position <= self.proven {
            return Waiting::Nothing;
        }
        match self.pending.iter().find(|p| p.through >= position) {
            Some(p) => Waiting::Transactions(&p.open),
            None => Waiting::Reading,
        }
    }

    /// The transaction `position` has waited for longest, and how long
    /// since it was first read (at `now`); `None` when it waits for none.
    pub fn oldest_for(&self, position: i64, now: Instant) -> Option<(&OpenTransaction, Duration)> {
        let Waiting::Transactions(open) = self.waiting_for(position) else {
            return None;
        };
        // The first read first; among those read together, the first listed.
        open.iter()
            .map(|t| {
                let since = self.first_read.get(&t.id).copied().unwrap_or(now);
                (t, now.saturating_duration_since(since))
            })
            .fold(
                None,
                |oldest: Option<(&OpenTransaction, Duration)>, (t, age)| match oldest {
                    Some((_, best)) if best >= age => oldest,
                    _ => Some((t, age)),
                },
            )
    }

    /// Readings still waited for (a bound the tests hold).
    pub fn pending_readings(&self) -> usize {
        self.pending.len()
    }
}

/// `t` as the later reading `holders` shows it (a prepared transaction
/// keeps its transaction id under a new name), or `None` when it is not
/// there: it has ended.
fn still_open(t: &OpenTransaction, holders: &[OpenTransaction]) -> Option<OpenTransaction> {
    holders
        .iter()
        .find(|h| t.same_as(h))
        .map(|h| OpenTransaction {
            xid: h.xid.clone().or_else(|| t.xid.clone()),
            ..h.clone()
        })
}

/// The chain without each reading whose open set is the next one's: the
/// next covers more and ends with it.
fn drop_dominated(pending: Vec<Pending>) -> Vec<Pending> {
    let mut kept: Vec<Pending> = Vec::with_capacity(pending.len());
    for p in pending.into_iter().rev() {
        let same = kept.last().is_some_and(|next| {
            next.open.len() == p.open.len()
                && p.open
                    .iter()
                    .all(|t| next.open.iter().any(|n| n.same_as(t)))
        });
        if !same {
            kept.push(p);
        }
    }
    kept.reverse();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(id: &str) -> OpenTransaction {
        OpenTransaction {
            id: id.into(),
            xid: None,
            session: None,
            application: None,
        }
    }

    fn reading(began: Instant, open: &[&str]) -> TransactionReading {
        TransactionReading {
            began,
            handed_out: None,
            open: open.iter().map(|id| t(id)).collect(),
        }
    }

    fn ids(w: Waiting<'_>) -> Vec<String> {
        match w {
            Waiting::Transactions(open) => open.iter().map(|t| t.id.clone()).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn a_reading_with_no_open_transaction_proves_what_it_covers_at_once() {
        let now = Instant::now();
        let mut p = Proof::new();
        assert_eq!(p.waiting_for(5), Waiting::Reading);
        assert!(p.record(&reading(now, &[]), 10, now));
        assert_eq!(p.proven(), 10);
        assert_eq!(p.waiting_for(10), Waiting::Nothing);
        assert_eq!(p.waiting_for(11), Waiting::Reading);
    }

    #[test]
    fn a_hole_waits_for_the_transactions_open_when_it_was_read_and_no_others() {
        let t0 = Instant::now();
        let mut p = Proof::new();
        p.record(&reading(t0, &["a", "b"]), 10, t0);
        assert_eq!(ids(p.waiting_for(7)), ["a", "b"]);
        // New appends (c, d) come and stay open: they cannot hold 7.
        let t1 = t0 + Duration::from_secs(1);
        p.record(&reading(t1, &["b", "c", "d"]), 20, t1);
        assert_eq!(ids(p.waiting_for(7)), ["b"]);
        assert_eq!(ids(p.waiting_for(15)), ["b", "c", "d"]);
        let t2 = t1 + Duration::from_secs(1);
        p.record(&reading(t2, &["c", "d", "e"]), 30, t2);
        assert_eq!(
            p.proven(),
            10,
            "b has ended: 7 is proven, 15 waits for c and d"
        );
        assert_eq!(ids(p.waiting_for(15)), ["c", "d"]);
        assert_eq!(
            p.oldest_for(15, t2).map(|(t, age)| (t.id.clone(), age)),
            Some(("c".into(), Duration::from_secs(1)))
        );
    }

    #[test]
    fn an_older_reading_is_ignored() {
        let t0 = Instant::now();
        let mut p = Proof::new();
        p.record(&reading(t0 + Duration::from_secs(1), &["a"]), 10, t0);
        // Taken before: "a" is absent because it had not begun yet.
        assert!(!p.record(&reading(t0, &[]), 10, t0));
        assert_eq!(ids(p.waiting_for(5)), ["a"]);
    }

    #[test]
    fn a_prepared_transaction_is_followed_by_its_transaction_id() {
        let t0 = Instant::now();
        let mut p = Proof::new();
        let mut before = t("3/17");
        before.xid = Some("901".into());
        p.record(
            &TransactionReading {
                began: t0,
                handed_out: None,
                open: vec![before],
            },
            10,
            t0,
        );
        let mut prepared = t("-1/901");
        prepared.xid = Some("901".into());
        let t1 = t0 + Duration::from_secs(1);
        p.record(
            &TransactionReading {
                began: t1,
                handed_out: None,
                open: vec![prepared],
            },
            10,
            t1,
        );
        assert_eq!(ids(p.waiting_for(5)), ["-1/901"], "still open, prepared");
        let t2 = t1 + Duration::from_secs(1);
        p.record(&reading(t2, &[]), 10, t2);
        assert_eq!(p.waiting_for(5), Waiting::Nothing);
    }

    #[test]
    fn a_reading_that_covers_nothing_new_only_ends_transactions() {
        let t0 = Instant::now();
        let mut p = Proof::new();
        p.record(&reading(t0, &["a"]), 10, t0);
        let t1 = t0 + Duration::from_secs(1);
        p.record(&reading(t1, &["a", "b"]), 10, t1);
        assert_eq!(p.pending_readings(), 1);
        assert_eq!(ids(p.waiting_for(10)), ["a"]);
    }

    proptest! {
        /// Against a model that keeps every reading: a position is proven
        /// exactly when some reading that covers it has seen every one of
        /// its transactions end in a later reading; and the chain stays no
        /// longer than the transactions it waits for, plus one.
        #[test]
        fn matches_a_model_that_keeps_every_reading(
            steps in proptest::collection::vec(
                (proptest::collection::btree_set(0u8..12, 0..6), 0i64..4),
                1..40,
            ),
            probe in 0i64..200,
        ) {
            let t0 = Instant::now();
            let mut p = Proof::new();
            let mut model: Vec<(i64, Vec<u8>, usize)> = Vec::new();
            let mut covered = 0i64;
            let mut alive_since: HashMap<u8, usize> = HashMap::new();
            let mut history: Vec<std::collections::BTreeSet<u8>> = Vec::new();
            for (i, (open, step)) in steps.iter().enumerate() {
                // A transaction's name is never reused once it ends: give
                // a new run of the same small number a new name.
                let mut names = Vec::new();
                for n in open {
                    let run = match alive_since.get(n) {
                        Some(&since) if history.last().is_some_and(|h| h.contains(n)) => since,
                        _ => i,
                    };
                    alive_since.insert(*n, run);
                    names.push(format!("{n}@{run}"));
                }
                history.push(open.clone());
                covered += step;
                let at = t0 + Duration::from_millis(i as u64 + 1);
                let r = TransactionReading {
                    began: at,
                    handed_out: None,
                    open: names.iter().map(|s| t(s)).collect(),
                };
                p.record(&r, covered, at);
                model.push((covered, open.iter().copied().collect(), i));
                let waited: usize = p.pending.last().map_or(0, |l| l.open.len());
                prop_assert!(p.pending_readings() <= waited + 1);
            }
            // The model: reading k proves its coverage once each of its
            // transactions is absent from some later reading (that run
            // ended).
            let ended = |n: u8, k: usize| history[k + 1..].iter().any(|h| !h.contains(&n));
            let proven_by_model = model
                .iter()
                .filter(|(_, open, k)| open.iter().all(|n| ended(*n, *k)))
                .map(|(c, _, _)| *c)
                .max()
                .unwrap_or(i64::MIN);
            let position = probe.min(covered.max(1));
            prop_assert_eq!(
                p.waiting_for(position) == Waiting::Nothing,
                position <= proven_by_model,
                "position {}, proven {}, model {}", position, p.proven(), proven_by_model
            );
        }
    }
}
