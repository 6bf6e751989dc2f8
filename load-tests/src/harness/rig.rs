//! One run's pipeline: a fresh database with the workload's schema, a topic with its ordered
//! subscription and dead-letter topic, and a config file the worker processes read.

use crate::harness::checker::Scope;
use crate::harness::workload::{self, AppRows, KeySpace, Shape, Workload};
use anyhow::Context as _;
use courier::pubsub::{PubSub, SubscriptionSpec};
use courier::CourierConfig;
use courier_testkit::{unique_name, TestDb};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the pipeline under test is set up.
#[derive(Debug, Clone, clap::Args)]
pub struct PipelineArgs {
    /// Outbox shards (claimers), split between the relay processes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
    /// StreamingPull streams of the consumer process.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub streams: u32,
    /// Aggregates (ordering keys) the writers spread their writes over (reused key space).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// `reused`: the writes go to --keys aggregates again and again; `unique`: a fresh UUID
    /// aggregate per create (as every new video is), each followed by --updates updates.
    #[arg(long, value_enum, default_value_t = KeySpace::Reused)]
    pub key_space: KeySpace,
    /// Updates of each new aggregate after its create (unique key space).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    pub updates: u32,
    /// `whole`: every event carries the aggregate's whole state; `delta`: an update carries
    /// the one field it changed and the projection applies just that field, so an update
    /// applied out of order leaves a wrong field.
    #[arg(long, value_enum, default_value_t = Workload::Whole)]
    pub workload: Workload,
    /// How the writers and the projection write the application's own rows: `in-place`
    /// updates a row per aggregate, as most services do; `appended` adds each version and
    /// reads the newest, as Courier's own tables do, so a long transaction pinning the xmin
    /// horizon (--pin-xmin-at) slows only the framework's statements, if anything.
    #[arg(long, value_enum, default_value_t = AppRows::InPlace)]
    pub app_rows: AppRows,
    /// No consumer: the relay publishes to a topic that no subscription reads, and the run
    /// measures the write side alone (the emulator degrades with many ordering keys on an
    /// ordered subscription being read; real Pub/Sub does not).
    #[arg(long)]
    pub relay_only: bool,
    /// Concurrent writers (each on its own connection).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub writers: u32,
}

impl PipelineArgs {
    pub fn shape(&self) -> Shape {
        Shape {
            key_space: self.key_space,
            keys: self.keys,
            updates: self.updates,
            workload: self.workload,
            rows: self.app_rows,
        }
    }

    pub fn scope(&self) -> Scope {
        if self.relay_only {
            Scope::RelayOnly
        } else {
            Scope::EndToEnd
        }
    }

    /// The report's parameters describing the pipeline and its writes.
    pub fn parameters(&self) -> Vec<(String, String)> {
        vec![
            ("writers".into(), self.writers.to_string()),
            ("shape".into(), self.shape().describe()),
            ("shards".into(), self.shards.to_string()),
            (
                "streams".into(),
                if self.relay_only {
                    "none (relay only)".into()
                } else {
                    self.streams.to_string()
                },
            ),
        ]
    }
}

/// Where a rig runs: the database server (`None`: `DATABASE_URL` or the local default), the
/// emulator the harness talks to, and the address the workers reach it at (a proxy, when the
/// run slows the broker).
pub struct Place {
    pub database_server: Option<String>,
    pub emulator_host: String,
    pub workers_emulator_host: String,
}

impl Place {
    /// The default database server and `emulator_host` for everyone.
    pub fn shared(emulator_host: &str) -> Self {
        Self {
            database_server: None,
            emulator_host: emulator_host.into(),
            workers_emulator_host: emulator_host.into(),
        }
    }
}

/// The pipeline's database, topic, subscription and worker config.
pub struct Rig {
    pub db: TestDb,
    pub emulator_host: String,
    /// Where the workers reach the emulator (a proxy in front of it, or the emulator).
    pub workers_emulator_host: String,
    pub scope: Scope,
    pub key_space: KeySpace,
    /// What the events carry, and so whether the consumer's projection needs contiguous
    /// versions.
    pub workload: Workload,
    /// How the consumer's projection writes the read model.
    pub app_rows: AppRows,
    /// The lock timeout of the consumer's projection transactions (see `faults`).
    pub consumer_lock_timeout: Option<Duration>,
    pub config: CourierConfig,
    pub topic: String,
    pub subscription: SubscriptionSpec,
    pub dead_letter_topic: String,
    /// The subscription keeping the dead letters, read by the checker.
    pub dead_letter_keeper: String,
    pub config_path: PathBuf,
}

/// How soon the rows claimed by a relay that stopped answering can be claimed by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Within seconds (a 5 s claim lease, publishes timed out after 4 s): for runs that kill
    /// relays or disrupt PostgreSQL or the broker, whose backlog must drain soon after each
    /// fault.
    Quick,
    /// The deployment's claim lease and publish timeout: for runs without faults. Under load
    /// the emulator sometimes takes longer than 4 s to acknowledge; with the quick timeout the
    /// relay gave up on those publishes and sent them again (45–292 claims' worth a 30 s
    /// `throughput` run, some runs then draining for 10 s after the writers stopped).
    Deployment,
}

