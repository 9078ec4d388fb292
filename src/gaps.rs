//! Holes, tracked as ranges.
//!
//! A [`Tracker`] remembers every hole the healer has seen and not yet seen
//! filled, as `(start, end, first_seen)` ranges: a 10,000-wide identity jump is
//! one entry, so memory is bounded by the number of ranges, never by positions.
//!
//! Architecture invariant: a range enters only from a scan (positions between
//! two committed rows), keeps the `first_seen` of the scan that found it
//! through every split, and leaves only when the database says its positions
//! are committed or filled.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// How much one fill statement of an engine may take, in ranges and rows:
/// what the planner cuts the due holes to ([`crate::plan::batches`]). The
/// engine says it ([`crate::engine::Engine::fill_limits`]); it lives here,
/// with the ranges, because both the engines and the planner speak of it and
/// the engines import nothing but this module and `secret`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillLimits {
    /// Rows per statement. SQL Server keeps this below lock escalation
    /// (about 5,000 locks); PostgreSQL can take more.
    pub rows: u64,
    /// Most ranges one statement may cover (scattered narrow holes are
    /// filled together). 1 for an engine that fills one range at a time.
    pub ranges: usize,
    /// What each range of a batch after the first costs against `rows`,
    /// besides its rows: 1 on SQL Server, where each range may lock one more
    /// leaf page of the clustered key and page locks count towards lock
    /// escalation; 0 where nothing escalates.
    pub range_cost: u64,
}

/// An inclusive range of positions, `start <= end`: made only by
/// [`PosRange::new`] (or [`PosRange::single`]), which checks it, so no range
/// elsewhere can be empty or reversed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct PosRange {
    start: i64,
    end: i64,
}

impl PosRange {
    /// `None` when `start > end`.
    pub fn new(start: i64, end: i64) -> Option<Self> {
        (start <= end).then_some(PosRange { start, end })
    }

    /// The first position.
    pub fn start(&self) -> i64 {
        self.start
    }

    /// The last position.
    pub fn end(&self) -> i64 {
        self.end
    }

    pub fn single(p: i64) -> Self {
        PosRange { start: p, end: p }
    }

    /// Number of positions.
    pub fn width(&self) -> u64 {
        (self.end - self.start) as u64 + 1
    }

    pub fn contains(&self, p: i64) -> bool {
        self.start <= p && p <= self.end
    }

    pub fn overlaps(&self, other: &PosRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// The two halves of a range of two or more positions.
    pub fn halves(&self) -> Option<(PosRange, PosRange)> {
        (self.start < self.end).then(|| {
            let mid = self.start + (self.end - self.start) / 2;
            (
                PosRange {
                    start: self.start,
                    end: mid,
                },
                PosRange {
                    start: mid + 1,
                    end: self.end,
                },
            )
        })
    }

    /// This range without the given positions (any order, duplicates allowed).
    pub fn without(&self, positions: &[i64]) -> Vec<PosRange> {
        let mut inside: Vec<i64> = positions
            .iter()
            .copied()
            .filter(|p| self.contains(*p))
            .collect();
        inside.sort_unstable();
        inside.dedup();
        let mut out = Vec::with_capacity(inside.len() + 1);
        let mut next = self.start;
        for p in inside {
            if let Some(r) = PosRange::new(next, p - 1) {
                out.push(r);
            }
            next = p + 1;
        }
        if let Some(r) = PosRange::new(next, self.end) {
            out.push(r);
        }
        out
    }

    /// Consecutive runs of sorted, deduplicated positions.
    pub fn runs(sorted: &[i64]) -> Vec<PosRange> {
        let mut out: Vec<PosRange> = Vec::new();
        for &p in sorted {
            match out.last_mut() {
                Some(last) if last.end + 1 == p => last.end = p,
                Some(last) if last.end >= p => {}
                _ => out.push(PosRange::single(p)),
            }
        }
        out
    }
}

impl std::fmt::Display for PosRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}..={}", self.start, self.end)
        }
    }
}

/// A tracked hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hole {
    pub range: PosRange,
    /// When a scan first saw it missing: the age that `gap_timeout` is measured on.
    pub first_seen: Instant,
    /// Earliest moment a fill may be tried: `first_seen + gap_timeout`, pushed
    /// later after a held or failed attempt.
    pub not_before: Instant,
    /// Fill attempts that found a position held or failed, for retry backoff.
    pub retries: u32,
    /// Times a dirty read (SQL Server's `NOLOCK`) showed an open append at
    /// this position when it came due, so it was left out of the fill.
    /// Advisory only: after a few, the position's key decides
    /// ([`crate::plan::trust_nolock`]).
    pub sightings: u32,
}

