//! Deployment configuration: one TOML file per deployment (`deploy/*/courier.toml`) plus
//! environment overrides, validated once at load with errors that name the offending key.
//!
//! Overrides: `COURIER_<SECTION>__<KEY>=value` sets `<section>.<key>` (for example
//! `COURIER_RELAY__SHARD_COUNT=16`); `PUBSUB_EMULATOR_HOST` sets `pubsub.emulator_host` as
//! Google's own tools do.

use crate::conninfo::{resolve_tls, SslMode, TlsSettings};
use crate::supervision::RestartPolicy;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "COURIER_";
/// Names the config file for the binaries; carries the prefix but is not an override.
pub const CONFIG_PATH_ENV: &str = "COURIER_CONFIG";

/// Why a configuration could not be loaded; always names the file, variable or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config is not valid: {0}")]
    Parse(String),
    #[error("config key {key} is invalid: {reason}")]
    Invalid { key: String, reason: String },
}

/// The whole configuration of one Courier process.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CourierConfig {
    /// Where the service's PostgreSQL is and which schema holds the framework's tables.
    pub database: DatabaseConfig,
    /// Which Pub/Sub project and endpoint to use.
    pub pubsub: PubSubConfig,
    /// Outbox relay tuning.
    pub relay: RelayConfig,
    /// Read-side tuning: receiving, projecting, dead-lettering.
    pub consumer: ConsumerConfig,
    /// Restart policies per actor kind.
    pub supervision: SupervisionConfig,
    /// Prometheus exporter of a process without an HTTP API (the bare relay); services serve
    /// `/metrics` on their HTTP port instead.
    pub metrics: MetricsConfig,
    /// A service's HTTP API, health and metrics endpoints.
    pub http: HttpConfig,
    /// How long published outbox rows and processed inbox rows are kept.
    pub retention: RetentionConfig,
    /// Where spans are exported (OpenTelemetry).
    pub telemetry: TelemetryConfig,
}

/// Trace export. Spans carry W3C trace context whether or not they are exported.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/HTTP (protobuf) URL the services' spans are exported to, for example
    /// `http://127.0.0.1:4318/v1/traces` (an OpenTelemetry collector, which can forward to
    /// Cloud Trace); unset: nothing is exported.
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.contains(char::is_whitespace) {
                return invalid(
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL, for example http://127.0.0.1:4318/v1/traces",
                );
            }
        }
        Ok(())
    }
}

/// `Debug` shows the URLs with their passwords redacted ([`redact_url`]).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// libpq-style URL or key=value string of the service's database.
    pub url: String,
    /// Schema holding outbox, inbox and offsets; every connection uses it as search_path.
    pub schema: String,
    /// The role that owns the schema. When set, `migrate` creates it (if missing) and the
    /// schema, and applies the migrations as that role, so the service connecting as it can
    /// touch its own schema and nothing else.
    pub role: Option<String>,
    /// Connection used only by `migrate` (a role allowed to create roles and schemas); the
    /// service itself never uses it. Defaults to `url`.
    pub admin_url: Option<String>,
    /// Pooled connections for writes, claims and marks (dedicated LISTEN and lock
    /// connections come on top of these).
    pub pool_size: u32,
    /// How long to wait for a pooled connection before failing (transiently).
    pub connect_timeout_secs: u64,
    /// TLS to the database, as libpq's `sslmode`: `disable`, `prefer` (the default: encrypted
    /// when the server offers it, certificate not checked), `require` (encrypted, certificate
    /// not checked), `verify-ca` (certificate signed by a trusted root), `verify-full` (and
    /// naming the host). May instead be given in the URLs as `sslmode=`.
    pub sslmode: Option<SslMode>,
    /// PEM file of the CA certificates `verify-ca`/`verify-full` trust (with `require` it
    /// upgrades to `verify-ca`, as in libpq); the system's roots when absent. May instead be
    /// given in the URLs as `sslrootcert=`.
    pub ssl_root_cert: Option<PathBuf>,
}

