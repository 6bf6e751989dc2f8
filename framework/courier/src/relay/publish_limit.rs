//! The relay's adaptive limit on publishes in flight (congestion control).
//!
//! Claimers take permits before they claim, one per row, and a row's permit goes back when its
//! key publisher has settled it; so the limit bounds what the whole relay has handed to Pub/Sub
//! and not yet heard back about. The limit moves like TCP's window or Netflix's AIMD limiter:
//! it grows by one per acknowledgement while the relay uses at least half of it and
//! acknowledgements average under a quarter of the latency target (doubling per round trip,
//! as TCP's slow start), and it shrinks when the broker signals congestion. An acknowledgement
//! slower than the target shrinks it by the ratio of target to latency (between a tenth and a
//! half, as a gradient limiter would), at most once per target interval.
//!
//! Under a quarter: once publishes mostly wait in the broker's queue, more of them in flight
//! add latency, memory and CPU, and no throughput. It also grows only while more rows in flight
//! can speed the relay up: while the keys out leave room on the relay's connection (each key
//! out is a request), or while rows share keys (bigger requests); past that it gives rows back,
//! one per acknowledgement. A fixed cap in rows would not do: 1,000 keys need their 25,600 rows
//! in flight to batch, a key per row does best near what the connection carries. The drains
//! that showed each of these: docs/benchmarks-history.md (the publish limit's rows).
//!
//! A timeout, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED` or `UNAVAILABLE` puts the relay in probe
//! mode, as a timeout collapses TCP's window to one segment: until the broker acknowledges a
//! publish again, one row at a time goes out, each after the broker's backoff; then the limit
//! starts over from its floor. Without it a frozen broker would time out the whole window, and
//! a refusing one would be sent fresh rows as fast as it refuses them.

use crate::backoff::Backoff;
use crate::config::RelayConfig;
use crate::relay::keys_out::KeysOutTally;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Bounds and target of the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    pub min: usize,
    /// Where the limit starts (kept within `min..=max`).
    pub initial: usize,
    pub max: usize,
    /// Acknowledgements slower than this count as congestion.
    pub latency_target: Duration,
    /// Publish requests the relay's connection sends or queues at once; past it, keys out
    /// with a row each only wait in the client (see `topic_clients`).
    pub requests_the_connection_carries: usize,
    /// Spaces the probes while the broker fails, and the retries of the rows it failed.
    pub broker_backoff: Backoff,
}

/// Longest wait before retrying rows that failed on the broker, and between probes while it
/// fails. Short on purpose: the publish limit is what throttles the relay while the broker
/// struggles; this delay only spreads the retries, and a long one would hold rows back well
/// after the broker recovered.
const BROKER_RETRY_CAP: Duration = Duration::from_secs(5);

impl LimitSettings {
    /// The limit's bounds and target as `[relay]` sets them.
    pub fn from_config(relay: &RelayConfig) -> Self {
        Self {
            min: relay.publish_limit_min as usize,
            initial: relay.publish_limit_initial as usize,
            max: relay.publish_limit_max as usize,
            latency_target: Duration::from_millis(relay.publish_latency_target_millis),
            requests_the_connection_carries:
                crate::relay::topic_clients::REQUESTS_THE_CONNECTION_CARRIES,
            broker_backoff: Backoff::new(
                Duration::from_millis(relay.retry_base_millis),
                Duration::from_millis(relay.retry_cap_millis).min(BROKER_RETRY_CAP),
            ),
        }
    }
}

/// What the broker told us about its load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Congestion {
    /// An acknowledgement slower than the latency target: `target / latency`, below 1.
    SlowAck(f64),
    /// A publish that timed out or failed with a broker-side status.
    BrokerFailure,
}

impl Congestion {
    /// The factor the limit is multiplied by.
    fn shrink_to(self) -> f64 {
        match self {
            Congestion::SlowAck(ratio) => ratio.clamp(0.5, 0.9),
            // Back to the floor once the broker answers again: the window it had is what it
            // just failed to carry (TCP's slow start after a timeout).
            Congestion::BrokerFailure => 0.0,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Congestion::SlowAck(_) => "slow_ack",
            Congestion::BrokerFailure => "broker_failure",
        }
    }
}

/// The limit as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSnapshot {
    pub limit: usize,
    pub in_flight: usize,
    /// Distinct ordering keys among the rows out: the publish requests asked of the connection.
    pub keys_out: usize,
    /// Recent acknowledgement latency (exponentially weighted), in milliseconds.
    pub latency_ms: f64,
}

