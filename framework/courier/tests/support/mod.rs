//! Shared by the read-side test binaries: a test read model, a publisher of events with the
//! framework's attributes, and one provisioned subscription per test.

#![allow(dead_code)] // each test binary uses a different part

use courier::db::PgTransaction;
use courier::inbound::{
    Consumer, ConsumerHandle, ConsumerOptions, ConsumerSpec, EventMeta, HandlerError, Projection,
    VersionedUpsert,
};
use courier::outbox::attributes::{self, RequiredFields};
use courier::pubsub::SubscriptionSpec;
use courier::supervision::EscalationHandler;
use courier::CourierConfig;
use courier_testkit::{test_config, unique_name, Collector, TestDb, TestPubSub};
use google_cloud_pubsub::model::Message;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

/// The payload of the test events.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Change {
    #[prost(string, tag = "1")]
    pub title: String,
}

/// Titles that make the test handler misbehave.
pub const PERMANENT: &str = "permanent-failure";
pub const ALWAYS_TRANSIENT: &str = "always-transient";
/// Fails transiently this many times per event: `transient-2`.
pub const TRANSIENT_PREFIX: &str = "transient-";
/// Fails transiently until [`Videos::release`] is set.
pub const UNTIL_RELEASED: &str = "until-released";
/// Sleeps this many seconds: `slow-15`.
pub const SLOW_PREFIX: &str = "slow-";
/// Passes the handler but is refused by a deferred constraint trigger at commit.
pub const FAIL_AT_COMMIT: &str = "fail-at-commit";

const SCHEMA: &str = "
CREATE SCHEMA app;
CREATE TABLE app.videos (
    video_id text PRIMARY KEY,
    title    text   NOT NULL,
    version  bigint NOT NULL
);
-- How many times each event's effect was committed: a second effect shows as 2. `applied_order`
-- is drawn when the first effect is written: a whole-state read model hides the order in which
-- events were applied, this column does not.
CREATE TABLE app.effects (
    event_id      uuid PRIMARY KEY,
    applications  integer NOT NULL,
    applied_order bigserial NOT NULL
);
CREATE FUNCTION app.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.title = 'fail-at-commit' THEN
        RAISE EXCEPTION 'title refused at commit';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON app.videos
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION app.refuse_at_commit();
";

/// `app.videos` through the versioned upsert, and `app.effects` counting applications.
pub struct Videos {
    upsert: VersionedUpsert,
    /// Handler calls per event id (every call, committed or not).
    pub calls: Arc<Mutex<HashMap<Uuid, u32>>>,
    /// Lets events titled [`UNTIL_RELEASED`] through.
    pub release: Arc<std::sync::atomic::AtomicBool>,
    /// Declares the events deltas ([`Projection::contiguous_versions`]).
    pub contiguous: bool,
    /// Declares the keys' handlers independent ([`Projection::independent_keys`]).
    pub independent: bool,
}

impl Videos {
    pub fn new() -> Self {
        Self {
            upsert: VersionedUpsert::new("app.videos", &["video_id"], &["title"])
                .expect("valid upsert"),
            calls: Arc::default(),
            release: Arc::default(),
            contiguous: false,
            independent: false,
        }
    }

    /// The same read model, its events declared deltas: a key's versions apply one after
    /// another, a gap holds and then parks the key.
    pub fn contiguous() -> Self {
        Self {
            contiguous: true,
            ..Self::new()
        }
    }

    /// The same, its keys' handlers declared independent: a shared transaction applies its
    /// keys together.
    pub fn independent(self) -> Self {
        Self {
            independent: true,
            ..self
        }
    }
}

impl Projection for Videos {
    type Event = Change;

    fn contiguous_versions(&self) -> bool {
        self.contiguous
    }

