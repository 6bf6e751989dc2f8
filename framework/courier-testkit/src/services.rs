//! Services running in this process for a test: one database with a schema and a role per
//! service, and a Pub/Sub project of their own on the emulator, so no other test's topics or
//! subscriptions meet theirs.

use crate::{test_config, Api, Collector, TestDb, TestPubSub};
use anyhow::Context as _;
use courier::config::PubSubConfig;
use courier::inbound::ConsumerOptions;
use courier::outbox::attributes::{self, RequiredFields};
use courier::pubsub::{PubSub, SubscriptionSpec};
use courier::relay::RelayOptions;
use courier::service::runtime::{self, RunOptions, RunningService};
use courier::service::Service;
use courier::supervision::EscalationHandler;
use courier::CourierConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// A service's declaration, as its crate exports it (`courier_catalog::service`).
pub type Declaration = fn() -> Service;

/// The services of a test, migrated, provisioned and running in this process.
///
/// ```ignore
/// let stack = ServiceStack::start(&[courier_catalog::service, courier_search::service]).await?;
/// let indexed = stack.collect("search.video.events").await?;
/// let created = stack.api("catalog").post("/videos", &video).await?;
/// // … write through catalog's API, wait_until the search service has it …
/// stack.redeliver("catalog", event_id).await?; // the consumer receives it a second time
/// ```
pub struct ServiceStack {
    pub db: TestDb,
    pub pubsub: TestPubSub,
    /// The stack's own project on the emulator.
    pub project: PubSubConfig,
    members: Vec<Member>,
}

struct Member {
    name: &'static str,
    declare: Declaration,
    config: CourierConfig,
    running: Option<RunningService>,
}

/// Nothing in a test should exhaust a restart budget: an escalation fails it loudly.
fn no_escalation() -> EscalationHandler {
    Arc::new(|e| panic!("unexpected escalation: {e:?}"))
}

/// A service's config in a test: its own schema and role in `db` ([`TestDb::service_database`]),
/// the emulator project `project`, any free port, one StreamingPull stream.
pub fn service_config(
    db: &TestDb,
    pubsub: &TestPubSub,
    project: &PubSubConfig,
    schema: &str,
) -> CourierConfig {
    let mut config = test_config(db, pubsub);
    config.database = db.service_database(schema);
    config.database.pool_size = 4;
    config.pubsub = project.clone();
    config.http.listen = "127.0.0.1:0".into();
    config.consumer.streams = 1;
    // The emulator holds a stopped stream's messages until this deadline passes
    // (docs/emulator.md).
    config.consumer.lease_extension_secs = 10;
    config
}

/// The run options of a stack's services: the framework's, failing the test on escalation.
pub fn run_options() -> RunOptions {
    RunOptions {
        relay: RelayOptions {
            escalate: no_escalation(),
            ..RelayOptions::default()
        },
        consumer: ConsumerOptions {
            escalate: no_escalation(),
            ..ConsumerOptions::default()
        },
        ..RunOptions::default()
    }
}

impl ServiceStack {
    /// Migrates and provisions `services` (every subscription exists before any of them
    /// publishes: Pub/Sub keeps nothing a topic receives while it has no subscription), then
    /// starts them, each on a free port.
    pub async fn start(services: &[Declaration]) -> anyhow::Result<Self> {
        Self::start_with(services, |_, _| {}, |_| {}).await
    }