impl LimitSnapshot {
    /// Sets the limit's gauges. Done with each heartbeat, not on every permit and
    /// acknowledgement: those run per row on the relay's hot path.
    pub fn publish_gauges(&self) {
        metrics::gauge!(crate::metrics::RELAY_PUBLISH_LIMIT).set(self.limit as f64);
        metrics::gauge!(crate::metrics::RELAY_PUBLISHES_IN_FLIGHT).set(self.in_flight as f64);
        metrics::gauge!(crate::metrics::RELAY_KEYS_OUT).set(self.keys_out as f64);
    }
}

#[derive(Debug)]
struct State {
    limit: f64,
    in_flight: usize,
    last_shrink: Option<Instant>,
    /// Broker failures since the last acknowledgement (the exponent of their retry delay).
    broker_failures_in_a_row: u32,
    /// In probe mode (a broker failure since the last acknowledgement): when the next probe
    /// may go out.
    probe_after: Option<Instant>,
    latency_ms: f64,
}

impl State {
    fn effective_limit(&self) -> usize {
        if self.probe_after.is_some() {
            1
        } else {
            self.limit as usize
        }
    }
}

/// Shared by a relay's claimers (who take permits) and key publishers (who report outcomes).
#[derive(Debug)]
pub struct PublishLimit {
    settings: LimitSettings,
    state: Mutex<State>,
    /// What the claimers have handed to key publishers, by rows and keys.
    keys_out: Arc<KeysOutTally>,
}

/// Weight of one acknowledgement in the latency average.
const LATENCY_WEIGHT: f64 = 0.05;

/// The share of the latency target the acknowledgements' average may reach while the limit
/// grows: beyond it publishes mostly wait in the broker's queue.
const GROWTH_LATENCY_SHARE: f64 = 0.25;

/// Rows per key out from which more rows in flight count as batching: a little over one, so
/// that a key per row (exactly one) does not, while a few repeated keys among thousands do.
const BATCHING_ROWS_PER_KEY: f64 = 1.1;

