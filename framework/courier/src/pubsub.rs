//! Google Cloud Pub/Sub clients built from [`PubSubConfig`], and idempotent provisioning.
//!
//! The official crate ignores `PUBSUB_EMULATOR_HOST`, and without explicit credentials its first
//! call waits for Google's metadata server for over a minute. When the config names an emulator,
//! every client built here gets the plaintext endpoint *and* anonymous credentials.

use crate::config::PubSubConfig;
use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::{
    BasePublisher, Publisher, Subscriber, SubscriptionAdmin, TopicAdmin,
};
use google_cloud_pubsub::model::{DeadLetterPolicy, RetryPolicy, Subscription};
use std::time::Duration;

/// A Pub/Sub call that failed, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum PubSubError {
    #[error("{context}: {source}")]
    Rpc {
        context: String,
        source: google_cloud_pubsub::Error,
    },
    #[error("{context}: cannot build client: {source}")]
    Build {
        context: String,
        source: google_cloud_gax::client_builder::Error,
    },
    /// The runtime a client was being built on stopped (the process is shutting down).
    #[error("{context}: the client runtime stopped: {reason}")]
    Stopped { context: String, reason: String },
}

impl PubSubError {
    /// True when the same call may succeed later (unavailable, deadline, aborted, throttled,
    /// not-found while a topic is being provisioned is *not* included: it needs an operator).
    pub fn is_transient(&self) -> bool {
        match self {
            PubSubError::Rpc { source, .. } => is_transient_rpc(source),
            PubSubError::Build { .. } | PubSubError::Stopped { .. } => false,
        }
    }
}

/// Classifies a Pub/Sub RPC error.
pub fn is_transient_rpc(error: &google_cloud_pubsub::Error) -> bool {
    match error.status().map(|s| s.code) {
        Some(
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
            | Code::Unknown
            | Code::Cancelled,
        ) => true,
        Some(_) => false,
        // No status: transport failures (connection refused, reset, timeout).
        None => true,
    }
}

/// Whether a transient RPC error says the broker is slow, unreachable or overloaded, rather
/// than something about the request: such failures are not the published row's doing.
pub fn is_broker_side(error: &google_cloud_pubsub::Error) -> bool {
    match error.status().map(|s| s.code) {
        Some(
            Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Cancelled,
        ) => true,
        Some(_) => false,
        None => true,
    }
}

fn status_is(error: &google_cloud_pubsub::Error, code: Code) -> bool {
    error.status().is_some_and(|s| s.code == code)
}

/// Builds clients for one project, against real Pub/Sub or the emulator.
#[derive(Debug, Clone)]
pub struct PubSub {
    config: PubSubConfig,
}

/// Applies the emulator endpoint and anonymous credentials to any of the crate's builders,
/// which share method names but no trait.
macro_rules! configure {
    ($self:expr, $builder:expr) => {{
        let builder = $builder;
        match &$self.config.emulator_host {
            Some(host) => builder
                .with_endpoint(format!("http://{host}"))
                .with_credentials(
                    google_cloud_auth::credentials::anonymous::Builder::new().build(),
                ),
            None => builder,
        }
    }};
}

impl PubSub {
    pub fn new(config: PubSubConfig) -> Self {
        Self { config }
    }

    pub fn project(&self) -> &str {
        &self.config.project
    }

    pub fn topic_path(&self, topic_id: &str) -> String {
        format!("projects/{}/topics/{topic_id}", self.config.project)
    }

    pub fn subscription_path(&self, subscription_id: &str) -> String {
        format!(
            "projects/{}/subscriptions/{subscription_id}",
            self.config.project
        )
    }

    /// A batching publisher for one topic. `delay` bounds how long a message waits for its
    /// batch to fill.
    pub async fn publisher(
        &self,
        topic_id: &str,
        delay: Duration,
    ) -> Result<Publisher, PubSubError> {
        configure!(self, Publisher::builder(self.topic_path(topic_id)))
            .set_delay_threshold(delay)
            .build()
            .await
            .map_err(|source| PubSubError::Build {
                context: format!("publisher for topic {topic_id}"),
                source,
            })
    }

