//! `[consumer]`: receiving, projecting, retrying and dead-lettering on the read side.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Parallel StreamingPull streams per subscription (the emulator paces each stream at
    /// about 2k messages/s; real Pub/Sub spreads a subscription's keys over streams).
    pub streams: u32,
    /// Flow control per stream: unacked messages held in the process (enforced by the
    /// receiver as well as asked of the server). Together with `streams` this bounds memory.
    /// More outstanding lets more events of one aggregate share a transaction: 10,000 projected
    /// about twice as fast as 1,000 in `courier-load project` (1,000 keys).
    pub max_outstanding_messages: u32,
    /// Flow control per stream: unacked payload bytes (at most 4 GiB).
    pub max_outstanding_bytes: u64,
    /// How far the client extends a held message's lease each time (10-600 s); the client
    /// keeps extending while a projector still holds the message.
    pub lease_extension_secs: u64,
    /// Deliveries of one message before a transient failure is dead-lettered too; keep it at
    /// or below the subscription's dead-letter policy, so the framework adds the reason first.
    /// Each delivery first spends `transient_retries` in place, so a lock or a serialization
    /// conflict must outlast about `max_delivery_attempts` × the retry window to dead-letter.
    pub max_delivery_attempts: u32,
    /// Retries in place of a projection transaction that failed transiently (lock timeout,
    /// serialization failure, deadlock, a handler's `Transient`), before the delivery is given
    /// back to Pub/Sub. The events stay held (the client extends their leases) and the key's
    /// later events wait behind them, so a retry spends no delivery attempt and moves no event.
    pub transient_retries: u32,
    /// Backoff between those retries: the n-th waits between half and all of
    /// `min(cap, first * 2^n)` (equal jitter: spread apart, yet a sure minimum window). The
    /// defaults (10 retries, 100 ms, 10 s) hold a delivery for 21–43 s.
    pub transient_backoff_first_millis: u64,
    /// The longest wait between those retries (the backoff's cap).
    pub transient_backoff_cap_millis: u64,
    /// How long a key whose event was given back to Pub/Sub (nacked) holds its later events
    /// waiting for that event's redelivery. Longer than the subscription's retry backoff
    /// (10–600 s); past it the key goes on (the event was dead-lettered elsewhere) with a
    /// warning.
    pub gate_timeout_secs: u64,
    /// Contiguous projections (delta events): how long a key with a gap (v3 arrived, v2 not
    /// applied) holds its later events waiting for the missing one before it is parked.
    pub gap_wait_secs: u64,
    /// Events of one aggregate handed to the committer together when several are waiting
    /// (its group; 1 = one event at a time). A transaction carries the groups of many keys.
    pub max_events_per_transaction: u32,
    /// Events of many keys applied in one transaction: the committer gathers ready groups
    /// until this many events wait (1: every key's group alone) …
    pub commit_max_events: u32,
    /// … or until the first has waited this long.
    pub commit_linger_millis: u64,
    /// Per-aggregate projectors alive at once; at the cap an idle one is stopped first, and
    /// when none is idle routing waits (backpressure to the streams).
    pub max_live_projectors: u32,
    /// A projector with nothing to do for this long stops (passivation).
    pub projector_idle_secs: u64,
    /// Offset rows per consumer group (see migrations: one row per group would serialize all
    /// projection transactions on its lock).
    pub offset_lanes: u32,
    /// Where a consumer group without a saved offset starts (cold start): `subscription` —
    /// whatever the subscription holds; `latest` — skip that backlog (Seek to now);
    /// `earliest` — everything the subscription retained (Seek to the retention limit); or an
    /// RFC 3339 time (Seek there). With an offset the group always resumes where it was.
    pub start_from: String,
}

/// [`ConsumerConfig::start_from`], parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Subscription,
    Latest,
    Earliest,
    Time(chrono::DateTime<chrono::Utc>),
}

impl ConsumerConfig {
    /// The schedule of in-place retries after a transient failure.
    pub fn transient_backoff(&self) -> crate::backoff::Backoff {
        crate::backoff::Backoff::new(
            std::time::Duration::from_millis(self.transient_backoff_first_millis),
            std::time::Duration::from_millis(self.transient_backoff_cap_millis),
        )
    }

