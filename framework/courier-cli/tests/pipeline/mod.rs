//! A pipeline in trouble for the console's tests (and its parked key for `courier parked`'s),
//! against real PostgreSQL and the emulator: a running relay with a dead row (its topic did not
//! exist when it was published), a parked key of a delta projection, two dead letters in a
//! subscription's keeper; and `courier console` over it as an operator starts it.

// Each test binary uses its part of this module.
#![allow(dead_code)]

use courier::operations::{DeadLetterLog, DeadLetters};
use courier::outbox::Outbox;
use courier::pubsub::SubscriptionSpec;
use courier::relay::RelayHandle;
use courier::CourierConfig;
use courier_testkit::{
    keyed_event, test_config, wait_until, Collector, Received, TestDb, TestPubSub,
};
use google_cloud_pubsub::model::Message;
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(30);
/// The bearer token the console is started with.
pub const TOKEN: &str = "console-test-token-0123456789";
pub const GROUP: &str = "engagement_reader";
/// The parked key: waits for v2, holds v3 and v4.
pub const PARKED_KEY: &str = "video-parked";

pub struct Pipeline {
    pub db: TestDb,
    pub pubsub: TestPubSub,
    pub config: CourierConfig,
    pub topic: String,
    /// `<topic>.engagement-reader`: what the collector reads, the parked key's and the dead
    /// letters' subscription.
    pub subscription: String,
    /// The dead row (`video-dead` v1); v2 of its key waits behind it.
    pub dead_event_id: String,
    pub held_event_id: String,
    pub collector: Collector,
    pub relay: RelayHandle,
}

impl Pipeline {
    pub async fn start() -> anyhow::Result<Self> {
        courier_testkit::init_logging();
        let db = TestDb::new().await?;
        let pubsub = TestPubSub::get().await?;
        let config = test_config(&db, &pubsub);
        let topic = format!("{}.events", courier_testkit::unique_name("console"));
        let subscription = format!("{topic}.engagement-reader");

        // v1 and v2 of one key to a topic that does not exist yet: the relay's publish of v1
        // is refused (NOT_FOUND, permanent), the row dies and v2 waits behind it.
        let (dead, held) = (
            keyed_event(&topic, "video-dead", 1),
            keyed_event(&topic, "video-dead", 2),
        );
        let (dead_event_id, held_event_id) = (dead.event_id.to_string(), held.event_id.to_string());
        {
            let mut conn = db.pool.get().await?;
            let tx = conn.transaction().await?;
            Outbox::new(&config)
                .append_all(&tx, vec![dead, held])
                .await?;
            tx.commit().await?;
        }
        let relay = courier_testkit::spawn_relay(&config)?;
        wait_until(WAIT, "the row to a missing topic dead", || async {
            db.scalar("SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL")
                .await
                .is_ok_and(|n| n == 1)
        })
        .await?;

        // The cause is fixed: the topic, its consumer's subscription, dead-letter topic and keeper.
        let client = pubsub.client();
        client
            .provision(&SubscriptionSpec::standard(&topic, "engagement", "reader"))
            .await?;
        let collector = Collector::start(&pubsub, &subscription).await?;

        park_key(&db, &subscription, PARKED_KEY).await?;

        // Two dead letters of two reasons, logged as the consumer logs them.
        let dead_letters = DeadLetters::new(
            &client,
            &format!("{topic}.dlq"),
            GROUP,
            &subscription,
            Duration::from_secs(10),
        )
        .await?;
        let log = DeadLetterLog::new("courier");
        for (event, key, reason) in [
            ("e1", "video-1", "unknown schema version 9"),
            ("e2", "video-2", "handler refused it"),
        ] {
            let original = Message::new()
                .set_message_id(format!("message-{event}"))
                .set_data(b"payload".to_vec())
                .set_attributes([
                    ("event_id".to_string(), event.to_string()),
                    ("event_type".to_string(), "video.changed".to_string()),
                ])
                .set_ordering_key(key);
            dead_letters
                .publish(&original, reason, Some(5))
                .await
                .map_err(anyhow::Error::msg)?;
            log.record(
                &db.pool,
                GROUP,
                &subscription,
                &format!("message-{event}"),
                key,
                reason,
            )
            .await?;
        }
        Ok(Self {
            db,
            pubsub,
            config,
            topic,
            subscription,
            dead_event_id,
            held_event_id,
            collector,
            relay,
        })
    }

