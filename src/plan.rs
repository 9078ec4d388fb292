//! Fill planning: which statements one fill cycle runs for a due hole.
//!
//! Pure functions, so the rules are tested exhaustively without a database:
//! - positions an open append is known to hold are never in a plan;
//! - every statement covers at most `max_rows` positions (SQL Server lock
//!   escalation starts near 5,000 locks);
//! - scattered narrow holes share a transaction (at most `max_ranges` ranges);
//! - after a refusal the batch is split, never retried whole: a duplicate key
//!   removes the committed positions, a lock timeout halves the batch, so a
//!   wide range with one held key costs one short wait per halving level.

use std::time::Duration;

use crate::gaps::{FillLimits, PosRange};

/// The statements to try for `range`: its free positions in pieces of at most
/// `max_rows`, ascending. `excluded` are positions known to be held or
/// committed, ascending (duplicates allowed): only its part inside `range`
/// is looked at.
pub fn pieces(range: PosRange, excluded: &[i64], max_rows: u64) -> Vec<PosRange> {
    let max_rows = max_rows.max(1) as i64;
    range
        .without(within(excluded, range))
        .into_iter()
        .flat_map(|free| {
            (free.start()..=free.end())
                .step_by(max_rows as usize)
                .filter_map(move |s| PosRange::new(s, (s + max_rows - 1).min(free.end())))
        })
        .collect()
}

/// The part of `sorted` (ascending) that lies inside `range`, found by
/// binary search: planning a million due holes against a million excluded
/// positions stays n log n instead of n times m.
pub fn within(sorted: &[i64], range: PosRange) -> &[i64] {
    let from = sorted.partition_point(|p| *p < range.start());
    let to = sorted.partition_point(|p| *p <= range.end());
    &sorted[from..to.max(from)]
}

/// One fill transaction: ascending, disjoint ranges.
pub type Batch = Vec<PosRange>;

/// Groups ascending pieces into batches of at most `max_ranges` ranges whose
/// cost stays within `max_rows`, so scattered narrow holes cost one
/// transaction, not one each. A batch costs its positions plus `range_cost`
/// for each range after the first ([`cost`]): on SQL Server every range of a
/// batch may lock one more leaf page of the clustered key, and page locks
/// count towards lock escalation like key locks.
pub fn batches(pieces: &[PosRange], limits: FillLimits) -> Vec<Batch> {
    let FillLimits {
        rows: max_rows,
        ranges: max_ranges,
        range_cost,
    } = limits;
    let (max_rows, max_ranges) = (max_rows.max(1), max_ranges.max(1));
    let mut out: Vec<Batch> = Vec::new();
    let mut spent = 0;
    for piece in pieces {
        let fits = out.last().is_some_and(|b| {
            b.len() < max_ranges && spent + range_cost + piece.width() <= max_rows
        });
        if fits {
            spent += range_cost + piece.width();
        } else {
            out.push(Vec::new());
            spent = piece.width();
        }
        out.last_mut().expect("pushed above").push(*piece);
    }
    out
}

/// What a batch costs against `max_rows`: its positions, plus `range_cost`
/// for each range after the first (see [`batches`]).
pub fn cost(batch: &[PosRange], range_cost: u64) -> u64 {
    width(batch) + range_cost * (batch.len().max(1) as u64 - 1)
}

/// Positions in a batch.
pub fn width(batch: &[PosRange]) -> u64 {
    batch.iter().map(PosRange::width).sum()
}

/// What to do next with a batch whose fill was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Try these smaller batches now.
    Retry(Vec<Batch>),
    /// A single position is held: leave it for a later cycle.
    Defer(PosRange),
}

/// A fill of `batch` met a held key (lock timeout): split it in two, by
/// ranges while it has several, else by positions, down to one position.
pub fn after_held(batch: &[PosRange]) -> AfterRefusal {
    match batch {
        [] => AfterRefusal::Retry(vec![]),
        [one] => match one.halves() {
            Some((a, b)) => AfterRefusal::Retry(vec![vec![a], vec![b]]),
            None => AfterRefusal::Defer(*one),
        },
        many => {
            let (a, b) = many.split_at(many.len() / 2);
            AfterRefusal::Retry(vec![a.to_vec(), b.to_vec()])
        }
    }
}