impl DatabaseConfig {
    /// `url` (this section's `url` or `admin_url`) without its TLS parameters, for
    /// tokio-postgres, and the TLS this section asks for on it.
    pub fn connection(&self, url: &str) -> Result<(String, TlsSettings), String> {
        resolve_tls(url, self.sslmode, self.ssl_root_cert.as_ref())
    }

    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if !is_identifier(&self.schema) {
            return invalid(
                "database.schema",
                "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)",
            );
        }
        if let Some(role) = &self.role {
            if !is_identifier(role) {
                return invalid(
                    "database.role",
                    "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)",
                );
            }
        }
        if self.pool_size < 2 {
            return invalid("database.pool_size", "must be at least 2");
        }
        let urls = [
            ("database.url", Some(&self.url)),
            ("database.admin_url", self.admin_url.as_ref()),
        ];
        for (key, url) in urls {
            let Some(url) = url else { continue };
            let (rest, tls) = self
                .connection(url)
                .or_else(|reason| invalid(key, &reason))?;
            if rest.parse::<tokio_postgres::Config>().is_err() {
                return invalid(key, "is not a PostgreSQL connection string");
            }
            if let Some(path) = tls.root_cert.as_ref().filter(|p| !p.is_file()) {
                return invalid(
                    "database.ssl_root_cert",
                    &format!("{} is not a readable file", path.display()),
                );
            }
        }
        Ok(())
    }
}

fn invalid<T>(key: &str, reason: &str) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    })
}