impl PublishLimit {
    /// Starts at `initial`, an initial window as TCP's: the limit finds the broker's pace from
    /// there (by doubling per round trip while every acknowledgement is fast and the relay
    /// uses the limit, or shrinking when they are slow). Only after a broker failure does it
    /// start over from the floor.
    pub fn new(settings: LimitSettings) -> Arc<Self> {
        let limit = Arc::new(Self {
            settings,
            state: Mutex::new(State {
                limit: settings.initial.clamp(settings.min, settings.max) as f64,
                in_flight: 0,
                last_shrink: None,
                broker_failures_in_a_row: 0,
                probe_after: None,
                latency_ms: 0.0,
            }),
            keys_out: Arc::default(),
        });
        limit.snapshot().publish_gauges();
        limit
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Counters only: a panic elsewhere cannot leave them unusable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fewest permits worth a claim of up to `batch` rows. While the limit is full its
    /// permits come back a row at a time, and a claim of a few rows costs PostgreSQL nearly
    /// what one of a batch does: so half a batch, but never more than a quarter of the limit
    /// as it stands. Waiting for half a batch at a small limit meant waiting for every publish
    /// in flight to settle, so one publish the broker sat on held the whole relay until it
    /// timed out (`throughput --via http`: ~100 rows timing out together every 20 s).
    pub fn enough_for_a_claim(&self, batch: usize) -> usize {
        let limit = self.state().effective_limit();
        (batch / 2).min(limit / 4).max(1)
    }

    /// Up to `wanted` permits, as many as the limit leaves room for (possibly none).
    pub fn try_acquire(self: &Arc<Self>, wanted: usize) -> Permits {
        let mut state = self.state();
        let probe_waits = state.probe_after.is_some_and(|at| Instant::now() < at);
        let room = if probe_waits {
            0
        } else {
            state.effective_limit().saturating_sub(state.in_flight)
        };
        let count = wanted.min(room);
        state.in_flight += count;
        Permits {
            limit: Some(self.clone()),
            count,
        }
    }

    /// Where claimers count the rows and keys they hand to key publishers.
    pub fn keys_out(&self) -> Arc<KeysOutTally> {
        self.keys_out.clone()
    }

    /// Whether more rows in flight can speed the relay up: while the keys out leave room on
    /// the connection (more requests at once), or while rows share keys (bigger requests).
    fn more_rows_would_help(&self) -> bool {
        let (rows, keys) = self.keys_out.rows_and_keys();
        keys < self.settings.requests_the_connection_carries
            || rows as f64 >= BATCHING_ROWS_PER_KEY * keys as f64
    }

    fn release(&self, count: usize) {
        let mut state = self.state();
        state.in_flight = state.in_flight.saturating_sub(count);
    }

    /// A publish was acknowledged after `latency`.
    pub fn on_acked(&self, latency: Duration) {
        let mut state = self.state();
        let ms = latency.as_secs_f64() * 1_000.0;
        state.latency_ms = if state.latency_ms == 0.0 {
            ms
        } else {
            state.latency_ms + LATENCY_WEIGHT * (ms - state.latency_ms)
        };
        state.broker_failures_in_a_row = 0;
        state.probe_after = None;
        if latency > self.settings.latency_target {
            if !self.shrank_recently(&state) {
                let ratio = self.settings.latency_target.as_secs_f64() / latency.as_secs_f64();
                self.shrink(&mut state, Congestion::SlowAck(ratio));
            }
        } else if !self.more_rows_would_help() {
            // A key per row and the connection full: rows beyond what it carries only wait.
            let carried = self
                .settings
                .requests_the_connection_carries
                .max(self.settings.min) as f64;
            if state.limit > carried {
                state.limit = (state.limit - 1.0).max(carried);
            }
        } else if state.in_flight * 2 >= state.limit as usize
            && state.latency_ms
                < GROWTH_LATENCY_SHARE * self.settings.latency_target.as_secs_f64() * 1_000.0
        {
            // Grow only while the limit is what holds the relay back, and not into a queue.
            state.limit = (state.limit + 1.0).min(self.settings.max as f64);
        }
    }

    /// The broker failed a publish or did not answer in time: probe mode until it acknowledges
    /// one again, and the limit back to its floor for when it does.
    pub fn on_broker_failure(&self) {
        let mut state = self.state();
        state.broker_failures_in_a_row = state.broker_failures_in_a_row.saturating_add(1);
        if state.probe_after.is_none() {
            // Once per congested moment: thousands of rows timing out together are one signal.
            self.shrink(&mut state, Congestion::BrokerFailure);
        }
        // Equal jitter: probes spread apart, yet never follow a failure at once.
        let spacing = (self.settings.broker_backoff)
            .spread_delay(state.broker_failures_in_a_row.saturating_sub(1));
        state.probe_after = Some(Instant::now() + spacing);
    }

    /// Slow acknowledgements shrink the limit at most once per target interval: those of one
    /// congested moment arrive together.
    fn shrank_recently(&self, state: &State) -> bool {
        state
            .last_shrink
            .is_some_and(|at| at.elapsed() < self.settings.latency_target)
    }

    fn shrink(&self, state: &mut State, signal: Congestion) {
        state.last_shrink = Some(Instant::now());
        state.limit = (state.limit * signal.shrink_to()).max(self.settings.min as f64);
        metrics::counter!(crate::metrics::RELAY_CONGESTION_TOTAL, "signal" => signal.label())
            .increment(1);
    }

    /// How long rows that failed on the broker wait before their retry: grows with the
    /// broker's failures in a row (not with the row's own attempts, which such failures do not
    /// spend), and starts over with the first acknowledgement.
    pub fn broker_retry_delay(&self) -> Duration {
        let failures = self.state().broker_failures_in_a_row;
        self.settings
            .broker_backoff
            .delay(failures.saturating_sub(1))
    }

    /// The limit in force: one publish at a time in probe mode.
    pub fn snapshot(&self) -> LimitSnapshot {
        let state = self.state();
        LimitSnapshot {
            limit: state.effective_limit(),
            in_flight: state.in_flight,
            keys_out: self.keys_out.rows_and_keys().1,
            latency_ms: state.latency_ms,
        }
    }
}

/// Permits for rows in flight; dropping them gives them back.
#[derive(Debug)]
pub struct Permits {
    limit: Option<Arc<PublishLimit>>,
    count: usize,
}

impl Permits {
    pub fn count(&self) -> usize {
        self.count
    }

    /// Gives back all but `keep`.
    pub fn keep(&mut self, keep: usize) {
        let excess = self.count.saturating_sub(keep);
        if let (Some(limit), true) = (&self.limit, excess > 0) {
            limit.release(excess);
        }
        self.count -= excess;
    }

