//! A run's middle: the rate between the moments its count crossed 5 % and 95 % of its total.
//!
//! A drain's whole rate also carries its start (connections, the publish limit's slow start, a
//! cold process taking fresh pages) and its tail (the last acknowledgements). The raw publish
//! is timed warm, with its connection already open; the relay from its spawn. Timing both
//! from the same share of their events to the same share compares what each sustains, and
//! what the relay's start costs is reported beside it rather than spread over its rate.

use crate::report::measures::Rate;
use std::time::Instant;

/// Where the middle begins and ends, as shares of the total.
const MIDDLE: [f64; 2] = [0.05, 0.95];

/// Observes a growing count from a start instant and keeps when it crossed each bound of the
/// middle, interpolated between observations (a relay is polled every few milliseconds).
#[derive(Debug, Clone)]
pub struct Milestones {
    started: Instant,
    /// The counts that bound the middle.
    bounds: [u64; 2],
    /// Seconds after the start at which each bound was crossed.
    crossed: [Option<f64>; 2],
    /// Seconds after the start of the first observation of a count above zero.
    first: Option<f64>,
    last: (f64, u64),
}

impl Milestones {
    /// Starts the clock for a run of `total` events.
    pub fn start(total: u64) -> Self {
        Self::started_at(Instant::now(), total)
    }

    pub fn started_at(started: Instant, total: u64) -> Self {
        let bound = |share: f64| ((total as f64 * share).ceil() as u64).max(1);
        Self {
            started,
            bounds: MIDDLE.map(bound),
            crossed: [None; 2],
            first: None,
            last: (0.0, 0),
        }
    }

    /// Seconds since the clock started.
    pub fn elapsed_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The count now.
    pub fn observe(&mut self, count: u64) {
        self.observe_at(self.elapsed_seconds(), count);
    }

    fn observe_at(&mut self, seconds: f64, count: u64) {
        let (last_seconds, last_count) = self.last;
        if count <= last_count {
            return;
        }
        if self.first.is_none() {
            self.first = Some(seconds);
        }
        for (bound, crossed) in self.bounds.iter().zip(self.crossed.iter_mut()) {
            if crossed.is_none() && count >= *bound {
                let share = (*bound - last_count) as f64 / (count - last_count) as f64;
                *crossed = Some(last_seconds + share * (seconds - last_seconds));
            }
        }
        self.last = (seconds, count);
    }

    /// Seconds from the start to the first event counted.
    pub fn first_seconds(&self) -> Option<f64> {
        self.first
    }

    /// The rate between the two bounds, once both were crossed.
    pub fn middle_rate(&self, name: &str) -> Option<Rate> {
        let [Some(from), Some(to)] = self.crossed else {
            return None;
        };
        Some(Rate::new(
            &format!("{name}, middle 90 % of events"),
            self.bounds[1] - self.bounds[0],
            to - from,
        ))
    }

    /// How much longer the whole run took than its events would at the middle's rate: what its
    /// start and tail cost, in seconds.
    pub fn start_and_tail_seconds(&self) -> Option<f64> {
        let middle = self.middle_rate("")?;
        let (seconds, count) = self.last;
        (middle.per_second > 0.0).then(|| seconds - count as f64 / middle.per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::Milestones;
    use std::time::Instant;

    #[test]
    fn the_middle_is_interpolated_between_observations() {
        let mut m = Milestones::started_at(Instant::now(), 1_000);
        assert!(m.middle_rate("x").is_none());
        // A slow start, then 100 events a second.
        m.observe_at(1.0, 0);
        m.observe_at(2.0, 10);
        m.observe_at(2.5, 100); // 50 crossed at 2.0 + 40/90 × 0.5
        m.observe_at(11.0, 950); // exactly the upper bound
        m.observe_at(11.5, 1_000);
        let middle = m.middle_rate("relay").expect("both bounds crossed");
        assert_eq!(middle.name, "relay, middle 90 % of events");
        assert_eq!(middle.events, 900);
        let from = 2.0 + 40.0 / 90.0 * 0.5;
        assert!((middle.seconds - (11.0 - from)).abs() < 1e-9);
        assert_eq!(m.first_seconds(), Some(2.0));
        let lost = m.start_and_tail_seconds().expect("a middle");
        assert!((lost - (11.5 - 1_000.0 / middle.per_second)).abs() < 1e-9);
        assert!(lost > 0.5, "the slow start shows: {lost}");
    }

    #[test]
    fn a_jump_past_both_bounds_is_spread_over_the_interval_before_it() {
        let mut m = Milestones::started_at(Instant::now(), 100);
        m.observe_at(1.0, 100);
        let middle = m.middle_rate("x").expect("both crossed at once");
        assert!((middle.seconds - 0.9).abs() < 1e-9, "{middle:?}");
        let lost = m.start_and_tail_seconds().expect("a middle");
        assert!(lost.abs() < 1e-9, "no start to speak of: {lost}");
    }
}
