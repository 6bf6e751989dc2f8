//! `courier parked list | release` against real PostgreSQL and the emulator: a parked key is
//! listed with what it holds; releasing it with `--skip-to` moves its version, republishes its
//! events to the topic in version order with their attributes and ordering key, and is audited.

use crate::pipeline;
use crate::support;

use courier_testkit::{wait_until, Collector, TestDb, TestPubSub};
use serde_json::Value;
use std::time::Duration;

async fn courier(pubsub: &TestPubSub, db: &TestDb, args: &[&str]) -> (bool, String, String) {
    support::courier(Some(pubsub), Some(db), args).await
}

#[tokio::test]
async fn a_parked_key_is_listed_and_a_release_republishes_its_events_in_order() -> anyhow::Result<()>
{
    courier_testkit::init_logging();
    let pubsub = TestPubSub::get().await?;
    let db = TestDb::new().await?;
    let topic = format!("{}.events", courier_testkit::unique_name("parked"));
    let subscription = format!("{topic}.engagement-reader");
    let (ok, _, stderr) = courier(
        &pubsub,
        &db,
        &["provision", "--topic", &topic, "--consumer", "engagement"],
    )
    .await;
    assert!(ok, "{stderr}");
    let main = Collector::start(&pubsub, &subscription).await?;
    pipeline::park_key(&db, &subscription, "video-1").await?;

    let (ok, stdout, stderr) = courier(&pubsub, &db, &["parked", "list", "--json"]).await;
    assert!(ok, "{stderr}");
    let listed: Value = serde_json::from_str(&stdout)?;
    assert_eq!(listed[0]["routing_key"], "video-1", "{listed}");
    assert_eq!(listed[0]["expected_version"], 2);
    assert_eq!(listed[0]["held_events"], 2);
    let (ok, stdout, _) = courier(&pubsub, &db, &["status"]).await;
    assert!(ok && stdout.contains("parked   key video-1"), "{stdout}");

    // Without --reason the command refuses, naming the flag.
    let (ok, _, stderr) = courier(
        &pubsub,
        &db,
        &[
            "parked",
            "release",
            "--group",
            "engagement_reader",
            "--key",
            "video-1",
        ],
    )
    .await;
    assert!(!ok && stderr.contains("--reason"), "{stderr}");

    let (ok, stdout, stderr) = courier(
        &pubsub,
        &db,
        &[
            "parked",
            "release",
            "--group",
            "engagement_reader",
            "--key",
            "video-1",
            "--skip-to",
            "3",
            "--reason",
            "v2 is lost for good",
            "--json",
        ],
    )
    .await;
    assert!(ok, "{stderr}");
    let released: Value = serde_json::from_str(&stdout)?;
    assert_eq!(released["republished"], 2, "{released}");
    assert_eq!(released["topic"], topic.as_str());
    wait_until(
        Duration::from_secs(30),
        "both republished events",
        || async { main.len() >= 2 },
    )
    .await?;
    let versions: Vec<String> = main
        .all()
        .iter()
        .map(|m| m.attribute("version").unwrap_or_default().to_string())
        .collect();
    assert_eq!(versions, ["3", "4"], "republished in version order");
    assert!(main.all().iter().all(|m| m.ordering_key == "video-1"));
    let client = db.client().await?;
    let one = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(sql, &[])
                .await
                .expect(sql)
                .get::<_, i64>(0)
        }
    };
    assert_eq!(
        one("SELECT version FROM courier.projection_versions").await,
        2
    );
    assert_eq!(one("SELECT count(*) FROM courier.parked_keys").await, 0);
    assert_eq!(one("SELECT count(*) FROM courier.parked_events").await, 0);
    assert_eq!(
        one("SELECT skipped_to FROM courier.parked_key_releases WHERE reason = 'v2 is lost for good'")
            .await,
        3
    );
    let (ok, stdout, _) = courier(&pubsub, &db, &["parked", "list"]).await;
    assert!(ok && stdout.contains("no parked keys"), "{stdout}");
    Ok(())
}