/// A fill of `batch` met a committed key; `committed` is what a probe found
/// committed inside it since. If the probe found nothing there (the row was
/// visible to the insert's check but not yet to the read), split as for a
/// held key so the loop always makes progress.
pub fn after_committed(batch: &[PosRange], committed: &[i64], limits: FillLimits) -> AfterRefusal {
    let mut committed = committed.to_vec();
    committed.sort_unstable();
    committed.dedup();
    if batch.iter().all(|r| within(&committed, *r).is_empty()) {
        return after_held(batch);
    }
    let rest: Vec<PosRange> = batch
        .iter()
        .flat_map(|r| pieces(*r, &committed, limits.rows))
        .collect();
    AfterRefusal::Retry(batches(&rest, limits))
}

/// The lock timeout of a probe: every fill statement but a cycle's last
/// single position waits at most this long on a held key.
pub const PROBE: Duration = Duration::from_millis(25);

/// Lock timeout for one attempt: a short probe, so that finding the held keys
/// among thousands stays cheap, except for a single position that is the
/// cycle's last statement: the append there gets the configured wait to
/// finish (a late rollback is filled the moment it happens). Giving every
/// held position the full wait would make a storm of slow appends cost the
/// cycle one `lock_timeout` each while every other hole waits.
///
/// The probe is short because only one thing locks a hole's key: an append
/// that took that position and is still open after `gap_timeout` (the hole
/// is due), so waiting longer rarely changes the answer; a wrong "held" only
/// defers a position to the next cycle. Each probe that meets a held key
/// costs this long, and finding k held keys among n costs about
/// k x log2(n/k) of them.
pub fn lock_timeout_for(batch: &[PosRange], configured: Duration, last: bool) -> Duration {
    if width(batch) == 1 && last {
        configured
    } else {
        configured.min(PROBE)
    }
}

/// Every wait [`lock_timeout_for`] gives a fill with `configured`: the
/// configured one and the probe's, once each.
pub fn fill_lock_timeouts(configured: Duration) -> Vec<Duration> {
    let mut waits = vec![configured, configured.min(PROBE)];
    waits.dedup();
    waits
}

/// Splits the cycle's pieces in two: those that go into shared batches, and
/// single positions already found held by an earlier cycle, which are tried
/// alone after the rest. Batched with free holes, a known-held position would
/// refuse the whole batch and be searched for again, one probe per halving.
pub fn split_known_held(pieces: Vec<PosRange>, held: &[i64]) -> (Vec<PosRange>, Vec<PosRange>) {
    let mut held = held.to_vec();
    held.sort_unstable();
    pieces
        .into_iter()
        .partition(|p| !(p.width() == 1 && held.binary_search(&p.start()).is_ok()))
}

/// How many times a dirty read may show an open append at a due position
/// before the position's key decides instead.
pub const NOLOCK_SIGHTINGS: u32 = 3;

