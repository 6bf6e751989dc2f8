//! A service's declaration: its schema, topics, consumed subscriptions with their
//! projections, routes and backfills.

use super::error::ServiceError;
use crate::backfill::BackfillSource;
use crate::inbound::Projection;
use crate::inbound::{Consumer, ConsumerError, ConsumerHandle, ConsumerOptions, ConsumerSpec};
use crate::migrate::MigrationSet;
use crate::outbox::Outbox;
use crate::pubsub::SubscriptionSpec;
use crate::CourierConfig;
use std::sync::Arc;

/// A service, as the framework needs to know it.
pub struct Service {
    /// Names the service in subscriptions (`<topic>.<name>-<role>`), consumer groups, logs.
    pub name: &'static str,
    /// The service's own tables, applied after the framework's into the configured schema.
    pub migrations: MigrationSet,
    /// Topics the service's outbox publishes to (provisioned with message ordering).
    pub outbound_topics: &'static [&'static str],
    /// Subscriptions the service consumes, each feeding one projection.
    pub inbound: Vec<Inbound>,
    /// Registers the service's HTTP routes; handlers get [`ServiceContext`](crate::service::ServiceContext) as app data.
    pub routes: fn(&mut actix_web::web::ServiceConfig),
    /// The aggregates `backfill` can snapshot (one source per aggregate type).
    pub backfills: Vec<Arc<dyn BackfillSource>>,
}

impl Service {
    /// The backfill of `aggregate_type`, or of the only aggregate type when `None`.
    pub fn backfill(
        &self,
        aggregate_type: Option<&str>,
    ) -> Result<Arc<dyn BackfillSource>, ServiceError> {
        let known = || {
            self.backfills
                .iter()
                .map(|b| b.aggregate_type())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match aggregate_type {
            Some(wanted) => self
                .backfills
                .iter()
                .find(|b| b.aggregate_type() == wanted)
                .cloned()
                .ok_or_else(|| ServiceError::UnknownAggregate {
                    aggregate_type: wanted.into(),
                    known: known(),
                }),
            None => match self.backfills.as_slice() {
                [only] => Ok(only.clone()),
                [] => Err(ServiceError::NoBackfill),
                _ => Err(ServiceError::AggregateRequired { known: known() }),
            },
        }
    }
}

type StartConsumer = dyn Fn(&CourierConfig, ConsumerSpec, ConsumerOptions) -> Result<ConsumerHandle, ConsumerError>
    + Send
    + Sync;

/// One consumed subscription: `<topic>.<service>-<role>`, its dead-letter topic
/// `<topic>.dlq`, the projection its events feed and the tables that projection writes. The consumer group is
/// `<service>_<role>` (it names inbox rows, offsets and the `<group>_offset_lag_ms` gauge).
pub struct Inbound {
    pub topic: &'static str,
    pub role: &'static str,
    /// Provision the subscription with exactly-once delivery (see
    /// [`SubscriptionSpec::exactly_once`]).
    pub exactly_once: bool,
    /// The read-model tables the projection writes; `rebuild` clears them before the replay.
    pub tables: &'static [&'static str],
    start: Arc<StartConsumer>,
}

/// The deployment a projection built by [`Inbound::build`] runs in: what the service's
/// command line loaded (file, then `COURIER_*` overrides), when the consumer starts.
pub struct Deployment<'a> {
    pub config: &'a CourierConfig,
}

impl Deployment<'_> {
    /// The service's outbox, as its HTTP handlers have it (the deployment's schema and
    /// `relay.shard_count`). A projection that appends with the transaction `apply` is given
    /// emits iff its writes commit; a redelivered event is stopped by the inbox before
    /// `apply`, so it emits nothing twice.
    pub fn outbox(&self) -> Outbox {
        Outbox::new(self.config)
    }
}

impl Inbound {
    /// A projection that needs nothing of the deployment. Panics when a table name is not a
    /// plain identifier: the names are the service's own constants, spliced into `rebuild`'s
    /// SQL, so a bad one is a bug to stop at start-up.
    pub fn new<P: Projection + Clone>(
        topic: &'static str,
        role: &'static str,
        tables: &'static [&'static str],
        projection: P,
    ) -> Self {
        Self::build(topic, role, tables, move |_| projection.clone())
    }

    /// A projection built from the deployment each time its consumer starts: one that emits
    /// takes [`Deployment::outbox`]; one that needs a setting reads [`Deployment::config`].
    /// A service's declaration is made before its config is loaded, so this is where a
    /// projection sees it. Panics as [`Inbound::new`] does.
    pub fn build<P: Projection>(
        topic: &'static str,
        role: &'static str,
        tables: &'static [&'static str],
        build: impl Fn(&Deployment<'_>) -> P + Send + Sync + 'static,
    ) -> Self {
        if let Some(bad) = tables.iter().find(|t| !crate::config::is_identifier(t)) {
            panic!("projection table {bad:?} of role {role} is not a plain identifier");
        }
        Self {
            topic,
            role,
            exactly_once: false,
            tables,
            start: Arc::new(move |config, spec, options| {
                let projection = build(&Deployment { config });
                Consumer::spawn(config, spec, projection, options)
            }),
        }
    }

    /// Exactly-once delivery for this subscription.
    pub fn with_exactly_once(mut self) -> Self {
        self.exactly_once = true;
        self
    }

    /// The subscription, with ordering, dead-letter policy and backoff as docs/design.md (Contracts) says.
    pub fn subscription(&self, service: &str) -> SubscriptionSpec {
        SubscriptionSpec {
            exactly_once: self.exactly_once,
            ..SubscriptionSpec::standard(self.topic, service, self.role)
        }
    }

    pub fn consumer_spec(&self, service: &str) -> ConsumerSpec {
        let subscription = self.subscription(service);
        ConsumerSpec {
            group: format!("{service}_{}", self.role),
            subscription: subscription.name,
            dead_letter_topic: subscription
                .dead_letter
                .map(|d| d.topic)
                .unwrap_or_else(|| format!("{}.dlq", self.topic)),
        }
    }

    pub(super) fn spawn(
        &self,
        service: &str,
        config: &CourierConfig,
        options: ConsumerOptions,
    ) -> Result<ConsumerHandle, ConsumerError> {
        (self.start)(config, self.consumer_spec(service), options)
    }
}
