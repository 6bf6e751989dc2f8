//! `courier dlq peek | republish` against the emulator: dead letters are listed with their
//! reasons and stay; republished ones reach the main topic's subscription again with their
//! original attributes and ordering key, and leave the keeper.

use crate::support;

use courier::operations::DeadLetters;
use courier_testkit::{wait_until, Collector, TestPubSub};
use google_cloud_pubsub::model::Message;
use serde_json::Value;
use std::time::Duration;

async fn courier(pubsub: &TestPubSub, args: &[&str]) -> (bool, String, String) {
    support::courier(Some(pubsub), None, args).await
}

/// A topic with its consumer subscription (provisioned by `courier provision`) and two dead
/// letters in the subscription's keeper. Returns the subscription.
async fn with_two_dead_letters(pubsub: &TestPubSub) -> anyhow::Result<String> {
    let client = pubsub.client();
    let topic = format!("{}.events", courier_testkit::unique_name("dlq"));
    let subscription = format!("{topic}.engagement-reader");
    let (ok, _, stderr) = courier(
        pubsub,
        &["provision", "--topic", &topic, "--consumer", "engagement"],
    )
    .await;
    assert!(ok, "{stderr}");
    let dead_letters = DeadLetters::new(
        &client,
        &format!("{topic}.dlq"),
        "engagement_reader",
        &subscription,
        Duration::from_secs(10),
    )
    .await?;
    for (event, key) in [("e1", "video-1"), ("e2", "video-2")] {
        let original = Message::new()
            .set_message_id(format!("message-{event}"))
            .set_data(b"payload".to_vec())
            .set_attributes([("event_id".to_string(), event.to_string())])
            .set_ordering_key(key);
        dead_letters
            .publish(&original, "handler refused it", Some(5))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    Ok(subscription)
}

// Each test reads a keeper with one stream only: the emulator routes what a closed stream
// had (and later redeliveries) to that dead stream and holds it past the ack deadline
// (docs/emulator.md), so peek-then-republish on one keeper is not testable on the emulator.

#[tokio::test]
async fn peek_lists_dead_letters_with_their_reasons_and_leaves_them() -> anyhow::Result<()> {
    let pubsub = TestPubSub::get().await?;
    let subscription = with_two_dead_letters(&pubsub).await?;
    let (ok, stdout, stderr) = courier(
        &pubsub,
        &[
            "dlq",
            "republish",
            "--dry-run",
            "--subscription",
            &subscription,
            "--json",
        ],
    )
    .await;
    assert!(ok, "{stderr}");
    let peeked: Value = serde_json::from_str(&stdout)?;
    let letters = peeked["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(letters.len(), 2, "{peeked}");
    assert!(
        letters
            .iter()
            .all(|l| l["reason"] == "handler refused it"
                && l["consumer_group"] == "engagement_reader")
    );
    assert_eq!(peeked["republished"], 0);

    // A subscription not named <topic>.<consumer>-<role> is refused, naming the flag.
    let (ok, _, stderr) = courier(&pubsub, &["dlq", "peek", "--subscription", "nodots"]).await;
    assert!(!ok && stderr.contains("--subscription"), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn republished_dead_letters_reach_the_subscription_again_as_they_were() -> anyhow::Result<()>
{
    courier_testkit::init_logging();
    let pubsub = TestPubSub::get().await?;
    let subscription = with_two_dead_letters(&pubsub).await?;
    let main = Collector::start(&pubsub, &subscription).await?;
    let (ok, stdout, stderr) = courier(
        &pubsub,
        &[
            "dlq",
            "republish",
            "--subscription",
            &subscription,
            "--json",
        ],
    )
    .await;
    assert!(ok, "{stderr}");
    let done: Value = serde_json::from_str(&stdout)?;
    assert_eq!(done["republished"], 2, "{done}");
    wait_until(
        Duration::from_secs(30),
        "the subscription receives both",
        || async { main.len() >= 2 },
    )
    .await?;
    for received in main.all() {
        assert!(
            received
                .attributes
                .keys()
                .all(|k| !k.starts_with("courier_dlq_")),
            "{:?}",
            received.attributes
        );
        let key = match received.attribute("event_id") {
            Some("e1") => "video-1",
            _ => "video-2",
        };
        assert_eq!(received.ordering_key, key);
    }
    Ok(())
}