impl Rig {
    /// Creates the database at `place`, the workload's schema, the topic and (unless relay
    /// only) its subscriptions, and writes the workers' config into `dir`.
    pub async fn create(
        dir: &Path,
        place: &Place,
        args: &PipelineArgs,
        ack_deadline_secs: i32,
        takeover: Takeover,
    ) -> anyhow::Result<Self> {
        let db = workload::database(place.database_server.as_deref(), args.app_rows).await?;
        let mut config = CourierConfig {
            database: db.config.clone(),
            pubsub: courier::config::PubSubConfig {
                project: "courier-load".into(),
                emulator_host: Some(place.emulator_host.clone()),
            },
            ..Default::default()
        };
        // Deployment defaults but for the lease the takeover asks for and retries capped at
        // 5 s (a fault's backlog drains soon after it).
        config.relay.shard_count = args.shards;
        if takeover == Takeover::Quick {
            config.relay.claim_lease_secs = 5;
            config.relay.publish_timeout_secs = 4;
        }
        config.relay.retry_base_millis = 200;
        config.relay.retry_cap_millis = 5_000;
        config.consumer.streams = args.streams;
        config.consumer.lease_extension_secs = u64::try_from(ack_deadline_secs).unwrap_or(10);
        config.database.pool_size = args.shards + 8;
        config.database.connect_timeout_secs = 5;

        let topic = unique_name("load.events");
        let mut subscription = SubscriptionSpec::standard(&topic, "load", "projector");
        subscription.ack_deadline_secs = ack_deadline_secs;
        subscription.retain_acked = false;
        let dead_letter = subscription
            .dead_letter
            .clone()
            .context("the standard subscription has a dead-letter policy")?;
        let keeper = SubscriptionSpec::dead_letter_keeper(&subscription, &dead_letter);
        let pubsub = PubSub::new(config.pubsub.clone());
        if args.relay_only {
            let admin = pubsub.topic_admin().await?;
            pubsub
                .ensure_topic(&admin, &topic)
                .await
                .context("create the load topic")?;
        } else {
            pubsub
                .provision(&subscription)
                .await
                .context("provision the load topic and subscription")?;
        }
        let config_path = dir.join("courier.toml");
        let mut workers_config = config.clone();
        workers_config.pubsub.emulator_host = Some(place.workers_emulator_host.clone());
        std::fs::write(&config_path, worker_config(&workers_config))
            .with_context(|| format!("write {}", config_path.display()))?;
        Ok(Self {
            db,
            emulator_host: place.emulator_host.clone(),
            workers_emulator_host: place.workers_emulator_host.clone(),
            scope: args.scope(),
            key_space: args.key_space,
            workload: args.workload,
            app_rows: args.app_rows,
            consumer_lock_timeout: None,
            config,
            topic,
            subscription,
            dead_letter_topic: dead_letter.topic,
            dead_letter_keeper: keeper.name,
            config_path,
        })
    }

    pub fn pubsub(&self) -> PubSub {
        PubSub::new(self.config.pubsub.clone())
    }

    /// A new connection to the run's database, outside the pool.
    pub async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.db.client().await
    }
}

/// The keys of `config` the workers need, as the TOML `CourierConfig::load` reads.
fn worker_config(config: &CourierConfig) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    format!(
        "[database]\nurl = {url}\nschema = {schema}\npool_size = {pool}\nconnect_timeout_secs = {connect}\n\n\
         [pubsub]\nproject = {project}\nemulator_host = {host}\n\n\
         [relay]\nshard_count = {shards}\nclaim_lease_secs = {lease}\nretry_base_millis = {retry_base}\n\
         retry_cap_millis = {retry_cap}\npublish_timeout_secs = {publish_timeout}\n\n\
         [consumer]\nstreams = {streams}\nlease_extension_secs = {lease_extension}\n",
        url = quote(&config.database.url),
        schema = quote(&config.database.schema),
        pool = config.database.pool_size,
        connect = config.database.connect_timeout_secs,
        project = quote(&config.pubsub.project),
        host = quote(config.pubsub.emulator_host.as_deref().unwrap_or_default()),
        shards = config.relay.shard_count,
        lease = config.relay.claim_lease_secs,
        retry_base = config.relay.retry_base_millis,
        retry_cap = config.relay.retry_cap_millis,
        publish_timeout = config.relay.publish_timeout_secs,
        streams = config.consumer.streams,
        lease_extension = config.consumer.lease_extension_secs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_config_reads_back_as_the_same_settings() {
        let mut config = CourierConfig::default();
        config.database.url = "host=127.0.0.1 port=5 user=postgres dbname=x".into();
        config.pubsub.emulator_host = Some("127.0.0.1:9".into());
        config.relay.shard_count = 3;
        config.consumer.streams = 2;
        let text = worker_config(&config);
        let back = CourierConfig::from_toml_and_env(&text, Vec::new()).expect("valid config");
        assert_eq!(back.database.url, config.database.url);
        assert_eq!(back.pubsub.emulator_host, config.pubsub.emulator_host);
        assert_eq!(back.relay.shard_count, 3);
        assert_eq!(back.consumer.streams, 2);
    }
}