    fn independent_keys(&self) -> bool {
        self.independent
    }

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Change,
    ) -> Result<(), HandlerError> {
        let calls = {
            let mut calls = self.calls.lock().expect("lock");
            let n = calls.entry(meta.event_id).or_default();
            *n += 1;
            *n
        };
        if event.title == PERMANENT {
            return Err(HandlerError::Permanent(
                "the handler refuses this title".into(),
            ));
        }
        if event.title == ALWAYS_TRANSIENT {
            return Err(HandlerError::Transient("injected, every time".into()));
        }
        if event.title == UNTIL_RELEASED && !self.release.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(HandlerError::Transient("not released yet".into()));
        }
        if let Some(n) = event.title.strip_prefix(TRANSIENT_PREFIX) {
            if calls <= n.parse().unwrap_or(0) {
                return Err(HandlerError::Transient(format!("injected, call {calls}")));
            }
        }
        if let Some(secs) = event.title.strip_prefix(SLOW_PREFIX) {
            tokio::time::sleep(Duration::from_secs(secs.parse().unwrap_or(0))).await;
        }
        self.upsert
            .execute(tx, &[&meta.aggregate_id, &event.title], meta.version)
            .await?;
        let count_effect = tx
            .prepared(
                "INSERT INTO app.effects (event_id, applications) VALUES ($1, 1)
                 ON CONFLICT (event_id) DO UPDATE SET applications = app.effects.applications + 1",
            )
            .await?;
        tx.execute(&count_effect, &[&meta.event_id]).await?;
        Ok(())
    }
}

/// One event as the tests publish it.
#[derive(Debug, Clone)]
pub struct TestEvent {
    pub event_id: Uuid,
    pub key: String,
    pub version: i64,
    pub title: String,
    pub schema_version: i32,
    /// Sent instead of the encoded `Change` (garbage for poison tests).
    pub raw_data: Option<Vec<u8>>,
}

impl TestEvent {
    pub fn new(key: &str, version: i64, title: &str) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            key: key.into(),
            version,
            title: title.into(),
            schema_version: 1,
            raw_data: None,
        }
    }

    pub fn message(&self) -> Message {
        let data = self.raw_data.clone().unwrap_or_else(|| {
            prost::Message::encode_to_vec(&Change {
                title: self.title.clone(),
            })
        });
        let attributes = attributes::build(
            RequiredFields {
                event_id: self.event_id,
                event_type: "video.changed",
                aggregate_id: &self.key,
                aggregate_type: "video",
                version: self.version,
                occurred_at: chrono::Utc::now(),
                schema_version: self.schema_version,
            },
            [],
        );
        Message::new()
            .set_data(data)
            .set_ordering_key(self.key.clone())
            .set_attributes(attributes)
    }
}

/// A test's database, topic, provisioned subscription (with its dead-letter topic and keeper),
/// and config.
pub struct ReadSetup {
    pub db: TestDb,
    pub pubsub: TestPubSub,
    pub config: CourierConfig,
    pub subscription: SubscriptionSpec,
    pub consumer: ConsumerSpec,
    /// Receives what lands on the dead-letter topic.
    pub dead_letters: Collector,
}

pub async fn read_setup(tweak: impl FnOnce(&mut CourierConfig)) -> anyhow::Result<ReadSetup> {
    read_setup_with(|_| {}, tweak).await
}

