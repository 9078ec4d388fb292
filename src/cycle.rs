//! One fill cycle as a plan: from the due holes, a fresh probe of them and
//! the bounds of one statement, what the cycle fills in which statements,
//! what it defers, and what it takes as advice only.
//!
//! Pure, like [`crate::plan`] (whose rules it strings together), so a cycle
//! is tested without a database or a clock; the healer applies a [`Cycle`]
//! to its tracker in one step, then runs its statements. Invariants: no
//! statement holds a position the probe found committed or in flight (an
//! advised one only alone), or one at or above the head; every free
//! position of a due hole below the head is in exactly one statement.

use std::time::Duration;

use tokio::time::Instant;

use crate::gaps::{FillLimits, Hole, PosRange};
use crate::plan::{self, Batch};

/// The bounds of one fill statement (the engine's), and `gap_timeout`, on
/// which the age rule of dirty-read sightings is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub fill: FillLimits,
    pub gap_timeout: Duration,
}

/// A due position that a dirty read (SQL Server's `NOLOCK`) shows in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub position: i64,
    /// Earlier sightings of it (this one not counted).
    pub sightings: u32,
    /// Age of its hole since first seen.
    pub age: Duration,
}

/// What one fill cycle does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    /// Positions the probe found committed: forgotten.
    pub committed: Vec<i64>,
    /// In-flight positions whose sighting is trusted this time: deferred as
    /// held, with one more sighting counted; in no statement.
    pub held: Vec<Sighting>,
    /// In-flight positions seen too often or too long
    /// ([`plan::trust_nolock`]): the sighting is advice only, and each is
    /// tried alone, last, so that its key decides.
    pub advised: Vec<Sighting>,
    /// Pieces at or above the head: never filled, forgotten. Unreachable by
    /// construction (holes lie between committed rows), kept as a guard:
    /// filling there would move SQL Server's identity seed.
    pub refused: Vec<PosRange>,
    /// The statements in the order they run: the shared batches, then each
    /// position an earlier cycle found held, alone, then each advised one,
    /// alone (the cycle's last single position waits the full lock
    /// timeout, [`plan::lock_timeout_for`]).
    pub statements: Vec<Batch>,
}

/// Plans the cycle for `due` (ascending, disjoint: the tracker's), given a
/// fresh probe of them (`committed` and `in_flight` positions, any order)
/// and `head`, the highest committed position examined, at `now`.
pub fn plan(
    due: &[Hole],
    committed: &[i64],
    in_flight: &[i64],
    head: i64,
    now: Instant,
    limits: Limits,
) -> Cycle {
    let mut excluded: Vec<i64> = committed.iter().chain(in_flight).copied().collect();
    excluded.sort_unstable();
    excluded.dedup();
    let mut in_flight = in_flight.to_vec();
    in_flight.sort_unstable();
    in_flight.dedup();
    let mut cycle = Cycle {
        committed: committed.to_vec(),
        ..Cycle::default()
    };
    let mut pieces = Vec::new();
    for hole in due {
        let age = now.saturating_duration_since(hole.first_seen);
        for &position in plan::within(&in_flight, hole.range) {
            let seen = Sighting {
                position,
                sightings: hole.sightings,
                age,
            };
            if plan::trust_nolock(hole.sightings, age, limits.gap_timeout) {
                cycle.held.push(seen);
            } else {
                cycle.advised.push(seen);
            }
        }
        let (below, above): (Vec<PosRange>, Vec<PosRange>) =
            plan::pieces(hole.range, &excluded, limits.fill.rows)
                .into_iter()
                .partition(|piece| piece.end() < head);
        pieces.extend(below);
        cycle.refused.extend(above);
    }
    let retried: Vec<i64> = due
        .iter()
        .filter(|h| h.retries > 0 && h.range.width() == 1)
        .map(|h| h.range.start())
        .collect();
    let (shared, alone) = plan::split_known_held(pieces, &retried);
    cycle.statements = plan::batches(&shared, limits.fill);
    let advised = cycle.advised.iter().map(|s| PosRange::single(s.position));
    cycle
        .statements
        .extend(alone.into_iter().chain(advised).map(|p| vec![p]));
    cycle
}

/// What a fill statement answered, as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Every position of the batch holds a tombstone now.
    Filled { rows: u64 },
    /// An append committed inside the batch (a duplicate key).
    Committed,
    /// An open transaction holds a position of the batch past the lock timeout.
    Held,
    /// Another filler holds the tombstone stream, or this healer no longer
    /// leads: nothing was written.
    Busy,
    /// The table itself was locked past the lock timeout: no key was tried.
    TableLocked,
    /// The database failed the statement; `permanent`: retrying will not
    /// mend it.
    Failed { permanent: bool },
}

/// How the rest of a fill cycle waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A poll interval, counting a retry: it may be another filler's turn.
    Poll,
    /// Each range its error backoff: what broke will break the rest too.
    ErrorBackoff,
}

