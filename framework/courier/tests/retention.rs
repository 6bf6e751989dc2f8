//! Retention against real PostgreSQL: the janitor deletes published outbox rows, the version
//! ledger's rows and processed inbox rows past their retention, in batches, and keeps recent,
//! pending and dead rows.

use courier::config::RetentionConfig;
use courier::outbox::{NewEvent, Outbox};
use courier::retention::{sweep, RetentionQueries};
use courier_testkit::{test_config, wait_until, TestDb, TestPubSub};
use std::sync::Arc;
use std::time::Duration;

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.scalar(sql).await.expect(sql)
}

/// 25 rows published 8 days ago, 5 published now, 3 dead for 8 days, 2 pending (keys k0…k34
/// in that order, each at version 1, the ledger's rows as old as their appends); 30 inbox rows
/// processed 15 days ago and 4 now.
async fn history(db: &TestDb, config: &courier::CourierConfig) -> anyhow::Result<()> {
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let events = (0..35)
        .map(|i| {
            NewEvent::new(
                "retention.events",
                "video",
                format!("k{i}"),
                "video.updated",
                1,
                vec![1u8],
            )
        })
        .collect();
    Outbox::new(config)
        .without_wakeups()
        .append_all(&tx, events)
        .await?;
    tx.batch_execute(
        "UPDATE courier.outbox SET published_at = now() - interval '8 days', created_at = now() - interval '8 days'
             WHERE seq IN (SELECT seq FROM courier.outbox ORDER BY seq LIMIT 25);
         UPDATE courier.outbox SET published_at = now()
             WHERE seq IN (SELECT seq FROM courier.outbox WHERE published_at IS NULL ORDER BY seq LIMIT 5);
         UPDATE courier.outbox SET dead_at = now() - interval '8 days', created_at = now() - interval '8 days'
             WHERE seq IN (SELECT seq FROM courier.outbox WHERE published_at IS NULL ORDER BY seq LIMIT 3);
         UPDATE courier.outbox_versions v SET appended_at = o.created_at
             FROM courier.outbox o WHERE (o.aggregate_id, o.version) = (v.aggregate_id, v.version);
         INSERT INTO courier.inbox (consumer_group, event_id, publish_time, processed_at)
             SELECT 'g', gen_random_uuid(), now() - interval '15 days', now() - interval '15 days'
             FROM generate_series(1, 30);
         INSERT INTO courier.inbox (consumer_group, event_id, publish_time)
             SELECT 'g', gen_random_uuid(), now() FROM generate_series(1, 4);",
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn assert_kept(db: &TestDb) {
    assert_eq!(
        scalar(
            db,
            "SELECT count(*) FROM courier.outbox WHERE published_at IS NOT NULL"
        )
        .await,
        5
    );
    assert_eq!(
        scalar(
            db,
            "SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL"
        )
        .await,
        3
    );
    assert_eq!(
        scalar(
            db,
            "SELECT count(*) FROM courier.outbox WHERE published_at IS NULL AND dead_at IS NULL"
        )
        .await,
        2
    );
    assert_eq!(scalar(db, "SELECT count(*) FROM courier.inbox").await, 4);
    assert_eq!(
        scalar(db, "SELECT count(*) FROM courier.outbox_versions").await,
        7
    );
}

#[tokio::test]
async fn a_sweep_deletes_expired_rows_in_batches_and_keeps_the_rest() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let config = test_config(&db, &TestPubSub::get().await?);
    history(&db, &config).await?;
    let retention = RetentionConfig {
        batch_size: 10,
        ..RetentionConfig::default()
    };
    let swept = sweep(&db.pool, &RetentionQueries::new("courier"), &retention).await?;
    assert_eq!(
        (swept.outbox_rows, swept.version_rows, swept.inbox_rows),
        (25, 28, 30)
    );
    // 25 rows in batches of 10: 10, 10, 5; 28: 10, 10, 8; 30: 10, 10, 10, 0.
    assert_eq!(swept.batches, 10);
    assert_kept(&db).await;
    let again = sweep(&db.pool, &RetentionQueries::new("courier"), &retention).await?;
    assert_eq!(
        (again.outbox_rows, again.version_rows, again.inbox_rows),
        (0, 0, 0)
    );

    // A version is refused a second append while its published row is kept (k25, published
    // now) or while it is unpublished (k30, dead for 8 days, its ledger row expired); once
    // both are gone (k0, published 8 days ago) the ledger no longer remembers it.
    let outbox = Outbox::new(&config).without_wakeups();
    let mut conn = db.pool.get().await?;
    for (key, refused) in [("k25", true), ("k30", true), ("k0", false)] {
        let tx = conn.transaction().await?;
        let event = NewEvent::new(
            "retention.events",
            "video",
            key,
            "video.updated",
            1,
            vec![1],
        );
        match outbox.append(&tx, event).await {
            Err(e) => assert!(refused && e.is_conflict(), "{key}: {e}"),
            Ok(_) => assert!(!refused, "{key}: a second version 1 was appended"),
        }
    }
    Ok(())
}

#[actix_rt::test]
async fn the_supervised_janitor_sweeps_on_its_own() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut config = test_config(&db, &TestPubSub::get().await?);
    config.retention.interval_secs = 1;
    config.retention.batch_size = 7;
    history(&db, &config).await?;
    let escalate: courier::supervision::EscalationHandler =
        Arc::new(|e| panic!("unexpected escalation: {e:?}"));
    let janitor = courier::retention::start(&config, escalate)?.expect("enabled by default");
    wait_until(Duration::from_secs(30), "expired rows gone", || async {
        scalar(&db, "SELECT count(*) FROM courier.inbox").await == 4
            && scalar(&db, "SELECT count(*) FROM courier.outbox").await == 10
    })
    .await?;
    assert_kept(&db).await;
    drop(janitor);
    Ok(())
}