/// With a say in the subscription (unordered for Seek, which the emulator supports only
/// without ordering; no retention for big backlogs).
pub async fn read_setup_with(
    subscription_tweak: impl FnOnce(&mut SubscriptionSpec),
    tweak: impl FnOnce(&mut CourierConfig),
) -> anyhow::Result<ReadSetup> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    db.client().await?.batch_execute(SCHEMA).await?;
    let pubsub = TestPubSub::get().await?;
    let topic = unique_name("reads");
    let mut subscription = SubscriptionSpec::standard(&topic, "tests", "reader");
    // Short deadlines: the emulator holds a stopped consumer's messages until they expire.
    subscription.ack_deadline_secs = 10;
    subscription.min_retry_backoff = Duration::from_secs(1);
    subscription_tweak(&mut subscription);
    let created = pubsub.client().provision(&subscription).await?;
    assert_eq!(created.len(), 4, "provisioned {created:?}");
    let dead_letter = subscription
        .dead_letter
        .clone()
        .expect("standard has a DLQ");
    let keeper = SubscriptionSpec::dead_letter_keeper(&subscription, &dead_letter);
    let dead_letters = Collector::start(&pubsub, &keeper.name).await?;
    let mut config = test_config(&db, &pubsub);
    config.consumer.streams = 1;
    config.consumer.max_delivery_attempts = 3;
    config.consumer.lease_extension_secs = 10;
    config.consumer.projector_idle_secs = 2;
    // Two quick retries in place, then the delivery goes back: tests see both paths fast.
    config.consumer.transient_retries = 2;
    config.consumer.transient_backoff_first_millis = 10;
    config.consumer.transient_backoff_cap_millis = 50;
    tweak(&mut config);
    let consumer = ConsumerSpec {
        group: "test-readers".into(),
        subscription: subscription.name.clone(),
        dead_letter_topic: dead_letter.topic,
    };
    Ok(ReadSetup {
        db,
        pubsub,
        config,
        subscription,
        consumer,
        dead_letters,
    })
}

impl ReadSetup {
    pub fn spawn(&self, projection: Videos, options: ConsumerOptions) -> ConsumerHandle {
        Consumer::spawn(
            &self.config,
            self.consumer.clone(),
            projection,
            ConsumerOptions {
                escalate: no_escalation(),
                ..options
            },
        )
        .expect("consumer starts")
    }

    /// Publishes `events` in order and waits until Pub/Sub stored them all.
    /// Publishes `events` in order, each key's on its ordering key.
    ///
    /// The emulator, loaded by the tests running beside this one, now and then fails a publish
    /// (a deadline). The publisher then pauses that key and fails the key's later messages too;
    /// they are resumed and published again, in order, a few times. A failed message that did
    /// reach the broker arrives twice, which the inbox deduplicates.
    pub async fn publish(&self, events: &[TestEvent]) -> anyhow::Result<()> {
        const ATTEMPTS: u32 = 5;
        let publisher = self
            .pubsub
            .client()
            .publisher(&self.subscription.topic, Duration::from_millis(5))
            .await?;
        let mut pending: Vec<&TestEvent> = events.iter().collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut failed = Vec::new();
            let mut last_error = None;
            for chunk in pending.chunks(5_000) {
                let sent = chunk.iter().map(|e| publisher.publish(e.message()));
                for (event, result) in chunk.iter().zip(futures::future::join_all(sent).await) {
                    if let Err(e) = result {
                        failed.push(*event);
                        last_error = Some(e);
                    }
                }
            }
            let Some(error) = last_error else {
                return Ok(());
            };
            if attempt == ATTEMPTS {
                anyhow::bail!(
                    "{} of {} events still unpublished after {ATTEMPTS} attempts: {error}",
                    failed.len(),
                    events.len()
                );
            }
            tracing::warn!(failed = failed.len(), attempt, %error, "test publish failed; publishing again");
            let keys: std::collections::HashSet<&str> =
                failed.iter().map(|e| e.key.as_str()).collect();
            for key in keys {
                publisher.resume_publish(key);
            }
            tokio::time::sleep(Duration::from_millis(200) * attempt).await;
            pending = failed;
        }
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        let client = self.db.client().await.expect("client");
        client.query_one(sql, &[]).await.expect(sql).get(0)
    }

    /// `app.videos` as (video_id → (title, version)).
    pub async fn videos(&self) -> HashMap<String, (String, i64)> {
        let client = self.db.client().await.expect("client");
        client
            .query("SELECT video_id, title, version FROM app.videos", &[])
            .await
            .expect("videos")
            .into_iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    }
}

/// Records nothing: these tests do not provoke escalation, and must not exit the process.
fn no_escalation() -> EscalationHandler {
    Arc::new(|e| panic!("unexpected escalation: {e:?}"))
}

/// Resident memory of this process, in bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