    /// One gRPC connection for cheap per-topic publishers (`base.publisher(topic).build()`),
    /// each of which frees its per-key state when dropped (see `relay::topic_clients`).
    pub async fn base_publisher(&self) -> Result<BasePublisher, PubSubError> {
        configure!(self, BasePublisher::builder())
            .build()
            .await
            .map_err(|source| PubSubError::Build {
                context: "the Pub/Sub publishing connection".into(),
                source,
            })
    }

    pub async fn subscriber(&self) -> Result<Subscriber, PubSubError> {
        configure!(self, Subscriber::builder())
            .build()
            .await
            .map_err(|source| PubSubError::Build {
                context: "subscriber".into(),
                source,
            })
    }

    pub async fn topic_admin(&self) -> Result<TopicAdmin, PubSubError> {
        configure!(self, TopicAdmin::builder())
            .build()
            .await
            .map_err(|source| PubSubError::Build {
                context: "topic admin".into(),
                source,
            })
    }

    pub async fn subscription_admin(&self) -> Result<SubscriptionAdmin, PubSubError> {
        configure!(self, SubscriptionAdmin::builder())
            .build()
            .await
            .map_err(|source| PubSubError::Build {
                context: "subscription admin".into(),
                source,
            })
    }

    /// Creates the topic unless it exists. Returns whether it was created.
    pub async fn ensure_topic(
        &self,
        admin: &TopicAdmin,
        topic_id: &str,
    ) -> Result<bool, PubSubError> {
        match admin
            .create_topic()
            .set_name(self.topic_path(topic_id))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status_is(&e, Code::AlreadyExists) => Ok(false),
            Err(source) => Err(PubSubError::Rpc {
                context: format!("create topic {topic_id}"),
                source,
            }),
        }
    }

    /// Creates the subscription unless it exists. Returns whether it was created.
    pub async fn ensure_subscription(
        &self,
        admin: &SubscriptionAdmin,
        spec: &SubscriptionSpec,
    ) -> Result<bool, PubSubError> {
        let mut subscription = Subscription::new()
            .set_name(self.subscription_path(&spec.name))
            .set_topic(self.topic_path(&spec.topic))
            .set_enable_message_ordering(spec.ordering)
            .set_ack_deadline_seconds(spec.ack_deadline_secs)
            .set_retain_acked_messages(spec.retain_acked)
            .set_enable_exactly_once_delivery(spec.exactly_once)
            .set_retry_policy(
                RetryPolicy::new()
                    .set_minimum_backoff(wkt_duration(spec.min_retry_backoff))
                    .set_maximum_backoff(wkt_duration(spec.max_retry_backoff)),
            );
        if let Some(dead_letter) = &spec.dead_letter {
            subscription = subscription.set_dead_letter_policy(
                DeadLetterPolicy::new()
                    .set_dead_letter_topic(self.topic_path(&dead_letter.topic))
                    .set_max_delivery_attempts(dead_letter.max_delivery_attempts),
            );
        }
        match admin
            .create_subscription()
            .with_request(subscription)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status_is(&e, Code::AlreadyExists) => Ok(false),
            Err(source) => Err(PubSubError::Rpc {
                context: format!("create subscription {}", spec.name),
                source,
            }),
        }
    }
}

impl PubSub {
    /// Seeks `subscription` to `time`: messages published since then that the subscription
    /// retained (acked or not) are delivered again. Needs `retain_acked` on the subscription.
    pub async fn seek(
        &self,
        admin: &SubscriptionAdmin,
        subscription: &str,
        time: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), PubSubError> {
        let nanos = i32::try_from(time.timestamp_subsec_nanos()).unwrap_or(0);
        admin
            .seek()
            .set_subscription(self.subscription_path(subscription))
            .set_time(google_cloud_wkt::Timestamp::clamp(time.timestamp(), nanos))
            .send()
            .await
            .map(|_| ())
            .map_err(|source| PubSubError::Rpc {
                context: format!("seek subscription {subscription} to {time}"),
                source,
            })
    }