/// Summary figures for metrics and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub holes: usize,
    pub positions: u64,
    pub lowest: Option<i64>,
    pub oldest_first_seen: Option<Instant>,
}

/// Every hole seen and not yet known to be filled, keyed by start.
#[derive(Debug, Default)]
pub struct Tracker {
    holes: BTreeMap<i64, Hole>,
}

impl Tracker {
    pub fn new() -> Self {
        Tracker::default()
    }

    pub fn len(&self) -> usize {
        self.holes.len()
    }

    /// The highest hole.
    pub fn highest(&self) -> Option<&Hole> {
        self.holes.values().next_back()
    }

    /// The first position of the lowest hole.
    pub fn lowest(&self) -> Option<i64> {
        self.holes.keys().next().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.holes.is_empty()
    }

    pub fn holes(&self) -> impl Iterator<Item = &Hole> {
        self.holes.values()
    }

    pub fn ranges(&self) -> Vec<PosRange> {
        self.holes.values().map(|h| h.range).collect()
    }

    /// Up to `limit` ranges in position order from the first that starts
    /// after `after`, wrapping round to the lowest: a bounded slice of the
    /// tracker for a re-check, taken in turns.
    pub fn ranges_after(&self, after: i64, limit: usize) -> Vec<PosRange> {
        let tail = self
            .holes
            .range(after.saturating_add(1)..)
            .map(|(_, h)| h.range);
        let head = self.holes.range(..=after).map(|(_, h)| h.range);
        tail.chain(head).take(limit).collect()
    }

    /// Records a hole a scan just found. A range overlapping one already
    /// tracked keeps the older `first_seen` for the overlap (a rescan must not
    /// make a hole younger).
    pub fn observe(&mut self, range: PosRange, now: Instant, gap_timeout: Duration) {
        let mut pieces = vec![range];
        for h in self.overlapping(range) {
            pieces = pieces
                .iter()
                .flat_map(|p| p.without_range(h.range))
                .collect();
        }
        for r in pieces {
            self.holes.insert(
                r.start,
                Hole {
                    range: r,
                    first_seen: now,
                    not_before: now + gap_timeout,
                    retries: 0,
                    sightings: 0,
                },
            );
        }
    }

    /// Forgets the given positions (committed by an append, or filled).
    pub fn remove_positions(&mut self, positions: &[i64]) {
        let mut sorted = positions.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for r in PosRange::runs(&sorted) {
            self.remove(r);
        }
    }

    /// Forgets a range of positions, splitting the holes it cuts.
    pub fn remove(&mut self, range: PosRange) {
        for h in self.overlapping(range) {
            self.holes.remove(&h.range.start);
            for rest in h.range.without_range(range) {
                self.holes.insert(rest.start, Hole { range: rest, ..h });
            }
        }
    }

    /// Pushes the next attempt on the positions of `range` to `at`, counting a
    /// retry. Splits holes so only `range` is deferred.
    pub fn defer(&mut self, range: PosRange, at: Instant) {
        self.push_back(range, at, 1);
    }

    /// Pushes each range's next attempt back by the delay its retries so
    /// far give (`delay(retries)`, from `now`), counting one more retry.
    pub fn back_off(&mut self, ranges: &[PosRange], now: Instant, delay: impl Fn(u32) -> Duration) {
        for range in ranges {
            let wait = delay(self.retries_at(range.start()));
            self.defer(*range, now + wait);
        }
    }

    /// Pushes the next attempt on the positions of `range` to `at` without
    /// counting a retry: nothing about the positions was learnt (a writer
    /// of the table was waiting), so their backoff does not grow.
    pub fn postpone(&mut self, range: PosRange, at: Instant) {
        self.push_back(range, at, 0);
    }

    fn push_back(&mut self, range: PosRange, at: Instant, retries: u32) {
        for h in self.overlapping(range) {
            self.holes.remove(&h.range.start);
            for rest in h.range.without_range(range) {
                self.holes.insert(rest.start, Hole { range: rest, ..h });
            }
            let start = h.range.start.max(range.start);
            let end = h.range.end.min(range.end);
            self.holes.insert(
                start,
                Hole {
                    range: PosRange { start, end },
                    not_before: at.max(h.not_before),
                    retries: h.retries + retries,
                    ..h
                },
            );
        }
    }

