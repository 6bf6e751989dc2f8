//! The read side end to end: real PostgreSQL, the real Pub/Sub emulator, the real consumer
//! (Receiver → ProjectorRouter → Projector). Each test has its own database, topic and
//! subscription, so they run in parallel.

use crate::support;

use courier::inbound::BeforeAck;
use courier::inbound::{ConsumerOptions, OffsetStore};
use courier::operations::dead_letter_attributes as dead_letter;
use courier_testkit::wait_until;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_duplicated_event_has_one_effect_and_one_inbox_row() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    let event = TestEvent::new("video-1", 1, "first");
    let other = TestEvent::new("video-1", 2, "second");
    s.publish(&[event.clone(), event.clone(), other]).await?;
    wait_until(WAIT, "three deliveries settled", || async {
        consumer.stats().acked >= 3
    })
    .await?;
    assert_eq!(s.scalar("SELECT count(*) FROM courier.inbox").await, 2);
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    assert_eq!(s.videos().await["video-1"], ("second".to_string(), 2));
    let stats = consumer.stats();
    assert_eq!((stats.applied, stats.duplicates), (2, 1), "{stats:?}");
    Ok(())
}

#[tokio::test]
async fn an_older_version_never_overwrites_a_newer_one() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    s.publish(&[
        TestEvent::new("video-2", 3, "third"),
        TestEvent::new("video-2", 2, "second"),
    ])
    .await?;
    wait_until(WAIT, "both events committed", || async {
        consumer.stats().acked >= 2
    })
    .await?;
    assert_eq!(s.videos().await["video-2"], ("third".to_string(), 3));
    // v2 was processed (inbox) but had no effect on the row.
    assert_eq!(s.scalar("SELECT count(*) FROM courier.inbox").await, 2);
    Ok(())
}

#[tokio::test]
async fn transient_failures_are_retried_in_place_and_applied_once() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let videos = Videos::new();
    let calls = videos.calls.clone();
    let consumer = s.spawn(videos, ConsumerOptions::default());
    let flaky = TestEvent::new("video-3", 1, &format!("{TRANSIENT_PREFIX}2"));
    let after = TestEvent::new("video-3", 2, &format!("{TRANSIENT_PREFIX}0"));
    s.publish(&[flaky.clone(), after.clone()]).await?;
    wait_until(WAIT, "the flaky event applied", || async {
        consumer.stats().applied >= 2
    })
    .await?;
    assert_eq!(calls.lock().expect("lock")[&flaky.event_id], 3);
    let stats = consumer.stats();
    // Two failures, two retries in place: nothing went back to Pub/Sub.
    assert_eq!(stats.nacked, 0, "{stats:?}");
    assert_eq!(stats.received, 2, "{stats:?}");
    assert_eq!(stats.dead_lettered, 0);
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    // The later event of the key waited for the flaky one: applied after it, not before (the
    // row ends at v2 either way, so the order is read from the effects).
    let applied_before = s
        .scalar(&format!(
            "SELECT count(*) FROM app.effects f, app.effects a
             WHERE f.event_id = '{}' AND a.event_id = '{}' AND f.applied_order < a.applied_order",
            flaky.event_id, after.event_id
        ))
        .await;
    assert_eq!(applied_before, 1, "v2 was applied before the flaky v1");
    assert_eq!(s.videos().await["video-3"].1, 2);
    Ok(())
}