    /// Moves `n` of these permits (or what is left) into permits of their own.
    pub fn split_off(&mut self, n: usize) -> Permits {
        let n = n.min(self.count);
        self.count -= n;
        Permits {
            limit: self.limit.clone(),
            count: n,
        }
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        if let (Some(limit), true) = (&self.limit, self.count > 0) {
            limit.release(self.count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::keys_out::KeysOut;
    use crate::relay::publisher::PublisherKey;

    fn limit(min: usize, max: usize) -> Arc<PublishLimit> {
        starting_at(min, min, max)
    }

    fn starting_at(initial: usize, min: usize, max: usize) -> Arc<PublishLimit> {
        PublishLimit::new(LimitSettings {
            min,
            initial,
            max,
            latency_target: Duration::from_millis(500),
            requests_the_connection_carries: 100,
            broker_backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        })
    }

    /// `acks` fast acknowledgements while the relay uses all of the limit; the permits taken.
    fn grow_busy(limit: &Arc<PublishLimit>, acks: usize) -> Vec<Permits> {
        let mut held = Vec::new();
        for _ in 0..acks {
            held.push(limit.try_acquire(usize::MAX));
            limit.on_acked(Duration::from_millis(1));
        }
        held
    }

    #[test]
    fn permits_stop_at_the_limit_and_come_back_when_dropped() {
        let limit = limit(10, 100);
        let mut first = limit.try_acquire(8);
        assert_eq!(first.count(), 8);
        assert_eq!(limit.try_acquire(8).count(), 2, "only the room left");
        assert_eq!(limit.snapshot().in_flight, 8, "the 2 were dropped at once");
        let part = first.split_off(3);
        drop(first);
        assert_eq!(limit.snapshot().in_flight, 3);
        drop(part);
        assert_eq!(limit.snapshot().in_flight, 0);
    }

    #[test]
    fn keep_gives_back_what_a_claim_did_not_use() {
        let limit = limit(10, 100);
        let mut permits = limit.try_acquire(10);
        permits.keep(4);
        assert_eq!((permits.count(), limit.snapshot().in_flight), (4, 4));
    }

    #[test]
    fn the_limit_grows_with_fast_acknowledgements_while_it_is_used() {
        let limit = limit(10, 100);
        let _held = limit.try_acquire(10);
        for _ in 0..5 {
            limit.on_acked(Duration::from_millis(20));
        }
        assert_eq!(limit.snapshot().limit, 15);
    }

    #[test]
    fn the_limit_stops_growing_once_acknowledgements_average_a_quarter_of_the_target() {
        let limit = limit(10, 1_000);
        let _held = grow_busy(&limit, 40);
        assert_eq!(limit.snapshot().limit, 50, "fast answers");
        // Still within the target (500 ms), but above a quarter of it: publishes only queue.
        for _ in 0..200 {
            let _more = limit.try_acquire(usize::MAX);
            limit.on_acked(Duration::from_millis(400));
        }
        let held_at = limit.snapshot().limit;
        assert!(
            (50..70).contains(&held_at),
            "grew only until the average crossed 125 ms: {held_at}"
        );
        // The queue drains: growth resumes.
        for _ in 0..200 {
            let _more = limit.try_acquire(usize::MAX);
            limit.on_acked(Duration::from_millis(1));
        }
        assert!(limit.snapshot().limit > held_at + 100);
    }

    #[test]
    fn the_limit_starts_at_its_initial_window_and_a_broker_failure_sends_it_to_the_floor() {
        let limit = starting_at(1_600, 10, 25_600);
        assert_eq!(limit.snapshot().limit, 1_600);
        assert_eq!(
            limit.try_acquire(usize::MAX).count(),
            1_600,
            "all of it at once"
        );
        limit.on_broker_failure();
        limit.on_acked(Duration::from_millis(1));
        assert_eq!(limit.snapshot().limit, 10, "starts over from the floor");
        assert_eq!(
            starting_at(1_600, 10, 500).snapshot().limit,
            500,
            "within max"
        );
        assert_eq!(starting_at(1, 10, 500).snapshot().limit, 10, "within min");
    }

    /// Keys out as claimers would count them: `keys` keys with `rows_each` rows out.
    fn keys_out(limit: &Arc<PublishLimit>, keys: usize, rows_each: usize) -> KeysOut {
        let mut out = KeysOut::new(limit.keys_out());
        for k in 0..keys {
            out.handed(&PublisherKey::new("t".into(), k.to_string()), rows_each);
        }
        out
    }

    /// The limit after `acks` fast acknowledgements.
    fn after_fast_acks(limit: &PublishLimit, acks: usize) -> usize {
        for _ in 0..acks {
            limit.on_acked(Duration::from_millis(1));
        }
        limit.snapshot().limit
    }

    #[test]
    fn with_a_key_per_row_past_what_the_connection_carries_the_limit_gives_rows_back() {
        // The connection carries 100 requests (see `limit`).
        let limit = starting_at(400, 10, 1_000);
        let _held = limit.try_acquire(400);
        let _out = keys_out(&limit, 400, 1);
        assert_eq!(limit.snapshot().keys_out, 400);
        assert_eq!(after_fast_acks(&limit, 250), 150, "a row back per ack");
        assert_eq!(after_fast_acks(&limit, 250), 100, "down to what it carries");
    }

    #[test]
    fn rows_that_share_keys_grow_the_limit_past_what_the_connection_carries() {
        let limit = starting_at(400, 10, 1_000);
        let _held = limit.try_acquire(400);
        let _out = keys_out(&limit, 200, 2);
        assert_eq!(after_fast_acks(&limit, 100), 500, "two rows a request");
    }

    #[test]
    fn keys_fewer_than_the_connection_carries_grow_the_limit_even_a_row_each() {
        let limit = starting_at(50, 10, 1_000);
        let _held = limit.try_acquire(50);
        let _out = keys_out(&limit, 50, 1);
        assert_eq!(after_fast_acks(&limit, 50), 100, "room for more requests");
    }

    #[test]
    fn an_unused_limit_does_not_grow() {
        let limit = limit(10, 100);
        let _held = limit.try_acquire(2);
        limit.on_acked(Duration::from_millis(20));
        assert_eq!(limit.snapshot().limit, 10);
    }

    #[test]
    fn a_claim_waits_for_half_a_batch_or_a_quarter_of_a_small_limit() {
        let limit = limit(10, 100_000);
        assert_eq!(limit.enough_for_a_claim(200), 2, "limit 10");
        let _held = grow_busy(&limit, 90);
        assert_eq!(
            limit.enough_for_a_claim(200),
            25,
            "limit 100: never all of it"
        );
        let _more = grow_busy(&limit, 900);
        assert_eq!(
            limit.enough_for_a_claim(200),
            100,
            "limit 1,000: half a batch"
        );
        assert_eq!(limit.enough_for_a_claim(1), 1);
    }

    #[test]
    fn after_a_broker_failure_one_probe_at_a_time_goes_out_then_the_limit_starts_from_its_floor() {
        let limit = limit(10, 100);
        drop(grow_busy(&limit, 50));
        assert_eq!(limit.snapshot().limit, 60);
        for _ in 0..1_000 {
            limit.on_broker_failure();
        }
        assert_eq!(limit.snapshot().limit, 1, "probe mode, as operators see it");
        assert_eq!(limit.try_acquire(100).count(), 0, "not before the backoff");
        assert_eq!(limit.enough_for_a_claim(200), 1);
        limit.state().probe_after = Some(Instant::now());
        let probe = limit.try_acquire(100);
        assert_eq!(probe.count(), 1, "one probe");
        assert_eq!(limit.try_acquire(100).count(), 0, "and only one");
        limit.on_acked(Duration::from_millis(1));
        drop(probe);
        assert_eq!(
            limit.snapshot().limit,
            10,
            "the floor, once the broker answers"
        );
        let _held = grow_busy(&limit, 10);
        assert_eq!(limit.snapshot().limit, 20, "and slow start from there");
    }

    #[test]
    fn slow_acknowledgements_shrink_the_limit_by_how_late_they_are() {
        // Target 500 ms: 550 ms shrinks by a tenth, 800 ms to 62 %, 2 s by half.
        for (latency, expected) in [(550, 90), (800, 62), (2_000, 50)] {
            let limit = limit(10, 1_000);
            let _held = grow_busy(&limit, 90);
            limit.on_acked(Duration::from_millis(latency));
            assert_eq!(limit.snapshot().limit, expected, "{latency} ms");
        }
    }

    #[test]
    fn the_broker_retry_delay_grows_with_failures_in_a_row_and_resets_on_an_ack() {
        let limit = limit(10, 100);
        let ceiling = |n: u32| Duration::from_millis(100 << n).min(Duration::from_secs(1));
        for n in 0..6 {
            limit.on_broker_failure();
            assert!(limit.broker_retry_delay() <= ceiling(n));
            let probe_in = limit
                .state()
                .probe_after
                .map(|at| at.saturating_duration_since(Instant::now()));
            assert!(probe_in.is_some_and(|d| d <= ceiling(n)));
        }
        limit.on_acked(Duration::from_millis(1));
        assert_eq!(limit.state().broker_failures_in_a_row, 0);
        assert_eq!(limit.state().probe_after, None);
    }
}
