//! `[relay]`: the outbox relay's shards, claims, publishing and its congestion control.

use super::error::{invalid, ConfigError};
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Number of outbox shards, fixed per deployment like partitions: changing it re-homes
    /// keys, so drain the outbox before changing it.
    pub shard_count: u32,
    /// Rows claimed per round (DESIGN: 100-500).
    pub claim_batch_size: u32,
    /// How long a claim stays valid; rows of a dead owner become claimable after it, and a
    /// dead process's shards are taken over within about this time.
    pub claim_lease_secs: u64,
    /// Unmarked rows a claimer may hold, in batches (`× claim_batch_size` rows; bounds memory
    /// per shard). The emulator and Pub/Sub publish faster with more messages in flight per
    /// ordering key (the client sends a key's waiting messages as one batch): in
    /// `courier-load drain`, 8 drained ~30 % faster than 2, and 16 ~35 % faster than 8.
    pub max_in_flight_batches: u32,
    /// After a claim that found rows but not a full batch, wait this long before claiming
    /// again, so a live trickle gathers into batches instead of every claimer re-running the
    /// claim query back to back (which starved the writers of PostgreSQL CPU under load).
    /// A full batch claims again at once. Longer trades latency for CPU: on a saturated
    /// 2-core machine 100 carried 6–7 % more writes end to end than 20, and added ~35 ms to
    /// commit → projection at p50 and p99 at half load (README, "Where end to end stood").
    pub claim_linger_millis: u64,
    /// First idle-poll delay ceiling; doubles with full jitter while shards stay empty.
    pub poll_min_millis: u64,
    /// Idle-poll delay cap.
    pub poll_max_millis: u64,
    /// Publish attempts before a row is marked dead.
    pub publish_max_attempts: u32,
    /// First publish-retry delay ceiling (exponential with full jitter).
    pub retry_base_millis: u64,
    /// Publish-retry delay cap.
    pub retry_cap_millis: u64,
    /// A per-key publisher with nothing to do for this long stops (passivation). Short: with
    /// a new ordering key per aggregate, the live publishers (and the Pub/Sub client state
    /// they hold) are the keys published within this time. Draining a backlog of 300,000 new
    /// keys (`courier-load drain --relay-only`), 5 s kept ~26k keys' state alive and the
    /// process grew 35 % during the drain (peak 1.2 GB); 1 s kept it flat (peak 0.7 GB), and
    /// the 1,000-key drain was no slower.
    pub publisher_idle_secs: u64,
    /// How long a key's hand-over to Pub/Sub may take before its unacknowledged rows count as
    /// failed (on the broker's side). Shorter than the claim lease, so a publish never outlives
    /// its claim (another owner could otherwise publish the row again, possibly out of order).
    pub publish_timeout_secs: u64,
    /// Lower bound of the adaptive limit on publishes in flight across the relay: where it
    /// starts over after the broker failed (see `relay::publish_limit`).
    pub publish_limit_min: u32,
    /// Where the limit starts when the relay starts (kept within min..=max); it grows from
    /// there while Pub/Sub answers fast. The default lets every shard's first claim go out at
    /// once (8 shards × 200 rows): from the floor, a relay starting on a backlog of new keys
    /// took ~0.5 s to reach 1,500 in flight, its slow start the drain's whole first second.
    pub publish_limit_initial: u32,
    /// Upper bound of that limit (rows handed to Pub/Sub and not yet settled).
    pub publish_limit_max: u32,
    /// Acknowledgements slower than this shrink the limit a little, and the limit grows only
    /// while they average under a quarter of it; timeouts and broker errors put the relay in
    /// probe mode, then start the limit over from its floor.
    pub publish_latency_target_millis: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            shard_count: 8,
            claim_batch_size: 200,
            claim_lease_secs: 30,
            max_in_flight_batches: 16,
            claim_linger_millis: 20,
            poll_min_millis: 250,
            poll_max_millis: 30_000,
            publish_max_attempts: 10,
            retry_base_millis: 1_000,
            retry_cap_millis: 300_000,
            publisher_idle_secs: 1,
            publish_timeout_secs: 20,
            publish_limit_min: 10,
            publish_limit_initial: 1_600,
            publish_limit_max: 25_600,
            publish_latency_target_millis: 2_000,
        }
    }
}

impl RelayConfig {
    pub fn claim_lease(&self) -> Duration {
        Duration::from_secs(self.claim_lease_secs)
    }

    pub fn claim_linger(&self) -> Duration {
        Duration::from_millis(self.claim_linger_millis)
    }
    pub fn poll_backoff(&self) -> crate::backoff::Backoff {
        crate::backoff::Backoff::new(
            Duration::from_millis(self.poll_min_millis),
            Duration::from_millis(self.poll_max_millis),
        )
    }
    pub fn retry_backoff(&self) -> crate::backoff::Backoff {
        crate::backoff::Backoff::new(
            Duration::from_millis(self.retry_base_millis),
            Duration::from_millis(self.retry_cap_millis),
        )
    }

    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1024).contains(&self.shard_count) {
            return invalid("relay.shard_count", "must be between 1 and 1024");
        }
        if !(1..=1000).contains(&self.claim_batch_size) {
            return invalid("relay.claim_batch_size", "must be between 1 and 1000");
        }
        if self.claim_lease_secs < 1 {
            return invalid("relay.claim_lease_secs", "must be at least 1");
        }
        if !(1..=16).contains(&self.max_in_flight_batches) {
            return invalid("relay.max_in_flight_batches", "must be between 1 and 16");
        }
        if self.claim_linger_millis > 1_000 {
            return invalid("relay.claim_linger_millis", "must be at most 1000");
        }
        if self.poll_min_millis < 1 || self.poll_max_millis < self.poll_min_millis {
            return invalid(
                "relay.poll_max_millis",
                "must be at least relay.poll_min_millis, which must be at least 1",
            );
        }
        if self.publish_max_attempts < 1 {
            return invalid("relay.publish_max_attempts", "must be at least 1");
        }
        if self.retry_cap_millis < self.retry_base_millis {
            return invalid(
                "relay.retry_cap_millis",
                "must be at least relay.retry_base_millis",
            );
        }
        if self.publish_timeout_secs < 1 || self.publish_timeout_secs >= self.claim_lease_secs {
            return invalid(
                "relay.publish_timeout_secs",
                "must be at least 1 and less than relay.claim_lease_secs (a publish must not outlive its claim)",
            );
        }
        if self.publish_limit_min < 1 || self.publish_limit_max < self.publish_limit_min {
            return invalid(
                "relay.publish_limit_max",
                "must be at least relay.publish_limit_min, which must be at least 1",
            );
        }
        if self.publish_latency_target_millis < 10 {
            return invalid("relay.publish_latency_target_millis", "must be at least 10");
        }
        Ok(())
    }
}