#[tokio::test]
async fn poison_messages_are_dead_lettered_with_their_reason_and_stop_blocking(
) -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    let mut garbage = TestEvent::new("poison", 1, "ignored");
    garbage.raw_data = Some(vec![0xff; 16]);
    let mut unknown_schema = TestEvent::new("poison", 2, "v2 schema");
    unknown_schema.schema_version = 9;
    let refused = TestEvent::new("poison", 3, PERMANENT);
    let exhausted = TestEvent::new("poison", 4, ALWAYS_TRANSIENT);
    let fine = TestEvent::new("poison", 5, "fine again");
    let other_keys: Vec<TestEvent> = (0..20)
        .map(|i| TestEvent::new(&format!("healthy-{i}"), 1, "healthy"))
        .collect();
    let mut events = vec![
        garbage.clone(),
        unknown_schema.clone(),
        refused.clone(),
        exhausted.clone(),
        fine,
    ];
    events.extend(other_keys);
    s.publish(&events).await?;

    wait_until(WAIT, "four dead letters", || async {
        s.dead_letters.len() >= 4
    })
    .await?;
    wait_until(WAIT, "the key and the others applied", || async {
        s.videos().await.len() == 21
    })
    .await?;
    assert_eq!(s.videos().await["poison"], ("fine again".to_string(), 5));
    let letters = s.dead_letters.all();
    let reason_of = |event: &TestEvent| {
        letters
            .iter()
            .find(|l| l.attribute("event_id") == Some(&event.event_id.to_string()))
            .map(|l| {
                assert_eq!(
                    l.attribute(dead_letter::CONSUMER_GROUP),
                    Some("test-readers")
                );
                assert_eq!(l.data, event.message().data.to_vec(), "original data kept");
                l.attribute(dead_letter::REASON)
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_else(|| panic!("{} not dead-lettered", event.title))
    };
    assert!(
        reason_of(&garbage).contains("cannot be decoded"),
        "{}",
        reason_of(&garbage)
    );
    assert!(reason_of(&unknown_schema).contains("unknown schema version 9"));
    assert!(reason_of(&refused).contains("handler refuses"));
    let exhausted_reason = reason_of(&exhausted);
    assert!(
        exhausted_reason.contains("transient failure on delivery attempt 3"),
        "{exhausted_reason}"
    );
    assert_eq!(consumer.stats().dead_lettered, 4);
    // Logged as open dead letters: what dlq_message_count and `courier status` report.
    assert_eq!(
        s.scalar("SELECT count(*) FROM courier.dead_letter_log WHERE republished_at IS NULL")
            .await,
        4
    );
    Ok(())
}

#[tokio::test]
async fn a_lost_ack_after_commit_is_redelivered_without_a_second_effect() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let stalled = Arc::new(AtomicU32::new(0));
    let flag = stalled.clone();
    // Commits, then never acks: the process "dies" in between.
    let before_ack: BeforeAck = Arc::new(move |_| {
        flag.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::pending())
    });
    let first = s.spawn(
        Videos::new(),
        ConsumerOptions {
            before_ack: Some(before_ack),
            ..ConsumerOptions::default()
        },
    );
    let event = TestEvent::new("video-5", 1, "committed, never acked");
    s.publish(std::slice::from_ref(&event)).await?;
    wait_until(WAIT, "committed and stuck before the ack", || async {
        stalled.load(Ordering::SeqCst) >= 1
    })
    .await?;
    assert_eq!(s.scalar("SELECT count(*) FROM app.effects").await, 1);
    first.kill();

    // The emulator returns a killed stream's messages after their ack deadline (10 s here).
    let second = s.spawn(Videos::new(), ConsumerOptions::default());
    wait_until(WAIT, "the redelivery recognised as a duplicate", || async {
        second.stats().duplicates >= 1
    })
    .await?;
    assert_eq!(second.stats().applied, 0);
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    Ok(())
}

#[tokio::test]
async fn a_handler_slower_than_the_ack_deadline_is_not_redelivered_meanwhile() -> anyhow::Result<()>
{
    // Ack deadline and lease extension 10 s; the handler takes 15 s.
    let s = read_setup(|_| {}).await?;
    let videos = Videos::new();
    let calls = videos.calls.clone();
    let consumer = s.spawn(videos, ConsumerOptions::default());
    let slow = TestEvent::new("video-6", 1, &format!("{SLOW_PREFIX}15"));
    s.publish(std::slice::from_ref(&slow)).await?;
    wait_until(WAIT, "the slow event applied", || async {
        consumer.stats().applied >= 1
    })
    .await?;
    let stats = consumer.stats();
    // A redelivery during the 15 s would have arrived (received 2) and queued behind it.
    assert_eq!((stats.received, stats.duplicates), (1, 0), "{stats:?}");
    assert_eq!(calls.lock().expect("lock")[&slow.event_id], 1);
    Ok(())
}

