//! Fill planning: which statements one fill cycle runs for a due hole.
//!
//! Pure functions, so the rules are tested exhaustively without a database:
//! - positions an open append is known to hold are never in a plan;
//! - every statement covers at most `max_rows` positions (SQL Server lock
//!   escalation starts near 5,000 locks);
//! - after a refusal the range is split, never retried whole: a duplicate key
//!   removes the committed positions, a lock timeout halves the range, so a
//!   wide range with one held key costs one short wait per halving level.

use std::time::Duration;

use crate::gaps::PosRange;

/// The statements to try for `range`: its free positions in pieces of at most
/// `max_rows`, ascending. `excluded` are positions known to be held or
/// committed (any order).
pub fn pieces(range: PosRange, excluded: &[i64], max_rows: u64) -> Vec<PosRange> {
    let max_rows = max_rows.max(1) as i64;
    range
        .without(excluded)
        .into_iter()
        .flat_map(|free| {
            (free.start..=free.end)
                .step_by(max_rows as usize)
                .map(move |s| PosRange {
                    start: s,
                    end: (s + max_rows - 1).min(free.end),
                })
        })
        .collect()
}

/// What to do next with a range whose fill was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Try these smaller ranges now.
    Retry(Vec<PosRange>),
    /// A single position is held: leave it for a later cycle.
    Defer(PosRange),
}

/// A fill of `range` met a held key (lock timeout).
pub fn after_held(range: PosRange) -> AfterRefusal {
    match range.halves() {
        Some((a, b)) => AfterRefusal::Retry(vec![a, b]),
        None => AfterRefusal::Defer(range),
    }
}

/// A fill of `range` met a committed key; `committed` is what a probe found
/// committed inside it since. If the probe found nothing (the row was visible
/// to the insert's check but not yet to the read), halve instead so the loop
/// always makes progress.
pub fn after_committed(range: PosRange, committed: &[i64], max_rows: u64) -> AfterRefusal {
    if committed.iter().any(|p| range.contains(*p)) {
        AfterRefusal::Retry(pieces(range, committed, max_rows))
    } else {
        after_held(range)
    }
}

/// Lock timeout for one attempt: the configured one for a single position
/// (the append there gets its full chance to finish), a short probe for wider
/// ranges so that finding one held key among thousands stays cheap.
pub fn lock_timeout_for(range: PosRange, configured: Duration) -> Duration {
    const PROBE: Duration = Duration::from_millis(100);
    if range.width() == 1 {
        configured
    } else {
        configured.min(PROBE)
    }
}

