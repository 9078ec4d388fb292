//! What due holes wait for before they are filled: the [`Prover`] of the
//! transaction-end proof ([`crate::proof`]). A reading of the open
//! transactions is taken after a scan that found new holes (so a hole is
//! read with the smallest set: the appends open when it appeared) and when
//! a due hole is not yet proven; a due hole whose transactions have not all
//! ended waits for the next poll, and is never filled by a timeout.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{next_tick, FillReport, Options, Pacing, Sink};
use crate::engine::{Engine, OpenTransactions};
use crate::gaps::{Hole, PosRange, Tracker};
use crate::proof::{Proof, Waiting};
use crate::telemetry::{Operation, Outcome};

/// Positions examined remembered with the moment their page answered.
const SCANNED_KEPT: usize = 8;

/// The proof's phase: its state, and what it has said.
#[derive(Debug, Default)]
pub struct Prover {
    /// What the transactions that drew the tracked positions have done.
    proof: Proof,
    /// The latest positions examined and when their scan page answered
    /// (oldest first, a few): a reading that began after a page answered
    /// covers the positions up to it.
    scanned_at: VecDeque<(Instant, i64)>,
    /// The engine gives no reading of open transactions (SQL Server
    /// without `VIEW SERVER STATE`): its key order alone stands.
    key_order_only: bool,
    /// How far the identity had handed out at the latest reading, where
    /// the engine could say.
    handed_out: Option<i64>,
    /// Due holes wait for an open transaction first read at this moment
    /// (the oldest they wait for); `None` when none waits.
    blocked_since: Option<Instant>,
    /// The last "waiting for an open transaction" line: when, and for which.
    waits_logged: Option<(Instant, String)>,
}

impl Prover {
    /// A scan page answered at `at`: every position up to `examined` was
    /// handed out before then.
    pub fn examined(&mut self, at: Instant, examined: i64) {
        if self.scanned_at.back().is_some_and(|(_, e)| *e >= examined) {
            return;
        }
        if self.scanned_at.len() == SCANNED_KEPT {
            self.scanned_at.pop_front();
        }
        self.scanned_at.push_back((at, examined));
    }

    /// The highest position examined by a page that answered no later than
    /// `began`: each such position was drawn (or skipped for good) before
    /// `began`, and so was every position below it.
    fn examined_before(&self, began: Instant) -> i64 {
        self.scanned_at
            .iter()
            .rev()
            .find(|(at, _)| *at <= began)
            .map_or(i64::MIN, |(_, e)| *e)
    }

    /// Records a reading of the open transactions begun no earlier than
    /// `not_before`, unless one is recorded already. `false` when the
    /// reading failed (counted and logged).
    pub async fn read<E: Engine>(&mut self, engine: &E, not_before: Instant, sink: &Sink) -> bool {
        if self.proof.read_since(not_before) {
            return true;
        }
        match engine.open_transactions(not_before).await {
            Ok(OpenTransactions::Read(reading)) => {
                self.key_order_only = false;
                self.handed_out = reading.handed_out;
                let covered = reading
                    .handed_out
                    .unwrap_or_else(|| self.examined_before(reading.began));
                self.proof.record(&reading, covered, Instant::now());
                true
            }
            Ok(OpenTransactions::KeyOrderOnly) => {
                self.key_order_only = true;
                true
            }
            Err(e) => {
                sink.db_error(Operation::Transactions, &e);
                warn!(error = %e, "cannot read the open transactions: due holes wait for the next poll");
                false
            }
        }
    }

    /// The `due` holes that may be filled now (every transaction that may
    /// have drawn their positions has ended), reading the open transactions
    /// first when one is not proven; the rest wait for the next poll,
    /// counted in `report` and logged.
    #[allow(clippy::too_many_arguments)]
    pub async fn proven_due<E: Engine>(
        &mut self,
        engine: &E,
        due: Vec<Hole>,
        not_before: Instant,
        tracker: &mut Tracker,
        sink: &Sink,
        opts: &Options,
        pacing: &Pacing,
        report: &mut FillReport,
    ) -> Vec<Hole> {
        if due.iter().any(|h| h.range.end() > self.proof.proven()) {
            self.read(engine, not_before, sink).await;
        }
        if self.key_order_only {
            self.blocked_since = None;
            return due;
        }
        let proven = self.proof.proven();
        let mut ready = Vec::with_capacity(due.len());
        let mut waiting = Vec::new();
        let mut unhanded = Vec::new();
        for hole in due {
            let (below, rest) = split_at(hole.range, proven);
            if let Some(range) = below {
                ready.push(Hole { range, ..hole });
            }
            let Some(rest) = rest else { continue };
            // A hole seen before the latest reading began lies below a row
            // committed before it: a position above what that reading says
            // the identity had handed out was written past the identity.
            let seen_before = self
                .proof
                .last_began()
                .is_some_and(|b| hole.first_seen <= b);
            match self.handed_out.filter(|_| seen_before) {
                Some(handed_out) => {
                    let (within, above) = split_at(rest, handed_out);
                    waiting.extend(within);
                    unhanded.extend(above);
                }
                None => waiting.push(rest),
            }
        }
        self.wait_for_transactions(&waiting, tracker, sink, opts, pacing, report);
        self.refuse_unhanded(engine, &unhanded, tracker, sink, opts, pacing, report);
        ready
    }