#[tokio::test]
async fn a_failing_commit_moves_neither_the_projection_nor_the_offset() -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    s.publish(&[TestEvent::new("video-7", 1, "before")]).await?;
    wait_until(WAIT, "v1 applied", || async { consumer.stats().acked >= 1 }).await?;
    let offsets_sql = "SELECT coalesce(sum(extract(epoch FROM publish_time) * 1000)::bigint, 0)
                       FROM courier.consumer_offsets";
    let offset_before = s.scalar(offsets_sql).await;

    let refused = TestEvent::new("video-7", 2, FAIL_AT_COMMIT);
    s.publish(std::slice::from_ref(&refused)).await?;
    wait_until(WAIT, "the refused event dead-lettered", || async {
        !s.dead_letters.is_empty()
    })
    .await?;
    assert_eq!(s.videos().await["video-7"], ("before".to_string(), 1));
    assert_eq!(s.scalar(offsets_sql).await, offset_before, "offset moved");
    assert_eq!(s.scalar("SELECT count(*) FROM courier.inbox").await, 1);
    let letters = s.dead_letters.all();
    assert!(letters[0]
        .attribute(dead_letter::REASON)
        .is_some_and(|r| r.contains("refused at commit")));
    assert!(consumer.stats().failed >= 1);
    Ok(())
}