/// A PostgreSQL connection string with any password replaced by `***`: the URL form
/// (`postgres://user:secret@host/db`, `?password=secret`) and the key=value form
/// (`password=secret`, quoted or not).
pub fn redact_url(url: &str) -> String {
    let mut redacted = url.to_string();
    if let Some(scheme_end) = redacted.find("://") {
        let rest = scheme_end + 3;
        let authority_end = redacted[rest..]
            .find(['/', '?'])
            .map_or(redacted.len(), |i| rest + i);
        if let Some(at) = redacted[rest..authority_end].rfind('@').map(|i| rest + i) {
            if let Some(colon) = redacted[rest..at].find(':').map(|i| rest + i) {
                redacted.replace_range(colon + 1..at, "***");
            }
        }
    }
    let mut out = String::with_capacity(redacted.len());
    let mut rest = redacted.as_str();
    while let Some(i) = rest.find("password=") {
        let value_start = i + "password=".len();
        out.push_str(&rest[..value_start]);
        out.push_str("***");
        let value = &rest[value_start..];
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            quoted.find('\'').map_or(value.len(), |j| j + 2)
        } else {
            value.find([' ', '&']).unwrap_or(value.len())
        };
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("role", &self.role)
            .field("admin_url", &self.admin_url.as_deref().map(redact_url))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("sslmode", &self.sslmode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .finish()
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("read_wait_millis", &self.read_wait_millis)
            .finish()
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            schema: "courier".into(),
            role: None,
            admin_url: None,
            pool_size: 16,
            connect_timeout_secs: 10,
            sslmode: None,
            ssl_root_cert: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PubSubConfig {
    /// Google Cloud project that owns the topics and subscriptions.
    pub project: String,
    /// `host:port` of the Pub/Sub emulator; when set, every client talks plaintext to it with
    /// anonymous credentials. Overridden by `PUBSUB_EMULATOR_HOST`.
    pub emulator_host: Option<String>,
}

impl Default for PubSubConfig {
    fn default() -> Self {
        Self {
            project: "courier-local".into(),
            emulator_host: None,
        }
    }
}

impl PubSubConfig {
    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.project.is_empty() {
            return invalid("pubsub.project", "must not be empty");
        }
        if let Some(host) = &self.emulator_host {
            if !host.contains(':') || host.contains('/') {
                return invalid("pubsub.emulator_host", "must be host:port");
            }
        }
        Ok(())
    }
}

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
    /// starts over after the broker failed (see `outbox::publish_limit`).
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

/// Longest wait before retrying rows that failed on the broker, and between probes while it
/// fails. Short on purpose: the publish limit is what throttles the relay while the broker
/// struggles; this delay only spreads the retries, and a long one would hold rows back well
/// after the broker recovered.
const BROKER_RETRY_CAP: Duration = Duration::from_secs(5);

impl RelayConfig {
    pub fn claim_lease(&self) -> Duration {
        Duration::from_secs(self.claim_lease_secs)
    }

    /// The adaptive publish limit's bounds and target.
    pub fn publish_limit(&self) -> crate::outbox::publish_limit::LimitSettings {
        crate::outbox::publish_limit::LimitSettings {
            min: self.publish_limit_min as usize,
            initial: self.publish_limit_initial as usize,
            max: self.publish_limit_max as usize,
            latency_target: Duration::from_millis(self.publish_latency_target_millis),
            requests_the_connection_carries:
                crate::outbox::topic_clients::REQUESTS_THE_CONNECTION_CARRIES,
            broker_backoff: crate::backoff::Backoff::new(
                Duration::from_millis(self.retry_base_millis),
                Duration::from_millis(self.retry_cap_millis).min(BROKER_RETRY_CAP),
            ),
        }
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
    fn validate(&self) -> Result<(), ConfigError> {
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
    fn validate(&self) -> Result<(), ConfigError> {
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

/// Restart policies per actor kind.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionConfig {
    /// The LISTEN connection actor.
    pub notify_listener: RestartPolicy,
    /// The actor that owns shards through advisory locks.
    pub shard_owner: RestartPolicy,
    /// One claimer per owned shard.
    pub claimer: RestartPolicy,
    /// The StreamingPull receiver of a subscription.
    pub receiver: RestartPolicy,
    /// The router that hands deliveries to per-aggregate projectors.
    pub projector_router: RestartPolicy,
    /// The retention janitor.
    pub janitor: RestartPolicy,
}

impl SupervisionConfig {
    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        for (kind, policy) in [
            ("notify_listener", &self.notify_listener),
            ("shard_owner", &self.shard_owner),
            ("claimer", &self.claimer),
            ("receiver", &self.receiver),
            ("projector_router", &self.projector_router),
            ("janitor", &self.janitor),
        ] {
            policy
                .validate()
                .map_err(|(field, reason)| ConfigError::Invalid {
                    key: format!("supervision.{kind}.{field}"),
                    reason: reason.into(),
                })?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` for the Prometheus scrape endpoint; none means no endpoint.
    pub listen: Option<String>,
}

/// `Debug` shows whether a bearer token is set, never the token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `host:port` the service's HTTP server binds (port 0 picks a free one).
    pub listen: String,
    /// When set, write endpoints require `Authorization: Bearer <token>`. Unset on Cloud Run,
    /// where the IAM invoker role authenticates callers before they reach the service.
    pub auth_token: Option<String>,
    /// Longest a read with `?min_version=` waits for its projection before answering 202.
    pub read_wait_millis: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            auth_token: None,
            read_wait_millis: 2000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Run the janitor in this process (one per deployment is enough; more are harmless).
    pub enabled: bool,
    /// Published (or skipped) outbox rows older than this are deleted; dead and pending rows
    /// never are. 0: the relay deletes each row as it marks it published, keeping no
    /// history; its mark then writes no new row version.
    pub outbox_hours: u64,
    /// How long an appended version is remembered in the version ledger (`outbox_versions`),
    /// which refuses a second append of it as a conflict, published or not, whatever
    /// `outbox_hours` keeps.
    pub version_hours: u64,
    /// Processed inbox rows older than this are deleted. Keep it longer than Pub/Sub can
    /// redeliver or replay (7 days of retained messages by default), or a late duplicate
    /// would apply twice.
    pub inbox_hours: u64,
    /// Rows per DELETE statement: small, so no statement holds locks long.
    pub batch_size: u32,
    /// Time between sweeps.
    pub interval_secs: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            outbox_hours: 7 * 24,
            version_hours: 7 * 24,
            inbox_hours: 14 * 24,
            batch_size: 1000,
            interval_secs: 300,
        }
    }
}

impl RetentionConfig {
    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.inbox_hours < 7 * 24 {
            return invalid(
                "retention.inbox_hours",
                "must be at least 168 (7 days): Pub/Sub can redeliver or replay a message that long, and the inbox must still know it",
            );
        }
        if self.version_hours < 1 {
            return invalid(
                "retention.version_hours",
                "must be at least 1: a version is refused a second append only while the ledger remembers it",
            );
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return invalid("retention.batch_size", "must be between 1 and 100000");
        }
        if self.interval_secs < 1 {
            return invalid("retention.interval_secs", "must be at least 1");
        }
        Ok(())
    }
}

impl HttpConfig {
    pub fn read_wait(&self) -> Duration {
        Duration::from_millis(self.read_wait_millis)
    }

    /// This section's rules; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid("http.listen", "must be ip:port, for example 0.0.0.0:8080");
        }
        if matches!(&self.auth_token, Some(token) if token.trim().len() < 16) {
            return invalid("http.auth_token", "must be at least 16 characters when set");
        }
        if self.read_wait_millis > 60_000 {
            return invalid("http.read_wait_millis", "must be at most 60000");
        }
        Ok(())
    }
}

impl CourierConfig {
    /// Reads `path`, applies the process environment, validates.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_source(&text, Some(path), std::env::vars())
    }

    /// Defaults, then the process environment, validated.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_toml_and_env("", std::env::vars())
    }

    /// Parses `text`, applies `env` overrides, validates.
    pub fn from_toml_and_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::from_source(text, None, env)
    }

    /// [`Self::from_toml_and_env`] for the text of `file`. A bad value's error says where it
    /// came from: the environment variable that set it, the file, or the default.
    fn from_source(
        text: &str,
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let in_file = table.clone();
        let mut set_by_env = std::collections::HashMap::new();
        for (name, value) in env {
            if let Some(key) = apply_env_override(&mut table, &name, &value)? {
                set_by_env.insert(key, name);
            }
        }
        let config: CourierConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        config.validate().map_err(|error| match error {
            ConfigError::Invalid { key, reason } => {
                let origin = match (set_by_env.get(&key), file) {
                    (Some(variable), _) => format!("environment variable {variable}"),
                    (None, Some(file)) if has_key(&in_file, &key) => {
                        format!("config file {}", file.display())
                    }
                    (None, _) if has_key(&in_file, &key) => "the config text".into(),
                    (None, _) => "the default".into(),
                };
                ConfigError::Invalid {
                    reason: format!("{reason} (value from {origin})"),
                    key,
                }
            }
            other => other,
        })?;
        Ok(config)
    }

    /// Checks ranges and formats, naming the key of the first bad value. Each section's
    /// rules sit beside its fields, in its own `validate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.pubsub.validate()?;
        self.relay.validate()?;
        self.consumer.validate()?;
        self.http.validate()?;
        self.retention.validate()?;
        self.supervision.validate()?;
        self.telemetry.validate()
    }
}

/// `[a-z_][a-z0-9_]*`, at most 63 bytes: safe to splice into SQL as an identifier.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 63
}

/// Whether `table` sets the dotted `key` (`relay.shard_count`).
fn has_key(table: &toml::Table, key: &str) -> bool {
    let mut node = Some(table);
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(value) = node.and_then(|t| t.get(part)) else {
            return false;
        };
        if parts.peek().is_none() {
            return true;
        }
        node = value.as_table();
    }
    false
}

/// Applies one environment variable if it is an override; returns the dotted key it set.
fn apply_env_override(
    table: &mut toml::Table,
    name: &str,
    value: &str,
) -> Result<Option<String>, ConfigError> {
    let path: Vec<String> = if name == "PUBSUB_EMULATOR_HOST" {
        if value.is_empty() {
            return Ok(None);
        }
        vec!["pubsub".into(), "emulator_host".into()]
    } else if name == CONFIG_PATH_ENV {
        return Ok(None);
    } else if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
        rest.split("__").map(str::to_ascii_lowercase).collect()
    } else {
        return Ok(None);
    };
    if path.len() < 2 || path.iter().any(String::is_empty) {
        return Err(ConfigError::Invalid {
            key: name.into(),
            reason: "environment overrides look like COURIER_<SECTION>__<KEY>".into(),
        });
    }
    let mut node = table;
    for section in &path[..path.len() - 1] {
        let entry = node
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            key: name.into(),
            reason: format!("{section} is not a section"),
        })?;
    }
    // A value that parses as a TOML scalar (number, boolean) is taken as such, else as a string.
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_table())
        .unwrap_or_else(|| toml::Value::String(value.into()));
    node.insert(path[path.len() - 1].clone(), parsed);
    Ok(Some(path.join(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(config.relay.claim_batch_size, 200);
        assert_eq!(config.database.schema, "courier");
    }

    #[test]
    fn passwords_and_the_bearer_token_never_show_in_debug_output() {
        let secrets = [
            "s3cret-pass",
            "other-secret",
            "qs-secret",
            "token-0123456789-secret",
        ];
        let config = CourierConfig::from_toml_and_env(
            "[database]\nurl = \"postgres://catalog:s3cret-pass@db.internal:5432/app?sslmode=require\"\n\
             admin_url = \"host=db user=postgres password='other-secret' dbname=app\"\n\
             [http]\nauth_token = \"token-0123456789-secret\"\n",
            env(&[]),
        )
        .expect("valid");
        for rendered in [format!("{config:?}"), format!("{config:#?}")] {
            for secret in secrets {
                assert!(!rendered.contains(secret), "{secret} in {rendered}");
            }
            assert!(rendered.contains("catalog:***@db.internal"), "{rendered}");
            assert!(rendered.contains("<redacted>"), "{rendered}");
        }
        assert_eq!(
            redact_url("postgres://u@h/db?password=qs-secret&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("host=h password=p user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        // A URL that does not parse is refused naming the key, not echoing the value.
        let err = CourierConfig::from_toml_and_env(
            "[database]\nurl = \"postgres://u:s3cret-pass@h:notaport/db\"\n",
            env(&[]),
        )
        .expect_err("bad url");
        assert!(!err.to_string().contains("s3cret-pass"), "{err}");
        // An environment override is redacted the same way.
        let config = CourierConfig::from_toml_and_env(
            "",
            env(&[("COURIER_DATABASE__URL", "postgres://a:s3cret-pass@h/db")]),
        )
        .expect("valid");
        assert!(!format!("{config:?}").contains("s3cret-pass"));
    }

    #[test]
    fn default_transient_retries_outlast_a_thirty_second_lock() {
        let c = ConsumerConfig::default();
        let one_delivery = c.transient_backoff().least_total(c.transient_retries);
        assert!(one_delivery >= Duration::from_secs(20), "{one_delivery:?}");
        // Before a dead letter: every delivery's retries, not counting lock waits or
        // Pub/Sub's own redelivery backoff.
        assert!(one_delivery * c.max_delivery_attempts >= Duration::from_secs(60));
    }

    #[test]
    fn env_overrides_file_and_emulator_host_is_honoured() {
        let config = CourierConfig::from_toml_and_env(
            "[relay]\nshard_count = 4\n",
            env(&[
                ("COURIER_RELAY__SHARD_COUNT", "16"),
                ("COURIER_DATABASE__SCHEMA", "catalog"),
                ("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085"),
                ("UNRELATED", "x"),
            ]),
        )
        .expect("valid");
        assert_eq!(config.relay.shard_count, 16);
        assert_eq!(config.database.schema, "catalog");
        assert_eq!(
            config.pubsub.emulator_host.as_deref(),
            Some("127.0.0.1:8085")
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = CourierConfig::from_toml_and_env("[relay]\nshard_cuont = 4\n", env(&[]))
            .expect_err("unknown key");
        assert!(err.to_string().contains("shard_cuont"), "{err}");
        let err = CourierConfig::from_toml_and_env("", env(&[("COURIER_RELAY__BATCH", "4")]))
            .expect_err("unknown env key");
        assert!(err.to_string().contains("batch"), "{err}");
    }

    #[test]
    fn the_version_ledger_must_remember_versions_for_at_least_an_hour() {
        let err = CourierConfig::from_toml_and_env("[retention]\nversion_hours = 0\n", env(&[]))
            .expect_err("version_hours = 0");
        assert!(err.to_string().contains("retention.version_hours"), "{err}");
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(config.retention.version_hours, 168);
    }

    #[test]
    fn no_outbox_retention_means_published_rows_are_deleted_by_the_relay() {
        use crate::outbox::store::PublishedRows;
        let config = CourierConfig::from_toml_and_env("[retention]\noutbox_hours = 0\n", env(&[]))
            .expect("outbox_hours = 0 is valid");
        assert_eq!(
            PublishedRows::from_config(&config.retention),
            PublishedRows::Deleted
        );
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(
            PublishedRows::from_config(&config.retention),
            PublishedRows::Kept
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (toml, key) in [
            ("[relay]\nshard_count = 0\n", "relay.shard_count"),
            (
                "[relay]\nclaim_batch_size = 5000\n",
                "relay.claim_batch_size",
            ),
            ("[database]\nschema = \"Bad-Name\"\n", "database.schema"),
            (
                "[supervision.claimer]\nmax_restarts = 0\n",
                "supervision.claimer.max_restarts",
            ),
            ("[consumer]\nstreams = 0\n", "consumer.streams"),
            (
                "[consumer]\nlease_extension_secs = 5\n",
                "consumer.lease_extension_secs",
            ),
            ("[database]\nrole = \"Catalog\"\n", "database.role"),
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            ("[http]\nauth_token = \"short\"\n", "http.auth_token"),
            ("[retention]\ninbox_hours = 24\n", "retention.inbox_hours"),
            ("[retention]\nbatch_size = 0\n", "retention.batch_size"),
            (
                "[consumer]\nstart_from = \"yesterday\"\n",
                "consumer.start_from",
            ),
            (
                "[consumer]\ntransient_backoff_first_millis = 500\ntransient_backoff_cap_millis = 100\n",
                "consumer.transient_backoff_cap_millis",
            ),
            ("[consumer]\ngate_timeout_secs = 0\n", "consumer.gate_timeout_secs"),
            (
                "[telemetry]\notlp_endpoint = \"collector:4318\"\n",
                "telemetry.otlp_endpoint",
            ),
            (
                "[database]\nurl = \"postgres://h/db?sslmode=verify\"\n",
                "database.url",
            ),
            (
                "[database]\nsslmode = \"require\"\nadmin_url = \"host=h sslmode=disable\"\n",
                "database.admin_url",
            ),
            (
                "[database]\nssl_root_cert = \"/nonexistent/ca.pem\"\n",
                "database.ssl_root_cert",
            ),
        ] {
            let err = CourierConfig::from_toml_and_env(toml, env(&[])).expect_err(toml);
            assert!(
                matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
                "{toml}: {err}"
            );
        }
        let err = CourierConfig::from_toml_and_env("[relay]\nshard_count = \"many\"\n", env(&[]))
            .expect_err("type");
        assert!(err.to_string().contains("shard_count"), "{err}");
        let err = CourierConfig::from_toml_and_env("[database]\nsslmode = \"verify\"\n", env(&[]))
            .expect_err("sslmode");
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn a_bad_value_says_where_it_came_from() {
        let from_env = CourierConfig::from_toml_and_env(
            "[relay]\nshard_count = 8\n",
            env(&[("COURIER_RELAY__SHARD_COUNT", "0")]),
        )
        .expect_err("shard_count 0");
        assert!(
            from_env
                .to_string()
                .contains("environment variable COURIER_RELAY__SHARD_COUNT"),
            "{from_env}"
        );
        let dir = std::env::temp_dir().join(format!("courier-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[relay]\nclaim_batch_size = 5000\n").expect("write");
        let from_file = CourierConfig::from_source(
            &std::fs::read_to_string(&file).expect("read"),
            Some(&file),
            env(&[]),
        )
        .expect_err("claim_batch_size 5000");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            from_file
                .to_string()
                .contains(&format!("config file {}", file.display())),
            "{from_file}"
        );
        let cross_field =
            CourierConfig::from_toml_and_env("[relay]\nclaim_lease_secs = 5\n", env(&[]))
                .expect_err("publish timeout 20 s with a 5 s lease");
        assert!(
            cross_field
                .to_string()
                .contains("relay.publish_timeout_secs"),
            "{cross_field}"
        );
        assert!(
            cross_field.to_string().contains("the default"),
            "{cross_field}"
        );
    }

    #[test]
    fn every_shipped_config_loads_and_the_config_path_variable_is_not_an_override() {
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
        let mut checked = 0;
        for dir in ["local", "cloudrun", "k8s"] {
            let Ok(entries) = std::fs::read_dir(format!("{deploy}/{dir}")) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let text = std::fs::read_to_string(&path).expect("readable");
                    CourierConfig::from_toml_and_env(
                        &text,
                        env(&[("COURIER_CONFIG", "/etc/courier/catalog.toml")]),
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    checked += 1;
                }
            }
        }
        assert!(checked >= 3, "only {checked} shipped configs found");
    }
}
