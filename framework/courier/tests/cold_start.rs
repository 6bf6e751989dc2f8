//! Cold start of a consumer group without an offset, against real PostgreSQL and the
//! emulator: `consumer.start_from` decides where it begins (subscriptions are unordered here:
//! the emulator does not implement Seek on ordered ones, real Pub/Sub does).

use crate::support;

use courier::inbound::ConsumerOptions;
use courier_testkit::wait_until;
use std::time::Duration;
use support::{read_setup_with, TestEvent, Videos};

const WAIT: Duration = Duration::from_secs(30);

fn events(prefix: &str, n: usize) -> Vec<TestEvent> {
    (0..n)
        .map(|i| TestEvent::new(&format!("{prefix}-{i}"), 1, prefix))
        .collect()
}

#[tokio::test]
async fn latest_skips_the_backlog_a_new_group_finds() -> anyhow::Result<()> {
    let s = read_setup_with(
        |sub| sub.ordering = false,
        |c| c.consumer.start_from = "latest".into(),
    )
    .await?;
    s.publish(&events("backlog", 3)).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    s.publish(&events("live", 2)).await?;
    wait_until(WAIT, "the live events applied", || async {
        s.videos().await.len() >= 2
    })
    .await?;
    let videos = s.videos().await;
    assert!(videos.keys().all(|k| k.starts_with("live")), "{videos:?}");
    assert_eq!(consumer.stats().applied, 2);
    consumer.kill();
    Ok(())
}

#[tokio::test]
async fn a_start_time_skips_what_was_published_before_it() -> anyhow::Result<()> {
    let s = read_setup_with(|sub| sub.ordering = false, |_| {}).await?;
    s.publish(&events("before", 3)).await?;
    let start = chrono::Utc::now();
    s.publish(&events("after", 2)).await?;
    let mut config = s.config.clone();
    config.consumer.start_from = start.to_rfc3339();
    let consumer = courier::inbound::Consumer::spawn(
        &config,
        s.consumer.clone(),
        Videos::new(),
        ConsumerOptions {
            escalate: std::sync::Arc::new(|e| panic!("unexpected escalation: {e:?}")),
            ..ConsumerOptions::default()
        },
    )?;
    wait_until(WAIT, "the events after the start time applied", || async {
        s.videos().await.len() >= 2
    })
    .await?;
    let videos = s.videos().await;
    assert!(videos.keys().all(|k| k.starts_with("after")), "{videos:?}");
    consumer.kill();
    Ok(())
}
