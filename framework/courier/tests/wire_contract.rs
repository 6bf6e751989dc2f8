//! The attributes of a published event, read off the emulator and checked with rules written
//! here, independently of the framework's own formatting and parsing: consumers in other
//! languages route on them.

use courier::outbox::{NewEvent, Outbox};
use courier::relay::{Relay, RelayOptions};
use courier_testkit::{test_config, wait_until, Collector, TestDb, TestPubSub};
use std::collections::BTreeSet;
use std::time::Duration;

fn lowercase_word(w: &str) -> bool {
    w.starts_with(|c: char| c.is_ascii_lowercase())
        && w.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && groups.iter().all(|g| {
            g.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        })
}

/// `2026-11-25T10:00:00.123456Z`: RFC 3339, UTC, microseconds.
fn is_micro_utc_time(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.clone().all(|i| b[i].is_ascii_digit());
    b.len() == 27
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..26)
        && b[26] == b'Z'
}

#[tokio::test]
async fn published_attributes_follow_the_wire_conventions() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("wire").await?;
    let subscription = pubsub.subscription(&topic).await?;
    let collector = Collector::start(&pubsub, &subscription).await?;
    let config = test_config(&db, &pubsub);
    let outbox = Outbox::new(&config);
    let full = NewEvent::new(
        &topic,
        "video",
        "video-7",
        "video.created",
        1,
        b"x".to_vec(),
    )
    .with_schema_version(2)
    .with_correlation_id("corr-1")
    .with_causation_id("cause-1")
    .with_user_id("user-1")
    .with_source_service("catalog")
    .with_source_version("1.4.2")
    .with_trace_id("4bf92f3577b34da6a3ce929d0e0e4736")
    .with_span_id("00f067aa0ba902b7")
    .with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let bare = NewEvent::new(
        &topic,
        "video",
        "video-7",
        "watch.progressed",
        2,
        b"y".to_vec(),
    );
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    outbox
        .append_all(&tx, vec![full.clone(), bare.clone()])
        .await?;
    tx.commit().await?;
    // A name off the convention is refused at the edge, naming the field.
    let tx = conn.transaction().await?;
    let err = outbox
        .append(
            &tx,
            NewEvent::new(&topic, "video", "v", "VideoCreated", 1, vec![]),
        )
        .await
        .expect_err("CamelCase event type");
    assert!(err.to_string().contains("event_type"), "{err}");
    drop(tx);

    let relay = Relay::spawn(&config, RelayOptions::default())?;
    wait_until(Duration::from_secs(30), "both events received", || async {
        collector.len() >= 2
    })
    .await?;
    relay.shutdown(Duration::from_secs(5)).await;
    let received = collector.all();
    let known: BTreeSet<&str> = [
        "event_id",
        "event_type",
        "aggregate_id",
        "aggregate_type",
        "version",
        "occurred_at",
        "schema_version",
        "correlation_id",
        "causation_id",
        "user_id",
        "source_service",
        "source_version",
        "trace_id",
        "span_id",
        "traceparent",
    ]
    .into();
    for message in &received {
        let a = |name: &str| message.attribute(name).unwrap_or_default().to_string();
        for key in message.attributes.keys() {
            assert!(known.contains(key.as_str()), "unexpected attribute {key}");
        }
        assert!(is_uuid(&a("event_id")), "event_id {}", a("event_id"));
        let event_type = a("event_type");
        let words: Vec<&str> = event_type.split('.').collect();
        assert!(
            words.len() >= 2 && words.iter().all(|w| lowercase_word(w)),
            "{event_type}"
        );
        assert!(
            event_type.ends_with("ed"),
            "{event_type} is not in the past tense"
        );
        assert_eq!(a("aggregate_id"), "video-7");
        assert_eq!(message.ordering_key, "video-7");
        assert!(lowercase_word(&a("aggregate_type")));
        let version = a("version");
        assert!(
            !version.starts_with('0') && version.parse::<u64>().is_ok(),
            "{version}"
        );
        assert!(
            is_micro_utc_time(&a("occurred_at")),
            "occurred_at {}",
            a("occurred_at")
        );
        let hex = |text: &str, digits: usize| {
            text.len() == digits && text.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        };
        if let Some(id) = message.attribute("trace_id") {
            assert!(hex(id, 32), "trace_id {id}");
        }
        if let Some(id) = message.attribute("span_id") {
            assert!(hex(id, 16), "span_id {id}");
        }
        if let Some(header) = message.attribute("traceparent") {
            let parts: Vec<&str> = header.split('-').collect();
            assert!(
                parts.len() == 4
                    && hex(parts[0], 2)
                    && hex(parts[1], 32)
                    && hex(parts[2], 16)
                    && hex(parts[3], 2),
                "traceparent {header}"
            );
        }
        let schema = a("schema_version");
        assert!(
            schema
                .strip_prefix('v')
                .is_some_and(|n| !n.starts_with('0') && n.parse::<u32>().is_ok()),
            "schema_version {schema}"
        );
    }
    let of = |event: &NewEvent| {
        received
            .iter()
            .find(|m| m.attribute("event_id") == Some(&event.event_id.to_string()))
            .expect("received")
    };
    let full_message = of(&full);
    for (name, value) in [
        ("event_type", "video.created"),
        ("version", "1"),
        ("schema_version", "v2"),
        ("correlation_id", "corr-1"),
        ("causation_id", "cause-1"),
        ("user_id", "user-1"),
        ("source_service", "catalog"),
        ("source_version", "1.4.2"),
        ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("span_id", "00f067aa0ba902b7"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ] {
        assert_eq!(full_message.attribute(name), Some(value), "{name}");
    }
    let bare_message = of(&bare);
    assert_eq!(bare_message.attribute("schema_version"), Some("v1"));
    assert_eq!(
        bare_message.attributes.len(),
        7,
        "only the required attributes"
    );
    Ok(())
}