    /// Retries so far of the hole holding `position` (0 when none does).
    pub fn retries_at(&self, position: i64) -> u32 {
        self.hole_at(position).map_or(0, |h| h.retries)
    }

    /// NOLOCK sightings so far of the hole holding `position` (0 when none does).
    pub fn sightings_at(&self, position: i64) -> u32 {
        self.hole_at(position).map_or(0, |h| h.sightings)
    }

    /// Counts one more NOLOCK sighting at `position`, which is split off
    /// into a hole of its own first (the rest of its hole keeps its count).
    pub fn add_sighting(&mut self, position: i64) {
        let Some(h) = self.hole_at(position).copied() else {
            return;
        };
        let single = PosRange::single(position);
        self.holes.remove(&h.range.start);
        for rest in h.range.without_range(single) {
            self.holes.insert(rest.start, Hole { range: rest, ..h });
        }
        self.holes.insert(
            position,
            Hole {
                range: single,
                sightings: h.sightings.saturating_add(1),
                ..h
            },
        );
    }

    fn hole_at(&self, position: i64) -> Option<&Hole> {
        self.holes
            .range(..=position)
            .next_back()
            .map(|(_, h)| h)
            .filter(|h| h.range.contains(position))
    }

    /// The latest moment any tracked hole comes due.
    pub fn last_due(&self) -> Option<Instant> {
        self.holes.values().map(|h| h.not_before).max()
    }

    /// Holes whose fill may be tried at `now`, lowest first.
    pub fn due(&self, now: Instant) -> Vec<Hole> {
        self.holes
            .values()
            .filter(|h| h.not_before <= now)
            .copied()
            .collect()
    }

    /// The earliest moment any tracked hole comes due.
    pub fn next_due(&self) -> Option<Instant> {
        self.holes.values().map(|h| h.not_before).min()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            holes: self.holes.len(),
            positions: self.holes.values().map(|h| h.range.width()).sum(),
            lowest: self.lowest(),
            oldest_first_seen: self.holes.values().map(|h| h.first_seen).min(),
        }
    }

    fn overlapping(&self, range: PosRange) -> Vec<Hole> {
        // A hole overlapping `range` starts at or before range.end; walk back
        // from there while holes still reach into the range. Holes never
        // overlap each other, so the walk stops at the first one that ends
        // before range.start.
        let mut found: Vec<Hole> = self
            .holes
            .range(..=range.end)
            .rev()
            .take_while(|(_, h)| h.range.end >= range.start)
            .map(|(_, h)| *h)
            .collect();
        found.reverse();
        found
    }
}