/// Whether a due position that a dirty read (SQL Server's `NOLOCK`) shows
/// in flight is left out of this cycle: yes for its first
/// [`NOLOCK_SIGHTINGS`] sightings while it is younger than twice
/// `gap_timeout`. After that the sighting is only advice: the position is
/// tried alone, after the cycle's other statements, and its key decides
/// (held, committed or filled). A row that stays visible to NOLOCK without
/// an append that can still commit (an aborted transaction's row that
/// accelerated database recovery has not cleaned up yet, a long rollback)
/// would otherwise keep the hole open for ever, while the key, the real
/// authority, was never asked.
pub fn trust_nolock(sightings: u32, age: Duration, gap_timeout: Duration) -> bool {
    sightings < NOLOCK_SIGHTINGS && age < gap_timeout.saturating_mul(2)
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

    fn limits(rows: u64, ranges: usize, range_cost: u64) -> FillLimits {
        FillLimits {
            rows,
            ranges,
            range_cost,
        }
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
        use AfterRefusal::*;
        assert_eq!(
            after_held(&[r(1, 10)]),
            Retry(vec![vec![r(1, 5)], vec![r(6, 10)]])
        );
        assert_eq!(after_held(&[r(7, 7)]), Defer(r(7, 7)));
        assert_eq!(
            after_held(&[r(1, 1), r(3, 3), r(5, 9)]),
            Retry(vec![vec![r(1, 1)], vec![r(3, 3), r(5, 9)]])
        );
        assert_eq!(
            after_committed(&[r(1, 10)], &[3], limits(100, 10, 0)),
            Retry(vec![vec![r(1, 2), r(4, 10)]])
        );
        assert_eq!(
            after_committed(&[r(1, 1)], &[1], limits(100, 10, 0)),
            Retry(vec![])
        );
        assert_eq!(
            after_committed(&[r(1, 10)], &[], limits(100, 10, 0)),
            Retry(vec![vec![r(1, 5)], vec![r(6, 10)]])
        );
    }

    #[test]
    fn scattered_holes_share_a_transaction() {
        let holes: Vec<PosRange> = (0..2_500).map(|i| r(i * 10, i * 10 + 1)).collect();
        let b = batches(&holes, limits(4_000, 1_000, 0));
        assert_eq!(
            b.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![1_000, 1_000, 500]
        );
        let b = batches(&[r(1, 3_000), r(5_000, 7_000)], limits(4_000, 1_000, 0));
        assert_eq!(
            b,
            vec![vec![r(1, 3_000)], vec![r(5_000, 7_000)]],
            "rows bound the batch too"
        );
        // SQL Server: each range after the first costs one more lock (a
        // leaf page of the clustered key), so 2,500 one-position holes make
        // batches of at most 2,000 ranges (2,000 + 1,999 <= 4,000).
        let singles: Vec<PosRange> = (0..2_500).map(|i| r(i * 10, i * 10)).collect();
        let b = batches(&singles, limits(4_000, 2_500, 1));
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), vec![2_000, 500]);
        assert!(b.iter().all(|b| cost(b, 1) <= 4_000));
        assert_eq!(cost(&[r(1, 4_000)], 1), 4_000, "one range costs its rows");
        assert_eq!(cost(&[r(1, 2), r(5, 5)], 1), 4);
        assert_eq!(cost(&[], 1), 0);
    }

    /// The commented example configuration states the probe's figure.
    #[test]
    fn the_example_configuration_states_the_probe() {
        let example = include_str!("../config/gap-healer.toml");
        let probe = format!("at most {}ms", PROBE.as_millis());
        assert!(
            example.contains(&probe),
            "config/gap-healer.toml lacks {probe:?}"
        );
    }

    #[test]
    fn timeouts_and_delays() {
        let two = Duration::from_secs(2);
        let probe = Duration::from_millis(25);
        assert_eq!(lock_timeout_for(&[r(1, 1)], two, true), two);
        assert_eq!(lock_timeout_for(&[r(1, 1)], two, false), probe);
        assert_eq!(lock_timeout_for(&[r(1, 2)], two, true), probe);
        assert_eq!(lock_timeout_for(&[r(1, 1), r(3, 3)], two, true), probe);
        assert_eq!(
            lock_timeout_for(&[r(1, 2)], Duration::from_millis(10), false),
            Duration::from_millis(10)
        );
        // Every wait a fill can be given, each once: what Babelfish compiles ahead.
        assert_eq!(fill_lock_timeouts(two), vec![two, probe]);
        let short = Duration::from_millis(10);
        assert_eq!(fill_lock_timeouts(short), vec![short]);
        let base = Duration::from_millis(250);
        assert_eq!(retry_delay(0, base, two), base);
        assert_eq!(retry_delay(2, base, two), Duration::from_secs(1));
        assert_eq!(retry_delay(40, base, two), two);
    }

    #[test]
    fn nolock_sightings_are_advice() {
        let gap = Duration::from_secs(5);
        let young = Duration::from_secs(6);
        assert!(trust_nolock(0, young, gap));
        assert!(trust_nolock(NOLOCK_SIGHTINGS - 1, young, gap));
        assert!(!trust_nolock(NOLOCK_SIGHTINGS, young, gap), "k sightings");
        assert!(
            !trust_nolock(0, Duration::from_secs(10), gap),
            "2 x gap_timeout old"
        );
        assert!(trust_nolock(0, Duration::from_millis(9_999), gap));
        assert!(!trust_nolock(0, Duration::ZERO, Duration::ZERO));
    }

    /// A model of the database: some positions committed, some held. Running
    /// the refusal rules to completion fills exactly the free positions, never
    /// a committed or held one, and each statement stays within its bounds.
    fn simulate(
        holes: &[PosRange],
        committed: &BTreeSet<i64>,
        held: &BTreeSet<i64>,
        max_rows: u64,
        max_ranges: usize,
        range_cost: u64,
    ) -> (BTreeSet<i64>, BTreeSet<i64>, usize) {
        let mut filled = BTreeSet::new();
        let mut deferred = BTreeSet::new();
        let all: Vec<PosRange> = holes
            .iter()
            .flat_map(|h| pieces(*h, &[], max_rows))
            .collect();
        let mut queue: Vec<Batch> = batches(&all, limits(max_rows, max_ranges, range_cost));
        let mut statements = 0;
        while let Some(next) = queue.pop() {
            statements += 1;
            assert!(cost(&next, range_cost) <= max_rows && next.len() <= max_ranges);
            let inside = |set: &BTreeSet<i64>| -> Vec<i64> {
                next.iter()
                    .flat_map(|r| set.range(r.start()..=r.end()).copied())
                    .collect()
            };
            let hits_committed = inside(committed);
            let after = if !hits_committed.is_empty() {
                after_committed(
                    &next,
                    &hits_committed,
                    limits(max_rows, max_ranges, range_cost),
                )
            } else if !inside(held).is_empty() {
                after_held(&next)
            } else {
                filled.extend(next.iter().flat_map(|r| r.start()..=r.end()));
                continue;
            };
            match after {
                AfterRefusal::Retry(more) => queue.extend(more),
                AfterRefusal::Defer(p) => {
                    deferred.insert(p.start());
                }
            }
        }
        (filled, deferred, statements)
    }

    #[test]
    fn one_held_key_in_ten_thousand_costs_log_statements() {
        let held: BTreeSet<i64> = [5_000].into();
        let (filled, deferred, statements) =
            simulate(&[r(1, 10_000)], &BTreeSet::new(), &held, 4_000, 1, 0);
        assert_eq!(filled.len(), 9_999);
        assert_eq!(deferred, held);
        assert!(statements <= 3 + 2 * 13, "{statements}");
    }

    proptest! {
        #[test]
        fn plans_fill_exactly_the_free_positions(
            starts in proptest::collection::btree_set(0i64..1_000, 1..8),
            width in 1i64..120,
            committed in proptest::collection::btree_set(0i64..1_200, 0..12),
            held in proptest::collection::btree_set(0i64..1_200, 0..6),
            max_rows in 1u64..300,
            max_ranges in 1usize..5,
            range_cost in 0u64..3,
        ) {
            // Disjoint holes from the starts.
            let mut holes: Vec<PosRange> = Vec::new();
            for s in starts {
                let lo = holes.last().map_or(s, |h: &PosRange| s.max(h.end() + 2));
                holes.push(r(lo, lo + width - 1));
            }
            let held: BTreeSet<i64> = held.difference(&committed).copied().collect();
            let (filled, deferred, _) = simulate(&holes, &committed, &held, max_rows, max_ranges, range_cost);
            let positions: BTreeSet<i64> = holes.iter().flat_map(|h| h.start()..=h.end()).collect();
            let free: BTreeSet<i64> = positions.iter().copied().filter(|p| !committed.contains(p) && !held.contains(p)).collect();
            prop_assert_eq!(filled, free);
            let held_inside: BTreeSet<i64> = positions.intersection(&held).copied().collect();
            prop_assert_eq!(deferred, held_inside);
        }

        #[test]
        fn pieces_partition(start in -100i64..100, width in 1i64..500, ex in proptest::collection::vec(-120i64..420, 0..10), max_rows in 1u64..64) {
            let range = r(start, start + width - 1);
            let mut ex = ex;
            ex.sort_unstable();
            let ps = pieces(range, &ex, max_rows);
            let got: Vec<i64> = ps.iter().flat_map(|p| p.start()..=p.end()).collect();
            let want: Vec<i64> = (range.start()..=range.end()).filter(|p| !ex.contains(p)).collect();
            prop_assert_eq!(got, want);
            prop_assert!(ps.iter().all(|p| p.width() <= max_rows));
        }
    }
}