    /// [`ServiceStack::start`] with a change to each service's config (given its name) and
    /// to each inbound subscription before it is created. Subscriptions get a 10 s ack
    /// deadline, so a message a stopped consumer held comes back quickly.
    pub async fn start_with(
        services: &[Declaration],
        configure: impl Fn(&str, &mut CourierConfig),
        subscription: impl Fn(&mut SubscriptionSpec),
    ) -> anyhow::Result<Self> {
        crate::init_logging();
        let db = TestDb::new().await?;
        let pubsub = TestPubSub::get().await?;
        let project = pubsub.isolated_config();
        let client = PubSub::new(project.clone());
        let mut members = Vec::new();
        for &declare in services {
            let service = declare();
            let mut config = service_config(&db, &pubsub, &project, service.name);
            configure(service.name, &mut config);
            for inbound in &service.inbound {
                let mut spec = inbound.subscription(service.name);
                spec.ack_deadline_secs = 10;
                subscription(&mut spec);
                client
                    .provision(&spec)
                    .await
                    .with_context(|| format!("provision {}", spec.name))?;
            }
            runtime::migrate(&service, &config)
                .await
                .with_context(|| format!("migrate {}", service.name))?;
            runtime::provision(&service, &config)
                .await
                .with_context(|| format!("provision {}", service.name))?;
            members.push(Member {
                name: service.name,
                declare,
                config,
                running: None,
            });
        }
        let mut stack = Self {
            db,
            pubsub,
            project,
            members,
        };
        for member in &mut stack.members {
            let running = RunningService::start((member.declare)(), &member.config, run_options())
                .await
                .with_context(|| format!("start {}", member.name))?;
            member.running = Some(running);
        }
        Ok(stack)
    }

    fn member(&self, service: &str) -> &Member {
        self.members
            .iter()
            .find(|m| m.name == service)
            .unwrap_or_else(|| panic!("{service} is not in this stack"))
    }

    /// The config `service` runs with.
    pub fn config(&self, service: &str) -> &CourierConfig {
        &self.member(service).config
    }

    /// Where `service`'s HTTP server listens.
    pub fn addr(&self, service: &str) -> SocketAddr {
        match &self.member(service).running {
            Some(running) => running.addr,
            None => panic!("{service} is not running"),
        }
    }

    /// A client for `service`'s HTTP API, with its bearer token when it has one.
    pub fn api(&self, service: &str) -> Api {
        Api::new(
            self.addr(service),
            self.config(service).http.auth_token.clone(),
        )
    }

    /// Collects what `topic` of the stack's project receives from now on (a subscription of
    /// the test's own, unordered so it never stalls on a key).
    pub async fn collect(&self, topic: &str) -> anyhow::Result<Collector> {
        let client = PubSub::new(self.project.clone());
        let mut spec = SubscriptionSpec::plain(&crate::unique_name(&format!("{topic}.tap")), topic);
        spec.ordering = false;
        client.provision(&spec).await?;
        Collector::start_on(&client, &spec.name).await
    }

    /// Publishes the event `event_id` of `service`'s outbox again, as its relay published it
    /// (payload, ordering key, attributes): every subscriber receives it a second time, as
    /// after a lost ack, without stopping anything.
    pub async fn redeliver(&self, service: &str, event_id: Uuid) -> anyhow::Result<()> {
        let schema = &self.config(service).database.schema;
        let row = self
            .db
            .client()
            .await?
            .query_opt(
                &format!(
                    "SELECT topic, event_type, aggregate_id, aggregate_type, version,
                            occurred_at, schema_version, attributes, payload
                     FROM {schema}.outbox WHERE id = $1"
                ),
                &[&event_id],
            )
            .await?
            .with_context(|| format!("event {event_id} is not in {schema}.outbox"))?;
        let topic: String = row.try_get("topic")?;
        let optional: serde_json::Value = row.try_get("attributes")?;
        let message = attributes::message(
            RequiredFields {
                event_id,
                event_type: row.try_get("event_type")?,
                aggregate_id: row.try_get("aggregate_id")?,
                aggregate_type: row.try_get("aggregate_type")?,
                version: row.try_get("version")?,
                occurred_at: row.try_get("occurred_at")?,
                schema_version: row.try_get("schema_version")?,
            },
            attributes::stored(optional.as_object().unwrap_or(&serde_json::Map::new())),
            row.try_get("payload")?,
        );
        let publisher = PubSub::new(self.project.clone())
            .publisher(&topic, Duration::from_millis(1))
            .await?;
        publisher
            .publish(message)
            .await
            .with_context(|| format!("publish event {event_id} again on {topic}"))?;
        Ok(())
    }

    /// Stops every service gracefully, the last started first.
    pub async fn shutdown(mut self, grace: Duration) {
        for member in self.members.iter_mut().rev() {
            if let Some(running) = member.running.take() {
                running.shutdown(grace).await;
            }
        }
    }
}

impl Drop for ServiceStack {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(running) = member.running.take() {
                running.kill();
            }
        }
    }
}