impl PosRange {
    /// This range without the positions of `other`: zero, one or two pieces.
    pub fn without_range(&self, other: PosRange) -> Vec<PosRange> {
        if !self.overlaps(&other) {
            return vec![*self];
        }
        [
            PosRange::new(self.start, other.start - 1),
            PosRange::new(other.end + 1, self.end),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const T: Duration = Duration::from_secs(5);

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
    }

    fn positions(t: &Tracker) -> BTreeSet<i64> {
        t.holes()
            .flat_map(|h| h.range.start..=h.range.end)
            .collect()
    }

    #[test]
    fn wide_hole_is_one_entry() {
        let mut t = Tracker::new();
        let now = Instant::now();
        t.observe(r(1_000, 10_999), now, T);
        assert_eq!(t.len(), 1);
        assert_eq!(t.stats().positions, 10_000);
    }

    #[test]
    fn remove_splits_and_keeps_first_seen() {
        let mut t = Tracker::new();
        let now = Instant::now();
        t.observe(r(10, 20), now, T);
        t.remove_positions(&[15, 10, 16]);
        assert_eq!(t.ranges(), vec![r(11, 14), r(17, 20)]);
        assert!(t
            .holes()
            .all(|h| h.first_seen == now && h.not_before == now + T));
    }

    #[test]
    fn rescan_does_not_make_a_hole_younger() {
        let mut t = Tracker::new();
        let early = Instant::now();
        t.observe(r(10, 20), early, T);
        let later = early + Duration::from_secs(3);
        t.observe(r(5, 25), later, T);
        let by_start: Vec<(PosRange, Instant)> =
            t.holes().map(|h| (h.range, h.first_seen)).collect();
        assert_eq!(
            by_start,
            vec![(r(5, 9), later), (r(10, 20), early), (r(21, 25), later)]
        );
    }

    #[test]
    fn due_respects_gap_timeout_and_defer() {
        let mut t = Tracker::new();
        let now = Instant::now();
        t.observe(r(1, 3), now, T);
        assert!(t.due(now + T - Duration::from_millis(1)).is_empty());
        assert_eq!(t.due(now + T).len(), 1);
        t.defer(r(2, 2), now + T * 2);
        assert_eq!(
            t.due(now + T).iter().map(|h| h.range).collect::<Vec<_>>(),
            vec![r(1, 1), r(3, 3)]
        );
        assert_eq!(t.next_due(), Some(now + T));
        assert_eq!(t.due(now + T * 2).len(), 3);
        assert_eq!(t.holes().find(|h| h.range == r(2, 2)).unwrap().retries, 1);
    }

    #[test]
    fn sightings_belong_to_one_position() {
        let mut t = Tracker::new();
        let now = Instant::now();
        t.observe(r(1, 10), now, T);
        t.add_sighting(4);
        t.add_sighting(4);
        t.add_sighting(42); // not tracked: nothing happens
        assert_eq!(t.ranges(), vec![r(1, 3), r(4, 4), r(5, 10)]);
        assert_eq!(
            (t.sightings_at(4), t.sightings_at(3), t.sightings_at(5)),
            (2, 0, 0)
        );
        assert!(t.holes().all(|h| h.first_seen == now));
        t.defer(r(4, 4), now + T);
        assert_eq!(t.sightings_at(4), 2, "a deferral keeps the count");
        t.remove(r(4, 4));
        assert_eq!(t.sightings_at(4), 0);
    }

    #[test]
    fn runs_and_without() {
        assert_eq!(
            PosRange::runs(&[1, 2, 3, 5, 7, 8]),
            vec![r(1, 3), r(5, 5), r(7, 8)]
        );
        assert_eq!(r(1, 10).without(&[1, 5, 10, 42]), vec![r(2, 4), r(6, 9)]);
        assert_eq!(r(1, 1).without(&[1]), vec![]);
        assert_eq!(r(1, 10).halves(), Some((r(1, 5), r(6, 10))));
        assert_eq!(r(4, 4).halves(), None);
    }

    proptest! {
        /// Whatever sequence of observe/remove/defer, the tracked positions are
        /// exactly the model set, holes never overlap, and memory is one entry
        /// per maximal run at most.
        #[test]
        fn tracker_matches_a_set_model(ops in proptest::collection::vec((0u8..3, 0i64..200, 0i64..40), 1..60)) {
            let mut t = Tracker::new();
            let mut model = BTreeSet::new();
            let now = Instant::now();
            for (op, a, w) in ops {
                let range = r(a, a + w);
                match op {
                    0 => { t.observe(range, now, T); model.extend(a..=a + w); }
                    1 => { t.remove(range); for p in a..=a + w { model.remove(&p); } }
                    _ => t.defer(range, now + T),
                }
                prop_assert_eq!(positions(&t), model.clone());
                let ranges = t.ranges();
                for pair in ranges.windows(2) {
                    prop_assert!(pair[0].end < pair[1].start);
                }
                prop_assert_eq!(t.stats().positions as usize, model.len());
            }
        }

        #[test]
        fn without_partitions(a in -50i64..50, w in 0i64..100, ps in proptest::collection::vec(-60i64..160, 0..20)) {
            let range = r(a, a + w);
            let pieces = range.without(&ps);
            let got: BTreeSet<i64> = pieces.iter().flat_map(|p| p.start..=p.end).collect();
            let want: BTreeSet<i64> = (a..=a + w).filter(|p| !ps.contains(p)).collect();
            prop_assert_eq!(got, want);
            for pair in pieces.windows(2) { prop_assert!(pair[0].end + 1 < pair[1].start); }
        }
    }

    #[test]
    fn ranges_after_takes_a_bounded_slice_in_turns() {
        let mut t = Tracker::new();
        let now = Instant::now();
        for p in [10, 20, 30, 40] {
            t.observe(PosRange::single(p), now, Duration::ZERO);
        }
        let starts = |v: Vec<PosRange>| v.iter().map(|r| r.start).collect::<Vec<_>>();
        assert_eq!(starts(t.ranges_after(i64::MIN, 2)), vec![10, 20]);
        assert_eq!(starts(t.ranges_after(20, 2)), vec![30, 40]);
        assert_eq!(
            starts(t.ranges_after(40, 3)),
            vec![10, 20, 30],
            "wraps round"
        );
        assert_eq!(
            starts(t.ranges_after(25, 10)),
            vec![30, 40, 10, 20],
            "each once"
        );
    }
}