    /// Creates, unless they exist, the subscription's topic, its dead-letter topic with a
    /// subscription that keeps dead letters for inspection, and the subscription itself.
    /// Returns what it created, as `topic …` / `subscription …` lines.
    pub async fn provision(&self, spec: &SubscriptionSpec) -> Result<Vec<String>, PubSubError> {
        let topics = self.topic_admin().await?;
        let subscriptions = self.subscription_admin().await?;
        let mut created = Vec::new();
        if self.ensure_topic(&topics, &spec.topic).await? {
            created.push(format!("topic {}", spec.topic));
        }
        if let Some(dead_letter) = &spec.dead_letter {
            if self.ensure_topic(&topics, &dead_letter.topic).await? {
                created.push(format!("topic {}", dead_letter.topic));
            }
            // A topic without subscriptions drops what is published to it.
            let keeper = SubscriptionSpec::dead_letter_keeper(spec, dead_letter);
            if self.ensure_subscription(&subscriptions, &keeper).await? {
                created.push(format!("subscription {}", keeper.name));
            }
        }
        if self.ensure_subscription(&subscriptions, spec).await? {
            created.push(format!("subscription {}", spec.name));
        }
        Ok(created)
    }
}

fn wkt_duration(d: Duration) -> google_cloud_wkt::Duration {
    google_cloud_wkt::Duration::clamp(i64::try_from(d.as_secs()).unwrap_or(i64::MAX), 0)
}

/// A subscription as docs/design.md (Contracts) wants it, with overridable defaults.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    pub name: String,
    pub topic: String,
    pub ordering: bool,
    pub ack_deadline_secs: i32,
    /// Keep acked messages so Seek can replay them.
    pub retain_acked: bool,
    pub min_retry_backoff: Duration,
    pub max_retry_backoff: Duration,
    pub dead_letter: Option<DeadLetterSpec>,
    /// Exactly-once delivery: Pub/Sub does not redeliver a message whose ack it confirmed,
    /// and the consumer waits for that confirmation (`confirmed_ack`). Off by default: the
    /// inbox already gives every event one effect, and confirmed acks cost throughput.
    pub exactly_once: bool,
}

#[derive(Debug, Clone)]
pub struct DeadLetterSpec {
    pub topic: String,
    pub max_delivery_attempts: i32,
}

/// The topic of a subscription named by [`SubscriptionSpec::standard`]
/// (`<topic>.<consumer>-<role>`), or `None` for a name that does not follow it.
pub fn topic_of_subscription(subscription: &str) -> Option<&str> {
    subscription
        .rsplit_once('.')
        .filter(|(topic, suffix)| !topic.is_empty() && suffix.contains('-'))
        .map(|(topic, _)| topic)
}

impl SubscriptionSpec {
    /// `<topic>.<consumer>-<role>` with ordering, 60 s ack deadline, 10–600 s retry backoff,
    /// acked-message retention, and `<topic>.dlq` after 5 attempts.
    pub fn standard(topic: &str, consumer: &str, role: &str) -> Self {
        Self {
            name: format!("{topic}.{consumer}-{role}"),
            topic: topic.into(),
            ordering: true,
            ack_deadline_secs: 60,
            retain_acked: true,
            min_retry_backoff: Duration::from_secs(10),
            max_retry_backoff: Duration::from_secs(600),
            dead_letter: Some(DeadLetterSpec {
                topic: format!("{topic}.dlq"),
                max_delivery_attempts: 5,
            }),
            exactly_once: false,
        }
    }

    /// The subscription on `<topic>.dlq` that keeps `spec`'s dead letters for operators:
    /// `<subscription>.dlq`, unordered, retaining acked messages for 7 days.
    pub fn dead_letter_keeper(spec: &SubscriptionSpec, dead_letter: &DeadLetterSpec) -> Self {
        Self {
            ordering: false,
            retain_acked: true,
            dead_letter: None,
            ..Self::plain(&format!("{}.dlq", spec.name), &dead_letter.topic)
        }
    }

    /// A plain ordered subscription, without dead-lettering (tests, operator taps).
    pub fn plain(name: &str, topic: &str) -> Self {
        Self {
            name: name.into(),
            topic: topic.into(),
            ordering: true,
            ack_deadline_secs: 60,
            retain_acked: false,
            min_retry_backoff: Duration::from_secs(10),
            max_retry_backoff: Duration::from_secs(600),
            dead_letter: None,
            exactly_once: false,
        }
    }
}
