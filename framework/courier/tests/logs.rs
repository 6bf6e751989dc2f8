//! Structured logs (its own test binary: it installs the process's JSON subscriber): a line
//! about one event names it (event_id / message_id, ordering_key, consumer_group or shard),
//! and no line carries payload bytes or the database password.

mod support;

use courier::inbound::ConsumerOptions;
use courier::outbox::{NewEvent, Outbox};
use courier::relay::{Relay, RelayOptions};
use courier_testkit::wait_until;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{read_setup, TestEvent, Videos, PERMANENT};

const WAIT: Duration = Duration::from_secs(30);
const PAYLOAD_MARKER: &str = "payload-marker-7f3a9c";
const PASSWORD: &str = "db-password-e41b77";

/// Collects what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    fn lines(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn with_message(&self, message: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message))
            })
            .collect()
    }
}

fn assert_fields(line: &Value, fields: &[&str]) {
    for field in fields {
        let value = &line["fields"][*field];
        assert!(
            !value.is_null() && value != "",
            "field {field} missing in {line}"
        );
    }
}

#[tokio::test]
async fn log_lines_about_an_event_name_it_and_carry_no_payload_or_password() -> anyhow::Result<()> {
    let captured = Captured::default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("info")
        .with_writer(captured.clone())
        .init();

    // Read side: a permanent failure (dead-lettered) and an event with a recognisable payload,
    // with the password in the database URL (trust auth ignores it).
    let s = read_setup(|config| {
        config.database.url = format!("{} password={PASSWORD}", config.database.url)
    })
    .await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    s.publish(&[
        TestEvent::new("logged", 1, PERMANENT),
        TestEvent::new("logged", 2, PAYLOAD_MARKER),
    ])
    .await?;
    wait_until(WAIT, "one dead letter and one applied event", || async {
        let stats = consumer.stats();
        stats.dead_lettered >= 1 && stats.applied >= 1
    })
    .await?;
    consumer.kill();

    // Write side: the first publish of a row fails once, then succeeds.
    let topic = s.pubsub.topic("logs").await?;
    let failed_once = Arc::new(AtomicBool::new(false));
    let flag = failed_once.clone();
    let fault: courier::relay::PublishFault = Arc::new(move |_| {
        (!flag.swap(true, Ordering::SeqCst)).then(|| "injected failure".to_string())
    });
    let relay = Relay::spawn(
        &s.config,
        RelayOptions {
            publish_fault: Some(fault),
            ..RelayOptions::default()
        },
    )?;
    {
        let mut conn = s.db.pool.get().await?;
        let tx = conn.transaction().await?;
        let payload = format!("{PAYLOAD_MARKER}-outbox").into_bytes();
        Outbox::new(&s.config)
            .append(
                &tx,
                NewEvent::new(&topic, "video", "logged-key", "video.updated", 1, payload),
            )
            .await?;
        tx.commit().await?;
    }
    wait_until(WAIT, "the row published after one failure", || async {
        s.scalar("SELECT count(*) FROM courier.outbox WHERE published_at IS NOT NULL")
            .await
            == 1
    })
    .await?;
    relay.kill();

    let dead = captured.with_message("message dead-lettered");
    assert!(!dead.is_empty(), "no dead-letter line");
    dead.iter()
        .for_each(|l| assert_fields(l, &["message_id", "ordering_key", "consumer_group"]));
    let failed = captured.with_message("projection failed");
    failed.iter().for_each(|l| {
        assert_fields(
            l,
            &["event_id", "message_id", "ordering_key", "consumer_group"],
        )
    });
    let retried = captured.with_message("publish failed, will retry");
    assert!(!retried.is_empty(), "no publish-failure line");
    retried
        .iter()
        .for_each(|l| assert_fields(l, &["event_id", "ordering_key", "shard"]));

    let text = captured.text();
    assert!(!text.contains(PAYLOAD_MARKER), "payload bytes in the logs");
    assert!(
        !text.contains(PASSWORD),
        "the database password in the logs"
    );
    Ok(())
}
