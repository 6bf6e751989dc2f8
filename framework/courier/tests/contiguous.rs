//! Projections of delta events (P3): version n+1 applies only on top of n. A later version that
//! arrives first waits for the missing one; a gap that does not close parks the key with its
//! events (acked in Pub/Sub, kept in the database) until an operator releases it. Real
//! PostgreSQL, the real emulator, the real consumer.

use crate::support;

use courier::inbound::ConsumerOptions;
use courier::operations::{KeyVersions, Release};
use courier::pubsub::PubSub;
use courier_testkit::wait_until;
use std::time::Duration;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// The versions of `key` in the order their effects were committed.
async fn applied_versions(s: &ReadSetup, events: &[TestEvent]) -> Vec<i64> {
    let client = s.db.client().await.expect("client");
    let ids: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
    let rows = client
        .query(
            "SELECT event_id FROM app.effects WHERE event_id = ANY($1) ORDER BY applied_order",
            &[&ids],
        )
        .await
        .expect("effects");
    rows.iter()
        .map(|r| {
            let id: uuid::Uuid = r.get(0);
            events
                .iter()
                .find(|e| e.event_id == id)
                .expect("known")
                .version
        })
        .collect()
}

fn release(key: &str, skip_to: Option<i64>) -> Release {
    Release {
        consumer_group: "test-readers".into(),
        routing_key: key.into(),
        skip_to,
        by: "test".into(),
        reason: "the test releases it".into(),
    }
}

#[tokio::test]
async fn a_later_version_arriving_first_waits_for_the_missing_one() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let videos = Videos::contiguous();
    let calls = videos.calls.clone();
    let consumer = s.spawn(videos, ConsumerOptions::default());
    let events: Vec<TestEvent> = (1..=3)
        .map(|v| TestEvent::new("delta", v, &format!("v{v}")))
        .collect();
    s.publish(&[events[0].clone(), events[2].clone()]).await?;
    wait_until(WAIT, "v1 applied and v3 received", || async {
        let stats = consumer.stats();
        stats.applied == 1 && stats.received >= 2
    })
    .await?;
    assert_eq!(
        calls.lock().expect("lock").get(&events[2].event_id),
        None,
        "v3 reached the handler with v2 missing"
    );
    s.publish(std::slice::from_ref(&events[1])).await?;
    wait_until(WAIT, "all three applied", || async {
        consumer.stats().applied == 3
    })
    .await?;
    assert_eq!(applied_versions(&s, &events).await, vec![1, 2, 3]);
    assert_eq!(s.videos().await["delta"], ("v3".to_string(), 3));
    let stats = consumer.stats();
    assert_eq!(
        (stats.parked, stats.nacked, stats.dead_lettered),
        (0, 0, 0),
        "{stats:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_gap_that_does_not_close_parks_the_key_until_an_operator_releases_it(
) -> anyhow::Result<()> {
    let s = read_setup(|c| c.consumer.gap_wait_secs = 2).await?;
    let consumer = s.spawn(Videos::contiguous(), ConsumerOptions::default());
    let other = TestEvent::new("fine", 1, "unaffected");
    let events: Vec<TestEvent> = (1..=5)
        .map(|v| TestEvent::new("gappy", v, &format!("v{v}")))
        .collect();
    // v2 is lost on the way (as if dead-lettered elsewhere).
    s.publish(&[
        events[0].clone(),
        events[2].clone(),
        events[3].clone(),
        other.clone(),
    ])
    .await?;
    wait_until(WAIT, "v3 and v4 parked", || async {
        consumer.stats().parked >= 2
    })
    .await?;
    let versions = KeyVersions::new("courier");
    let parked = versions.list(&s.db.pool).await?;
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(
        (
            parked[0].routing_key.as_str(),
            parked[0].expected_version,
            parked[0].held_events
        ),
        ("gappy", 2, 2)
    );
    // Acked, not left to Pub/Sub's redelivery and dead-lettering.
    assert_eq!(consumer.stats().outstanding, 0);
    // A later version joins the parked key at once.
    s.publish(std::slice::from_ref(&events[4])).await?;
    wait_until(WAIT, "v5 parked too", || async {
        consumer.stats().parked >= 3
    })
    .await?;
    // The operator finds v2 and republishes it (as `courier dlq republish` would): it applies
    // on top of v1; the key stays parked until released.
    s.publish(std::slice::from_ref(&events[1])).await?;
    wait_until(WAIT, "v2 applied", || async {
        s.videos().await.get("gappy").map(|v| v.1) == Some(2)
    })
    .await?;
    assert_eq!(versions.list(&s.db.pool).await?.len(), 1);

    let released = versions
        .release(
            &s.db.pool,
            &PubSub::new(s.config.pubsub.clone()),
            &release("gappy", None),
        )
        .await?;
    assert_eq!((released.expected_version, released.republished), (2, 3));
    wait_until(WAIT, "v3..v5 applied after the release", || async {
        s.videos().await.get("gappy").map(|v| v.1) == Some(5)
    })
    .await?;
    assert_eq!(applied_versions(&s, &events).await, vec![1, 2, 3, 4, 5]);
    assert!(versions.list(&s.db.pool).await?.is_empty());
    assert_eq!(
        s.scalar("SELECT count(*) FROM courier.parked_events").await,
        0
    );
    assert_eq!(
        s.scalar("SELECT count(*) FROM courier.parked_key_releases WHERE released_by = 'test'")
            .await,
        1
    );
    assert_eq!(
        s.videos().await["fine"].1,
        1,
        "another key went on meanwhile"
    );
    assert!(s.dead_letters.is_empty(), "{:?}", s.dead_letters.all());
    Ok(())
}

#[tokio::test]
async fn a_dead_lettered_middle_version_parks_its_key_and_a_skip_releases_it() -> anyhow::Result<()>
{
    let s = read_setup(|c| c.consumer.gap_wait_secs = 2).await?;
    let consumer = s.spawn(Videos::contiguous(), ConsumerOptions::default());
    let events = vec![
        TestEvent::new("poisoned", 1, "v1"),
        TestEvent::new("poisoned", 2, PERMANENT),
        TestEvent::new("poisoned", 3, "v3"),
    ];
    s.publish(&events).await?;
    wait_until(WAIT, "v2 dead-lettered and v3 parked", || async {
        let stats = consumer.stats();
        stats.dead_lettered == 1 && stats.parked == 1
    })
    .await?;
    assert_eq!(s.videos().await["poisoned"].1, 1, "v3 applied over the gap");
    let versions = KeyVersions::new("courier");
    let released = versions
        .release(
            &s.db.pool,
            &PubSub::new(s.config.pubsub.clone()),
            &release("poisoned", Some(3)),
        )
        .await?;
    assert_eq!((released.skipped_to, released.republished), (Some(3), 1));
    wait_until(WAIT, "v3 applied after the skip", || async {
        s.videos().await.get("poisoned").map(|v| v.1) == Some(3)
    })
    .await?;
    assert_eq!(applied_versions(&s, &events).await, vec![1, 3]);
    assert_eq!(
        s.scalar("SELECT skipped_to FROM courier.parked_key_releases")
            .await,
        3
    );
    assert!(matches!(
        versions
            .release(
                &s.db.pool,
                &PubSub::new(s.config.pubsub.clone()),
                &release("poisoned", None)
            )
            .await,
        Err(courier::operations::ReleaseError::NotParked { .. })
    ));
    Ok(())
}
