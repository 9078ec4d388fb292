//! The daemon loop: polls on the shared grid, fills the moment a hole is
//! due, backs off on failing scans, and stops on the token.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::*;
use crate::backoff::Backoff;
use crate::engine::DbError;
use crate::telemetry::Operation;

/// When the loop polls next, and how its failing scans back off.
struct Polls {
    /// Grows with each failing scan, reset by a good one.
    backoff: Backoff,
    next_poll: Instant,
    /// Since when every scan has failed (`None` after a success).
    failing_since: Option<Instant>,
}

/// What a turn's poll came to.
enum Polled {
    /// The store was read; the fill step need not probe these again.
    Read(Rechecked),
    /// The scan failed: the next turn waits for the backoff.
    Failed,
    /// The loop ends.
    End(Ended),
}

impl<E: Engine> Healer<E> {
    /// The daemon loop: poll every `poll_interval`, fill each hole the moment
    /// it comes due, back off on database errors, stop on `stop`.
    pub async fn run(mut self, stop: CancellationToken) -> Ended {
        let mut pacing = Polls {
            backoff: self.pacing.scan_backoff(self.opts.poll_interval),
            next_poll: Instant::now(),
            failing_since: None,
        };
        let mut was_leader = self.leader.is_leader();
        let mut ended = Ended::Stopped;
        loop {
            self.sink.loop_turned();
            let wake = match self.tracker.next_due() {
                Some(due) if self.leader.is_leader() || self.opts.dry_run => {
                    due.min(pacing.next_poll)
                }
                _ => pacing.next_poll,
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.leader.changed() => {}
            }
            let is_leader = self.leader.is_leader();
            if is_leader != was_leader {
                info!(leader = is_leader, "leadership changed");
                was_leader = is_leader;
            }
            let mut rechecked = None;
            // A turn that polls shares the poll's readings (due on the
            // grid); one that only fills takes them fresh.
            let mut not_before = Instant::now();
            if not_before >= pacing.next_poll {
                let scan_started = Instant::now();
                not_before = pacing.next_poll;
                let result = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = self.poll(pacing.next_poll) => r,
                };
                match self.polled(result, scan_started, &mut pacing).await {
                    Polled::Read(fresh) => rechecked = Some(fresh),
                    Polled::Failed => continue,
                    Polled::End(why) => {
                        ended = why;
                        break;
                    }
                }
            }
            if !self.fill_turn(&stop, rechecked, not_before).await {
                warn!("shutdown deadline: abandoning the fill in flight (it rolls back)");
                break;
            }
            self.publish();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.publish_watermark() => {}
            }
        }
        self.publish();
        info!("healer stopped");
        ended
    }

    /// What the turn's poll, begun at `scan_started`, means for the loop
    /// and its pacing.
    async fn polled(
        &mut self,
        result: DbResult<ScanStep>,
        scan_started: Instant,
        pacing: &mut Polls,
    ) -> Polled {
        if let Some(start) = self
            .begun
            .map(|b| b.start)
            .filter(|s| s.above_head() && !s.empty)
        {
            error!(
                from = start.after + 1,
                head = start.head,
                start_from = %self.opts.start_from,
                "start_from is above the head of a table with events: not running, since no hole at or below the head would ever be examined"
            );
            return Polled::End(Ended::StartAboveHead {
                from: start.after + 1,
                head: start.head,
            });
        }
        match result {
            Ok(step) => {
                if pacing.backoff.attempts() > 0 {
                    info!("database reachable again");
                }
                pacing.backoff.reset();
                pacing.failing_since = None;
                // Behind (a backfill): go on at once instead of waiting a poll.
                pacing.next_poll = if step.caught_up {
                    next_tick(self.opts.poll_interval)
                } else {
                    Instant::now()
                };
                let examined = self.examined();
                let follows = self.follows();
                self.publisher
                    .checkpoint_lag(&*self.engine, examined, follows, &self.pacing, &self.sink)
                    .await;
                Polled::Read(step.rechecked)
            }
            Err(e) => self.scan_failed(&e, scan_started, pacing),
        }
    }

    /// A failed poll: counted, shown, and retried after the backoff, or
    /// the end once every scan has failed for `give_up_after`.
    fn scan_failed(&mut self, e: &DbError, scan_started: Instant, pacing: &mut Polls) -> Polled {
        let operation = if self.begun.is_none() {
            Operation::Start
        } else {
            Operation::Scan
        };
        self.sink.scan_failed(operation, e);
        let delay = pacing.backoff.next_delay();
        if e.is_transient() {
            warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed");
        } else {
            error!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed; {}", needs(e));
        }
        pacing.next_poll = Instant::now() + delay;
        self.publish();
        let since = *pacing.failing_since.get_or_insert(scan_started);
        if let Some(limit) = self.opts.give_up_after {
            // The last retry falls on the limit, not up to a
            // backoff step after it.
            pacing.next_poll = pacing.next_poll.min(since + limit);
            let failing_for = since.elapsed();
            if failing_for >= limit {
                error!(
                    failing_for_ms = failing_for.as_millis() as u64,
                    give_up_after = %humantime::format_duration(limit),
                    "every scan has failed for longer than give_up_after: giving up"
                );
                return Polled::End(Ended::GaveUp { failing_for });
            }
        }
        Polled::Failed
    }

    /// The turn's fills; `false` when shutdown's deadline abandoned the
    /// fill in flight.
    async fn fill_turn(
        &mut self,
        stop: &CancellationToken,
        rechecked: Option<Rechecked>,
        not_before: Instant,
    ) -> bool {
        let deadline = self.pacing.drain_deadline;
        let mut log = LogOnly;
        let fill = self.fill_due_after(stop, rechecked, not_before, &mut log);
        tokio::pin!(fill);
        tokio::select! {
            _ = &mut fill => true,
            _ = async { stop.cancelled().await; tokio::time::sleep(deadline).await } => false,
        }
    }
}

/// What a permanent scan failure asks of the operator: a refused login is
/// the connection string's credentials, anything else the database's
/// objects or rights (issue 27: a wrong password was "a change in the
/// database").
fn needs(e: &DbError) -> &'static str {
    match e.code.as_deref() {
        Some("28P01" | "28000" | "18456") => {
            "the login was refused: check the user and password the connection string gives (run `gap-healer check`)"
        }
        _ => "this needs a change in the database or its rights (run `gap-healer check`)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_login_is_the_credentials_not_the_database() {
        let login = |code: &str| DbError {
            kind: crate::engine::DbErrorKind::Permanent,
            code: Some(code.into()),
            message: String::new(),
            during: None,
        };
        for code in ["28P01", "28000", "18456"] {
            assert!(needs(&login(code)).contains("user and password"), "{code}");
        }
        assert!(needs(&login("42501")).contains("change in the database"));
    }
}