#[tokio::test]
async fn an_offset_reset_and_seek_rebuilds_the_projection() -> anyhow::Result<()> {
    // The emulator answers UNIMPLEMENTED to Seek on an ordered subscription: this test seeks an
    // unordered one (the versioned upsert keeps replay correct either way).
    let s = read_setup_with(|sub| sub.ordering = false, |_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    let start = chrono::Utc::now() - chrono::Duration::seconds(1);
    let events: Vec<TestEvent> = (0..10)
        .flat_map(|k| {
            (1..=5).map(move |v| TestEvent::new(&format!("video-{k}"), v, &format!("t{v}")))
        })
        .collect();
    s.publish(&events).await?;
    wait_until(WAIT, "all applied", || async {
        consumer.stats().applied >= 50
    })
    .await?;
    let before = s.videos().await;
    assert_eq!(before.len(), 10);

    // The read model is lost; rewind the group and replay from Pub/Sub.
    s.db.client()
        .await?
        .batch_execute("TRUNCATE app.videos")
        .await?;
    let pool = courier::db::pool(&s.config.database, "test")?;
    let store = OffsetStore::new("courier", s.config.consumer.offset_lanes);
    let reset = store
        .reset(
            &pool,
            &s.consumer.group,
            &s.subscription.name,
            start,
            "read_side test",
            "rebuild",
        )
        .await?;
    assert_eq!(reset.inbox_rows_forgotten, 50);
    let pubsub = s.pubsub.client();
    pubsub
        .seek(
            &pubsub.subscription_admin().await?,
            &s.subscription.name,
            start,
        )
        .await?;
    wait_until(WAIT, "the projection rebuilt by replay", || async {
        s.videos().await == before
    })
    .await?;
    let audit = s
        .scalar("SELECT count(*) FROM courier.consumer_offset_resets WHERE reason = 'rebuild'")
        .await;
    assert_eq!(audit, 1);
    let offset = store
        .load(&pool, &s.consumer.group)
        .await?
        .expect("offset saved");
    assert!(offset.newest_publish_time > start);
    Ok(())
}

#[tokio::test]
async fn shuffled_and_duplicated_events_converge_to_the_independent_state() -> anyhow::Result<()> {
    let s = read_setup(|c| c.consumer.streams = 2).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut events = Vec::new();
    let mut expected: HashMap<String, (String, i64)> = HashMap::new();
    // The independent answer: per key, the title of its highest version.
    for k in 0..500 {
        let key = format!("video-{k}");
        let mut versions: Vec<TestEvent> = (1..=20)
            .map(|v| TestEvent::new(&key, v, &format!("{key} at {v}")))
            .collect();
        expected.insert(key, (versions[19].title.clone(), 20));
        versions.shuffle(&mut rng);
        for event in versions {
            if rng.gen_bool(0.05) {
                events.push(event.clone());
            }
            events.push(event);
        }
    }
    let distinct = 10_000;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    s.publish(&events).await?;
    // Settled by what the database holds, not by acks: a message redelivered (a stream that
    // broke on a busy machine) is acked twice, so an ack count can reach the number of
    // messages before every one was applied.
    wait_until(
        Duration::from_secs(120),
        "every key at its highest version and every event in the inbox",
        || async {
            consumer.stats().acked >= events.len() as u64
                && s.scalar("SELECT count(*) FROM courier.inbox").await == distinct
                && s.videos().await == expected
        },
    )
    .await?;
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    Ok(())
}

#[tokio::test]
async fn a_database_outage_is_waited_out_without_spending_delivery_attempts() -> anyhow::Result<()>
{
    // Two attempts would dead-letter a transient failure at its first redelivery.
    let s = read_setup(|c| c.consumer.max_delivery_attempts = 2).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    // Cut every connection of the consumer's pool, again and again, for three seconds: each
    // projection transaction meanwhile fails as "connection lost" / "terminating connection".
    let admin = s.db.client().await?;
    let cutting = tokio::spawn(async move {
        let until = std::time::Instant::now() + Duration::from_secs(3);
        let mut cut = 0i64;
        while std::time::Instant::now() < until {
            cut += admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    &[],
                )
                .await?
                .get::<_, i64>(0);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::Ok(cut)
    });
    let events: Vec<TestEvent> = (0..40)
        .map(|i| TestEvent::new(&format!("video-{}", i % 4), i / 4 + 1, &format!("t{i}")))
        .collect();
    s.publish(&events).await?;
    let cut = cutting.await??;
    assert!(cut > 0, "the outage cut no connection");
    wait_until(WAIT, "every event applied after the outage", || async {
        consumer.stats().applied >= 40
    })
    .await?;
    let stats = consumer.stats();
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert!(stats.failed > 0, "no transaction met the outage: {stats:?}");
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    assert_eq!(s.videos().await["video-3"], ("t39".to_string(), 10));
    assert!(
        s.dead_letters.is_empty(),
        "dead letters: {:?}",
        s.dead_letters.all()
    );
    Ok(())
}

/// Exactly-once as a per-subscription option: the consumer confirms every ack. (The emulator
/// accepts the setting and confirms, without enforcing exactly-once, see docs/emulator.md; the inbox
/// keeps effects single either way.)
#[tokio::test]
async fn on_an_exactly_once_subscription_every_ack_is_confirmed() -> anyhow::Result<()> {
    let s = read_setup_with(|sub| sub.exactly_once = true, |_| {}).await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    let events: Vec<TestEvent> = (1..=20)
        .map(|v| TestEvent::new(&format!("eo-{}", v % 4), v, &format!("t{v}")))
        .collect();
    s.publish(&events).await?;
    wait_until(WAIT, "every ack confirmed", || async {
        consumer.stats().confirmed >= 20
    })
    .await?;
    let stats = consumer.stats();
    assert_eq!(
        (stats.applied, stats.acked, stats.nacked),
        (20, 20, 0),
        "{stats:?}"
    );
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    Ok(())
}