/// Delay before retrying a held or failed position: doubles from `base` per
/// retry, capped at `cap`.
pub fn retry_delay(retries: u32, base: Duration, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << retries.min(16)).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
    }

    #[test]
    fn wide_hole_in_chunks() {
        let p = pieces(r(1, 10_000), &[], 4_000);
        assert_eq!(p, vec![r(1, 4_000), r(4_001, 8_000), r(8_001, 10_000)]);
    }

    #[test]
    fn held_position_left_out() {
        let p = pieces(r(1, 10), &[5], 4_000);
        assert_eq!(p, vec![r(1, 4), r(6, 10)]);
    }

    #[test]
    fn refusals() {
        assert_eq!(
            after_held(r(1, 10)),
            AfterRefusal::Retry(vec![r(1, 5), r(6, 10)])
        );
        assert_eq!(after_held(r(7, 7)), AfterRefusal::Defer(r(7, 7)));
        assert_eq!(
            after_committed(r(1, 10), &[3], 100),
            AfterRefusal::Retry(vec![r(1, 2), r(4, 10)])
        );
        assert_eq!(
            after_committed(r(1, 1), &[1], 100),
            AfterRefusal::Retry(vec![])
        );
        assert_eq!(
            after_committed(r(1, 10), &[], 100),
            AfterRefusal::Retry(vec![r(1, 5), r(6, 10)])
        );
    }

    #[test]
    fn timeouts_and_delays() {
        let two = Duration::from_secs(2);
        assert_eq!(lock_timeout_for(r(1, 1), two), two);
        assert_eq!(lock_timeout_for(r(1, 2), two), Duration::from_millis(100));
        assert_eq!(
            lock_timeout_for(r(1, 2), Duration::from_millis(20)),
            Duration::from_millis(20)
        );
        let base = Duration::from_millis(250);
        assert_eq!(retry_delay(0, base, two), base);
        assert_eq!(retry_delay(2, base, two), Duration::from_secs(1));
        assert_eq!(retry_delay(40, base, two), two);
    }

    /// A model of the database: some positions committed, some held. Running
    /// the refusal rules to completion fills exactly the free positions, never
    /// a committed or held one, and each statement stays within max_rows.
    fn simulate(
        range: PosRange,
        committed: &BTreeSet<i64>,
        held: &BTreeSet<i64>,
        max_rows: u64,
    ) -> (BTreeSet<i64>, BTreeSet<i64>, usize) {
        let mut filled = BTreeSet::new();
        let mut deferred = BTreeSet::new();
        let mut queue: Vec<PosRange> = pieces(range, &[], max_rows);
        let mut statements = 0;
        while let Some(next) = queue.pop() {
            statements += 1;
            assert!(next.width() <= max_rows);
            let hits_committed: Vec<i64> =
                committed.range(next.start..=next.end).copied().collect();
            let hits_held = held.range(next.start..=next.end).next().is_some();
            let after = if !hits_committed.is_empty() {
                after_committed(next, &hits_committed, max_rows)
            } else if hits_held {
                after_held(next)
            } else {
                filled.extend(next.start..=next.end);
                continue;
            };
            match after {
                AfterRefusal::Retry(more) => queue.extend(more),
                AfterRefusal::Defer(p) => {
                    deferred.insert(p.start);
                }
            }
        }
        (filled, deferred, statements)
    }

    #[test]
    fn one_held_key_in_ten_thousand_costs_log_statements() {
        let held: BTreeSet<i64> = [5_000].into();
        let (filled, deferred, statements) = simulate(r(1, 10_000), &BTreeSet::new(), &held, 4_000);
        assert_eq!(filled.len(), 9_999);
        assert_eq!(deferred, held);
        assert!(statements <= 3 + 2 * 13, "{statements}");
    }

    proptest! {
        #[test]
        fn plans_fill_exactly_the_free_positions(
            start in 0i64..1_000, width in 1i64..600,
            committed in proptest::collection::btree_set(0i64..1_700, 0..12),
            held in proptest::collection::btree_set(0i64..1_700, 0..6),
            max_rows in 1u64..300,
        ) {
            let range = r(start, start + width - 1);
            let held: BTreeSet<i64> = held.difference(&committed).copied().collect();
            let (filled, deferred, _) = simulate(range, &committed, &held, max_rows);
            let free: BTreeSet<i64> = (range.start..=range.end).filter(|p| !committed.contains(p) && !held.contains(p)).collect();
            prop_assert_eq!(filled, free);
            let held_inside: BTreeSet<i64> = held.range(range.start..=range.end).copied().collect();
            prop_assert_eq!(deferred, held_inside);
        }

        #[test]
        fn pieces_partition(start in -100i64..100, width in 1i64..500, ex in proptest::collection::vec(-120i64..420, 0..10), max_rows in 1u64..64) {
            let range = r(start, start + width - 1);
            let ps = pieces(range, &ex, max_rows);
            let got: Vec<i64> = ps.iter().flat_map(|p| p.start..=p.end).collect();
            let want: Vec<i64> = (range.start..=range.end).filter(|p| !ex.contains(p)).collect();
            prop_assert_eq!(got, want);
            prop_assert!(ps.iter().all(|p| p.width() <= max_rows));
        }
    }
}