/// What a fill cycle does about one statement's answer: decided here,
/// pure; the healer applies it in one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// Forget the batch's ranges: they hold tombstones now.
    Forget,
    /// An append committed inside the batch: the cycle probes the batch (a
    /// statement of its own, never inside the reaction), forgets what
    /// committed and fills around it ([`plan::after_committed`]).
    ProbeThenRefill,
    /// Run these smaller batches next, or leave a held single position for
    /// a later cycle ([`plan::after_held`]).
    Then(plan::AfterRefusal),
    /// The batch and the rest of the cycle wait.
    DeferCycle(Wait),
}

/// The reaction to `answer` for `batch`.
pub fn react(answer: Answer, batch: &[PosRange]) -> Reaction {
    match answer {
        Answer::Filled { .. } => Reaction::Forget,
        Answer::Committed => Reaction::ProbeThenRefill,
        Answer::Held => Reaction::Then(plan::after_held(batch)),
        Answer::Busy => Reaction::DeferCycle(Wait::Poll),
        Answer::TableLocked | Answer::Failed { .. } => Reaction::DeferCycle(Wait::ErrorBackoff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = Duration::from_secs(5);

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
    }

    fn limits() -> Limits {
        Limits {
            fill: FillLimits {
                rows: 4,
                ranges: 3,
                range_cost: 0,
            },
            gap_timeout: GAP,
        }
    }

    fn hole(range: PosRange, seen: Instant, retries: u32, sightings: u32) -> Hole {
        Hole {
            range,
            first_seen: seen,
            not_before: seen + GAP,
            retries,
            sightings,
        }
    }

    #[test]
    fn committed_and_in_flight_positions_are_in_no_statement() {
        let now = Instant::now();
        let seen = now - GAP;
        let due = [hole(r(1, 10), seen, 0, 0), hole(r(20, 20), seen, 0, 0)];
        let cycle = plan(&due, &[3], &[7], 100, now, limits());
        assert_eq!(cycle.committed, vec![3]);
        assert_eq!(
            cycle.held,
            vec![Sighting {
                position: 7,
                sightings: 0,
                age: GAP
            }]
        );
        assert!(cycle.advised.is_empty() && cycle.refused.is_empty());
        // Pieces of at most 4 rows, batches of at most 3 ranges / 4 rows.
        assert_eq!(
            cycle.statements,
            vec![vec![r(1, 2)], vec![r(4, 6)], vec![r(8, 10), r(20, 20)]]
        );
    }

    #[test]
    fn a_sighting_seen_too_often_or_too_long_is_advice_tried_alone_last() {
        let now = Instant::now();
        let young = now - GAP;
        let old = now - GAP * 2;
        let due = [
            hole(r(1, 3), young, 0, 0),
            hole(r(5, 5), young, 0, plan::NOLOCK_SIGHTINGS),
            hole(r(7, 9), old, 0, 0),
        ];
        let cycle = plan(&due, &[], &[5, 8], 100, now, limits());
        assert!(cycle.held.is_empty());
        let advised: Vec<i64> = cycle.advised.iter().map(|s| s.position).collect();
        assert_eq!(advised, vec![5, 8]);
        assert_eq!(
            cycle.statements,
            vec![
                vec![r(1, 3), r(7, 7)],
                vec![r(9, 9)],
                vec![r(5, 5)],
                vec![r(8, 8)]
            ]
        );
    }

    #[test]
    fn a_position_held_before_goes_alone_after_the_shared_batches() {
        let now = Instant::now();
        let seen = now - GAP;
        let due = [hole(r(2, 2), seen, 1, 0), hole(r(4, 5), seen, 0, 0)];
        let cycle = plan(&due, &[], &[], 100, now, limits());
        assert_eq!(cycle.statements, vec![vec![r(4, 5)], vec![r(2, 2)]]);
    }

    #[test]
    fn each_answer_has_its_reaction() {
        let one = [r(4, 4)];
        let two = [r(1, 2)];
        assert_eq!(react(Answer::Filled { rows: 2 }, &two), Reaction::Forget);
        assert_eq!(react(Answer::Committed, &two), Reaction::ProbeThenRefill);
        assert_eq!(
            react(Answer::Held, &two),
            Reaction::Then(plan::AfterRefusal::Retry(vec![
                vec![r(1, 1)],
                vec![r(2, 2)]
            ]))
        );
        assert_eq!(
            react(Answer::Held, &one),
            Reaction::Then(plan::AfterRefusal::Defer(r(4, 4)))
        );
        assert_eq!(react(Answer::Busy, &one), Reaction::DeferCycle(Wait::Poll));
        for answer in [Answer::TableLocked, Answer::Failed { permanent: true }] {
            assert_eq!(
                react(answer, &one),
                Reaction::DeferCycle(Wait::ErrorBackoff)
            );
        }
    }

    #[test]
    fn nothing_at_or_above_the_head_is_filled() {
        let now = Instant::now();
        let due = [hole(r(1, 12), now - GAP, 0, 0)];
        let cycle = plan(&due, &[], &[], 9, now, limits());
        assert_eq!(cycle.refused, vec![r(9, 12)]);
        assert_eq!(cycle.statements, vec![vec![r(1, 4)], vec![r(5, 8)]]);
    }
}
