//! Capped, jittered exponential backoff for retrying database failures.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The next delay: a random point in the upper half of
    /// `min(cap, base * 2^attempt)` ("equal jitter"), so a fleet of healers
    /// restarted together does not retry in lockstep.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_with_jitter_in_upper_half() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let ceilings = [100, 200, 400, 800, 1600, 2000, 2000, 2000];
        for ceiling in ceilings {
            let d = b.next_delay();
            let c = Duration::from_millis(ceiling);
            assert!(d >= c / 2 && d <= c, "{d:?} not in [{:?}, {c:?}]", c / 2);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