    /// Due ranges above what the identity has handed out: rows were written
    /// above it, so these numbers will still be handed out to appends. Never
    /// filled; the store's fill is refused with the repair, and they are
    /// tried again with the error backoff.
    #[allow(clippy::too_many_arguments)]
    fn refuse_unhanded<E: Engine>(
        &self,
        engine: &E,
        above: &[PosRange],
        tracker: &mut Tracker,
        sink: &Sink,
        opts: &Options,
        pacing: &Pacing,
        report: &mut FillReport,
    ) {
        let (Some(first), Some(last), Some(handed_out)) =
            (above.first(), above.last(), self.handed_out)
        else {
            return;
        };
        let e = engine.above_identity(last.end(), handed_out);
        sink.filled(Outcome::Error, 0);
        report.errors += 1;
        sink.fill_refused(&e);
        warn!(range = %PosRange::new(first.start(), last.end()).unwrap_or(*first), error = %e, "fill refused; retrying later");
        tracker.back_off(above, Instant::now(), |retries| {
            pacing.error_retry(retries, opts.poll_interval)
        });
    }

    /// Due ranges that wait for an open transaction: tried again at the
    /// next poll (no retry counted: nothing was learnt about them).
    fn wait_for_transactions(
        &mut self,
        waiting: &[PosRange],
        tracker: &mut Tracker,
        sink: &Sink,
        opts: &Options,
        pacing: &Pacing,
        report: &mut FillReport,
    ) {
        let Some(lowest) = waiting.first() else {
            self.blocked_since = None;
            return;
        };
        let now = Instant::now();
        let at = next_tick(opts.poll_interval);
        for range in waiting {
            tracker.postpone(*range, at);
        }
        let positions: u64 = waiting.iter().map(PosRange::width).sum();
        report.open_transaction += positions;
        sink.filled(Outcome::OpenTransaction, 0);
        let oldest = self.proof.oldest_for(lowest.start(), now);
        self.blocked_since = Some(oldest.map_or(now, |(_, age)| now - age));
        let what = match self.proof.waiting_for(lowest.start()) {
            Waiting::Transactions(open) => open.len(),
            Waiting::Reading | Waiting::Nothing => 0,
        };
        let key = oldest.map_or_else(String::new, |(t, _)| t.id.clone());
        let again = match &self.waits_logged {
            Some((when, logged)) => {
                *logged != key || now.duration_since(*when) >= pacing.waits_every
            }
            None => true,
        };
        let (session, application, age_s) = oldest.map_or((None, None, 0), |(t, age)| {
            (t.session, t.application.clone(), age.as_secs())
        });
        if again {
            self.waits_logged = Some((now, key));
            info!(
                holes = waiting.len(),
                positions,
                lowest = lowest.start(),
                transactions = what,
                session = ?session,
                application = application.as_deref().unwrap_or(""),
                open_for_s = age_s,
                outcome = "open_transaction",
                "not filling yet: a transaction that may have drawn these positions is still open (it may be an append between its draw and its key); waiting for it to end"
            );
        } else {
            debug!(holes = waiting.len(), positions, lowest = lowest.start(), session = ?session, outcome = "open_transaction", "still waiting for an open transaction");
        }
    }

    /// How long the oldest transaction that due holes wait for has been
    /// open (since first read); zero when none, and once no tracked hole
    /// lies above what is proven.
    pub fn blocking_age(&self, tracker: &Tracker, now: Instant) -> Duration {
        let unproven = tracker
            .highest()
            .is_some_and(|h| h.range.end() > self.proof.proven());
        match self.blocked_since {
            Some(since) if unproven && !self.key_order_only => now.saturating_duration_since(since),
            _ => Duration::ZERO,
        }
    }
}

/// `range` cut after `at`: the part at or below it and the part above.
fn split_at(range: PosRange, at: i64) -> (Option<PosRange>, Option<PosRange>) {
    (
        PosRange::new(range.start(), range.end().min(at)),
        PosRange::new(range.start().max(at.saturating_add(1)), range.end()),
    )
}
