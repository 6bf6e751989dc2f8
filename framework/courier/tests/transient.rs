//! Transient failures on the read side (P3): retried in place with backoff, spending no
//! delivery attempt, and never letting a later version of a key overtake an earlier one.
//! Real PostgreSQL, the real emulator, the real consumer.

use crate::support;

use courier::config::ConsumerConfig;
use courier::inbound::ConsumerOptions;
use courier_testkit::wait_until;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::*;

const WAIT: Duration = Duration::from_secs(90);

/// Whether `earlier`'s effect was committed before `later`'s (`app.effects.applied_order`).
async fn applied_before(s: &ReadSetup, earlier: &TestEvent, later: &TestEvent) -> bool {
    s.scalar(&format!(
        "SELECT count(*) FROM app.effects e, app.effects l
         WHERE e.event_id = '{}' AND l.event_id = '{}' AND e.applied_order < l.applied_order",
        earlier.event_id, later.event_id
    ))
    .await
        == 1
}

/// The scenario of the issue that introduced in-place retries: with `lock_timeout` at 300 ms,
/// the read model's rows held locked for 3 s while two more versions of each key arrive. With
/// the shipped retry settings nothing is dead-lettered or nacked, and every key applies its
/// versions in order once the lock is gone.
#[tokio::test]
async fn a_row_locked_for_three_seconds_dead_letters_nothing_and_keeps_each_keys_order(
) -> anyhow::Result<()> {
    let shipped = ConsumerConfig::default();
    let s = read_setup(|c| {
        c.consumer.transient_retries = shipped.transient_retries;
        c.consumer.transient_backoff_first_millis = shipped.transient_backoff_first_millis;
        c.consumer.transient_backoff_cap_millis = shipped.transient_backoff_cap_millis;
    })
    .await?;
    s.db.client()
        .await?
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET lock_timeout = '300ms'",
            s.db.name
        ))
        .await?;
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    let keys: Vec<String> = (0..10).map(|i| format!("video-{i}")).collect();
    let versions: Vec<Vec<TestEvent>> = keys
        .iter()
        .map(|k| {
            (1..=3)
                .map(|v| TestEvent::new(k, v, &format!("{k} v{v}")))
                .collect()
        })
        .collect();
    let firsts: Vec<TestEvent> = versions.iter().map(|v| v[0].clone()).collect();
    s.publish(&firsts).await?;
    wait_until(WAIT, "every key's v1 applied", || async {
        consumer.stats().applied >= 10
    })
    .await?;

    let mut locker = s.db.client().await?;
    let lock = locker.transaction().await?;
    let locked = lock
        .query("SELECT video_id FROM app.videos FOR UPDATE", &[])
        .await?
        .len();
    assert_eq!(locked, 10);
    let laters: Vec<TestEvent> = versions.iter().flat_map(|v| v[1..].to_vec()).collect();
    s.publish(&laters).await?;
    wait_until(WAIT, "the lock met by the projection", || async {
        consumer.stats().failed >= 10
    })
    .await?;
    // The scenario's lock lasts 3 s from the first failure.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(consumer.stats().applied, 10, "applied through a held lock");
    lock.commit().await?;

    wait_until(WAIT, "every version applied after the lock", || async {
        consumer.stats().applied >= 30
    })
    .await?;
    let stats = consumer.stats();
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(
        stats.nacked, 0,
        "a delivery went back to Pub/Sub: {stats:?}"
    );
    assert!(s.dead_letters.is_empty(), "{:?}", s.dead_letters.all());
    let videos = s.videos().await;
    for (key, events) in keys.iter().zip(&versions) {
        assert_eq!(videos[key], (format!("{key} v3"), 3));
        assert!(
            applied_before(&s, &events[0], &events[1]).await,
            "{key}: v2 before v1"
        );
        assert!(
            applied_before(&s, &events[1], &events[2]).await,
            "{key}: v3 before v2"
        );
    }
    assert_eq!(
        s.scalar("SELECT max(applications)::bigint FROM app.effects")
            .await,
        1
    );
    Ok(())
}

/// The gate: once v1 went back to Pub/Sub (its retries in place spent), v2, published only
/// after that, is held until v1 is back and applied — never applied first, never nacked.
#[tokio::test]
async fn a_version_behind_one_given_back_to_pub_sub_waits_for_its_redelivery() -> anyhow::Result<()>
{
    let s = read_setup_with(
        // Pub/Sub's own dead-lettering must not end v1's redeliveries during the test.
        |sub| {
            if let Some(dead_letter) = sub.dead_letter.as_mut() {
                dead_letter.max_delivery_attempts = 100;
            }
        },
        |c| {
            c.consumer.max_delivery_attempts = 100;
            c.consumer.transient_retries = 1;
            c.consumer.transient_backoff_first_millis = 300;
            c.consumer.transient_backoff_cap_millis = 300;
        },
    )
    .await?;
    let videos = Videos::new();
    let calls = videos.calls.clone();
    let release = videos.release.clone();
    let consumer = s.spawn(videos, ConsumerOptions::default());
    let v1 = TestEvent::new("gated", 1, UNTIL_RELEASED);
    let v2 = TestEvent::new("gated", 2, "after v1");
    s.publish(std::slice::from_ref(&v1)).await?;
    wait_until(WAIT, "v1 given back to Pub/Sub", || async {
        consumer.stats().nacked >= 1
    })
    .await?;
    s.publish(std::slice::from_ref(&v2)).await?;
    // v1 accounts for one delivery per nack plus at most the one being tried.
    wait_until(WAIT, "v2 received while v1 keeps failing", || async {
        let stats = consumer.stats();
        stats.received >= stats.nacked + 2
    })
    .await?;
    // v1 went around twice more after v2 was published.
    let nacked = consumer.stats().nacked;
    wait_until(WAIT, "v1 given back twice more", || async {
        consumer.stats().nacked >= nacked + 2
    })
    .await?;
    assert_eq!(
        calls.lock().expect("lock").get(&v2.event_id),
        None,
        "v2 was tried while v1 was not applied"
    );
    assert!(s.videos().await.is_empty());

    release.store(true, Ordering::SeqCst);
    wait_until(WAIT, "both applied once v1 is released", || async {
        consumer.stats().applied >= 2
    })
    .await?;
    assert!(applied_before(&s, &v1, &v2).await, "v2 applied before v1");
    assert_eq!(s.videos().await["gated"], ("after v1".to_string(), 2));
    assert_eq!(calls.lock().expect("lock")[&v2.event_id], 1);
    assert!(s.dead_letters.is_empty(), "{:?}", s.dead_letters.all());
    Ok(())
}