    pub fn start_from(&self) -> Result<StartFrom, String> {
        match self.start_from.as_str() {
            "subscription" => Ok(StartFrom::Subscription),
            "latest" => Ok(StartFrom::Latest),
            "earliest" => Ok(StartFrom::Earliest),
            time => chrono::DateTime::parse_from_rfc3339(time)
                .map(|t| StartFrom::Time(t.with_timezone(&chrono::Utc)))
                .map_err(|_| {
                    format!("{time:?} is not subscription, latest, earliest or an RFC 3339 time")
                }),
        }
    }

    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=32).contains(&self.streams) {
            return invalid("consumer.streams", "must be between 1 and 32");
        }
        if self.max_outstanding_messages < 1 {
            return invalid("consumer.max_outstanding_messages", "must be at least 1");
        }
        if !(1024..=u64::from(u32::MAX)).contains(&self.max_outstanding_bytes) {
            return invalid(
                "consumer.max_outstanding_bytes",
                "must be between 1024 and 4294967295",
            );
        }
        if !(10..=600).contains(&self.lease_extension_secs) {
            return invalid(
                "consumer.lease_extension_secs",
                "must be between 10 and 600 (Pub/Sub's ack deadline range)",
            );
        }
        if !(1..=100).contains(&self.max_delivery_attempts) {
            return invalid(
                "consumer.max_delivery_attempts",
                "must be between 1 and 100",
            );
        }
        if self.transient_retries > 100 {
            return invalid("consumer.transient_retries", "must be at most 100");
        }
        if !(1..=60_000).contains(&self.transient_backoff_first_millis) {
            return invalid(
                "consumer.transient_backoff_first_millis",
                "must be between 1 and 60000",
            );
        }
        if !(self.transient_backoff_first_millis..=600_000)
            .contains(&self.transient_backoff_cap_millis)
        {
            return invalid(
                "consumer.transient_backoff_cap_millis",
                "must be between transient_backoff_first_millis and 600000",
            );
        }
        if !(1..=3600).contains(&self.gate_timeout_secs) {
            return invalid(
                "consumer.gate_timeout_secs",
                "must be between 1 and 3600 (the client holds a message at most an hour)",
            );
        }
        if !(1..=3600).contains(&self.gap_wait_secs) {
            return invalid(
                "consumer.gap_wait_secs",
                "must be between 1 and 3600 (the client holds a message at most an hour)",
            );
        }
        if !(1..=1000).contains(&self.max_events_per_transaction) {
            return invalid(
                "consumer.max_events_per_transaction",
                "must be between 1 and 1000",
            );
        }
        if !(1..=10_000).contains(&self.commit_max_events) {
            return invalid("consumer.commit_max_events", "must be between 1 and 10000");
        }
        if self.commit_linger_millis > 1_000 {
            return invalid("consumer.commit_linger_millis", "must be at most 1000");
        }
        if self.max_live_projectors < 1 {
            return invalid("consumer.max_live_projectors", "must be at least 1");
        }
        if let Err(reason) = self.start_from() {
            return invalid("consumer.start_from", &reason);
        }
        if !(1..=4096).contains(&self.offset_lanes) {
            return invalid("consumer.offset_lanes", "must be between 1 and 4096");
        }
        Ok(())
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            streams: 2,
            max_outstanding_messages: 10_000,
            max_outstanding_bytes: 100 * 1024 * 1024,
            lease_extension_secs: 60,
            max_delivery_attempts: 5,
            transient_retries: 10,
            transient_backoff_first_millis: 100,
            transient_backoff_cap_millis: 10_000,
            gate_timeout_secs: 900,
            gap_wait_secs: 60,
            max_events_per_transaction: 50,
            commit_max_events: 500,
            commit_linger_millis: 5,
            max_live_projectors: 10_000,
            projector_idle_secs: 30,
            offset_lanes: 32,
            start_from: "subscription".into(),
        }
    }
}
