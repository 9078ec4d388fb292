//! Every delay the healer waits, in one place: [`Pacing`].

use std::time::Duration;

use crate::backoff::Backoff;
use crate::plan;

/// Every delay the healer waits that its configuration does not name
/// directly, each a field with its default and the reason for it. The
/// configured ones (`gap_timeout`, `poll_interval`, `lock_timeout`,
/// `give_up_after`) are [`super::Options`]; the ones here derive from them
/// or stand alone. Nothing in the healer waits for a literal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// A failed scan's first retry waits at least this (the poll
    /// interval, if longer): a database that is restarting is not asked
    /// again at once.
    pub scan_backoff_floor: Duration,
    /// Failed scans back off, doubling, up to this: a store that comes back
    /// is noticed within it.
    pub scan_backoff_cap: Duration,
    /// A failed fill's first retry waits at least this (the poll interval,
    /// if longer): what broke (a connection, a right) rarely mends at once.
    pub error_retry_floor: Duration,
    /// Failed fills back off, doubling per retry, up to this: a broken
    /// store costs a statement every half minute, not one a poll.
    pub error_retry_cap: Duration,
    /// A held position is tried again after the poll interval, doubling per
    /// retry, up to the lock timeout or this if longer: an append open for
    /// minutes costs a try every few seconds, and its end is met soon after.
    pub held_retry_cap_floor: Duration,
    /// A dry run says a due hole again at most this often (or `gap_timeout`,
    /// if longer): it reports, it does not nag.
    pub dry_run_repeat: Duration,
    /// Checkpoints (for the lag figures only, which Prometheus scrapes every
    /// 15-60 s) are read again at most this often: a fleet of 500 stores at
    /// 5 s paid 200 queries a second for them.
    pub checkpoint_refresh: Duration,
    /// Shutdown waits this long for a fill in flight, then abandons it (it
    /// rolls back with its session): well below Kubernetes' 30 s grace.
    pub drain_deadline: Duration,
    /// A long fill cycle publishes its gauges this often, so they move
    /// while it runs.
    pub publish_every: Duration,
    /// A long fill cycle of the daemon says how far it is this often.
    pub progress_every: Duration,
    /// Fill cycles that wrote nothing are said at most this often, with
    /// their count: a held position retried every few seconds is one line a
    /// minute.
    pub quiet_every: Duration,
    /// Holes that keep waiting for the same open transaction are said again
    /// at most this often.
    pub waits_every: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            scan_backoff_floor: Duration::from_millis(200),
            scan_backoff_cap: Duration::from_secs(30),
            error_retry_floor: Duration::from_millis(500),
            error_retry_cap: Duration::from_secs(30),
            held_retry_cap_floor: Duration::from_secs(2),
            dry_run_repeat: Duration::from_secs(60),
            checkpoint_refresh: Duration::from_secs(15),
            drain_deadline: Duration::from_millis(1500),
            publish_every: Duration::from_secs(1),
            progress_every: Duration::from_secs(5),
            quiet_every: Duration::from_secs(60),
            waits_every: Duration::from_secs(60),
        }
    }
}

impl Pacing {
    /// The backoff of failing scans, polling every `poll`.
    pub fn scan_backoff(&self, poll: Duration) -> Backoff {
        Backoff::new(poll.max(self.scan_backoff_floor), self.scan_backoff_cap)
    }

    /// How long a failed fill's range waits after `retries` earlier ones.
    pub fn error_retry(&self, retries: u32, poll: Duration) -> Duration {
        plan::retry_delay(
            retries,
            poll.max(self.error_retry_floor),
            self.error_retry_cap,
        )
    }

    /// How long a held position waits after `retries` earlier tries.
    pub fn held_retry(&self, retries: u32, poll: Duration, lock_timeout: Duration) -> Duration {
        plan::retry_delay(retries, poll, lock_timeout.max(self.held_retry_cap_floor))
    }

    /// How long a dry run waits before it says a due hole again.
    pub fn dry_run_again(&self, gap_timeout: Duration) -> Duration {
        gap_timeout.max(self.dry_run_repeat)
    }
}
