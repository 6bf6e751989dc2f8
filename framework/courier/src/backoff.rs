//! Exponential backoff with full jitter, shared by polling, publish retries and restarts.
//!
//! Full jitter (a uniform draw in `[0, min(cap, base * 2^attempt)]`) spreads retries of many
//! keys or processes apart instead of letting them retry in lockstep.

use rand::Rng;
use std::time::Duration;

/// An exponential backoff schedule: `base * 2^attempt`, capped at `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay ceiling of the first attempt.
    pub base: Duration,
    /// Largest delay ever returned.
    pub cap: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// The ceiling for `attempt` (0-based): `min(cap, base * 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        // 2^31 already exceeds any sane cap; clamping avoids overflow.
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A full-jitter delay for `attempt`: uniform in `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, &mut rand::thread_rng())
    }

    /// An equal-jitter delay for `attempt`: uniform in `[ceiling/2, ceiling]`. Retries still
    /// spread apart, and `retries` of them are sure to span [`Backoff::least_total`].
    pub fn spread_delay(&self, attempt: u32) -> Duration {
        let half = self.ceiling(attempt) / 2;
        half + Backoff::new(half, half).delay(0)
    }

    /// The shortest time `retries` equal-jitter delays can add up to.
    pub fn least_total(&self, retries: u32) -> Duration {
        (0..retries).map(|a| self.ceiling(a) / 2).sum()
    }

    /// Like [`Backoff::delay`] with a caller-supplied random source (deterministic in tests).
    pub fn delay_with(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.gen_range(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
        let ceilings: Vec<u128> = (0..10).map(|a| b.ceiling(a).as_millis()).collect();
        assert_eq!(
            ceilings,
            vec![250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn spread_delay_keeps_at_least_half_the_ceiling() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        for attempt in 0..12 {
            let d = b.spread_delay(attempt);
            assert!(
                d >= b.ceiling(attempt) / 2 && d <= b.ceiling(attempt),
                "{attempt}: {d:?}"
            );
        }
        // 50 + 100 + 200 + 400 ms
        assert_eq!(b.least_total(4), Duration::from_millis(750));
    }

    #[test]
    fn jittered_delay_stays_within_ceiling_and_varies() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<Duration> = (0..200).map(|_| b.delay_with(3, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(800)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "full jitter must spread delays");
    }
}