    /// Starts `courier console` over the pipeline's schema, with the bearer token or without.
    pub async fn console(&self, token: Option<&str>) -> anyhow::Result<ConsoleProcess> {
        ConsoleProcess::start(self, token, &[]).await
    }

    /// [`Pipeline::console`] with more arguments for `courier console` (`--service …`).
    pub async fn console_with(
        &self,
        token: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<ConsoleProcess> {
        ConsoleProcess::start(self, token, args).await
    }

    /// Waits for the dead letter of event `event_id` (`e1` or `e2`) to be delivered again on
    /// the subscription, and returns it.
    pub async fn delivered_again(&self, event_id: &str) -> anyhow::Result<Received> {
        let find = || {
            self.collector
                .all()
                .into_iter()
                .find(|m| m.attribute("event_id") == Some(event_id))
        };
        wait_until(
            WAIT,
            "the republished dead letter delivered again",
            || async { find().is_some() },
        )
        .await?;
        find().ok_or_else(|| anyhow::anyhow!("{event_id} not delivered"))
    }

    /// The collector's events of `key`, by version attribute.
    pub fn versions_of(&self, key: &str) -> Vec<String> {
        self.collector
            .all()
            .iter()
            .filter(|m| m.ordering_key == key)
            .map(|m| m.attribute("version").unwrap_or_default().to_string())
            .collect()
    }
}

/// What a delta projection's consumer (group [`GROUP`]) leaves when v2 of `key` never came:
/// the key at v1, parked, v4 and v3 held (stored out of order on purpose).
pub async fn park_key(db: &TestDb, subscription: &str, key: &str) -> anyhow::Result<()> {
    db.client()
        .await?
        .batch_execute(&format!(
            "INSERT INTO courier.projection_keys VALUES ('{GROUP}', '{key}', now());
             INSERT INTO courier.projection_version_log VALUES ('{GROUP}', '{key}', 1);
             INSERT INTO courier.parked_keys (consumer_group, routing_key, subscription, expected_version, reason)
             VALUES ('{GROUP}', '{key}', '{subscription}', 2, 'version 2 did not come within 60 s');
             INSERT INTO courier.parked_events
                 (consumer_group, routing_key, event_id, version, message_id, ordering_key, attributes, data, publish_time)
             VALUES
               ('{GROUP}', '{key}', gen_random_uuid(), 4, 'm4', '{key}', '{{\"version\": \"4\"}}', 'four', now()),
               ('{GROUP}', '{key}', gen_random_uuid(), 3, 'm3', '{key}', '{{\"version\": \"3\"}}', 'three', now());"
        ))
        .await?;
    Ok(())
}

/// `courier console` running as its own process; killed when dropped.
pub struct ConsoleProcess {
    child: Child,
    /// `http://127.0.0.1:<port>/console/`
    pub url: String,
}

impl ConsoleProcess {
    async fn start(
        pipeline: &Pipeline,
        token: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_courier"));
        command
            .args([
                "--config",
                "/dev/null",
                "console",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .env("COURIER_DATABASE__URL", &pipeline.db.config.url)
            .env("PUBSUB_EMULATOR_HOST", &pipeline.pubsub.host)
            .env("COURIER_PUBSUB__PROJECT", pipeline.pubsub.config().project)
            .stdout(Stdio::piped());
        if let Some(token) = token {
            command.env("COURIER_HTTP__AUTH_TOKEN", token);
        }
        let mut child = command.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        // The first line says where it listens; a console that fails to start closes stdout.
        let first = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        });
        let line = match tokio::time::timeout(WAIT, first).await {
            Ok(Ok(Ok(line))) => line,
            other => {
                let _ = child.kill();
                anyhow::bail!("courier console did not start: {other:?}");
            }
        };
        let url = line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .ok_or_else(|| anyhow::anyhow!("no address in {line:?}"))?
            .to_owned();
        Ok(Self { child, url })
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
