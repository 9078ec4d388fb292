//! The daemon loop: polls on the shared grid, fills the moment a hole is due, backs off on failing scans, and stops on the token.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::*;

impl<E: Engine> Healer<E> {
    /// The daemon loop: poll every `poll_interval`, fill each hole the moment
    /// it comes due, back off on database errors, stop on `stop`.
    pub async fn run(mut self, stop: CancellationToken) -> Ended {
        let mut backoff = Backoff::new(
            self.opts.poll_interval.max(Duration::from_millis(200)),
            Duration::from_secs(30),
        );
        let mut next_poll = Instant::now();
        let mut was_leader = self.leader.is_leader();
        // Since when every scan has failed (None after a success).
        let mut failing_since: Option<Instant> = None;
        let mut ended = Ended::Stopped;
        loop {
            self.health.loop_turned();
            let wake = match self.tracker.next_due() {
                Some(due) if self.leader.is_leader() || self.opts.dry_run => due.min(next_poll),
                _ => next_poll,
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
            if Instant::now() >= next_poll {
                let scan_started = Instant::now();
                let result = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = self.poll(next_poll) => r,
                };
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
                    ended = Ended::StartAboveHead {
                        from: start.after + 1,
                        head: start.head,
                    };
                    break;
                }
                match result {
                    Ok(step) => {
                        if backoff.attempts() > 0 {
                            info!("database reachable again");
                        }
                        backoff.reset();
                        failing_since = None;
                        // Behind (a backfill): go on at once instead of waiting a poll.
                        next_poll = if step.caught_up {
                            next_tick(self.opts.poll_interval)
                        } else {
                            Instant::now()
                        };
                        rechecked = Some(step.rechecked);
                        self.checkpoint_lag().await;
                    }
                    Err(e) => {
                        self.db_error(
                            if self.begun.is_none() {
                                Operation::Start
                            } else {
                                Operation::Scan
                            },
                            &e,
                        );
                        self.health.scan_failed(&e.message);
                        let delay = backoff.next_delay();
                        if e.is_transient() {
                            warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed");
                        } else {
                            error!(error = %e, retry_in_ms = delay.as_millis() as u64, "scan failed; this needs a change in the database (run `gap-healer check`)");
                        }
                        next_poll = Instant::now() + delay;
                        self.publish();
                        let since = *failing_since.get_or_insert(scan_started);
                        if let Some(limit) = self.opts.give_up_after {
                            // The last retry falls on the limit, not up to a
                            // backoff step after it.
                            next_poll = next_poll.min(since + limit);
                            let failing_for = since.elapsed();
                            if failing_for >= limit {
                                error!(
                                    failing_for_ms = failing_for.as_millis() as u64,
                                    give_up_after = %humantime::format_duration(limit),
                                    "every scan has failed for longer than give_up_after: giving up"
                                );
                                ended = Ended::GaveUp { failing_for };
                                break;
                            }
                        }
                        continue;
                    }
                }
            }
            let drained = {
                let mut log = LogOnly;
                let fill = self.fill_due_after(&stop, rechecked, &mut log);
                tokio::pin!(fill);
                tokio::select! {
                    _ = &mut fill => true,
                    _ = async { stop.cancelled().await; tokio::time::sleep(DRAIN_DEADLINE).await } => false,
                }
            };
            if !drained {
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
}
