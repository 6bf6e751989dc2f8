//! What holds the xmin horizon back, read from real PostgreSQL: a pinned snapshot is named by
//! its pid until it commits, the outbox's dead row versions are counted, and the relay sets
//! the gauges with its backlog gauges.

use courier::operations::{Horizon, HorizonQuery};
use courier::outbox::{NewEvent, Outbox};
use courier::CourierConfig;
use courier_testkit::{test_config, wait_until, TestDb, TestPubSub};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// A session of its own with a REPEATABLE READ snapshot open; returns the client and its pid.
async fn pin_snapshot(db: &TestDb) -> anyhow::Result<(tokio_postgres::Client, i32)> {
    let client = db.pin_snapshot().await?;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok((client, pid))
}

async fn read(db: &TestDb) -> Horizon {
    HorizonQuery::new(&db.config.schema)
        .read(&db.pool)
        .await
        .expect("read the xmin horizon")
}

fn held_by(horizon: &Horizon, pid: i32) -> bool {
    horizon
        .oldest_session
        .as_ref()
        .is_some_and(|s| s.pid == pid)
}

#[tokio::test]
async fn a_pinned_snapshot_is_named_by_its_pid_until_it_commits() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let (pinned, pid) = pin_snapshot(&db).await?;
    wait_until(
        WAIT,
        "the pinned session reported as the holder",
        || async { held_by(&read(&db).await, pid) },
    )
    .await?;
    let horizon = read(&db).await;
    let session = horizon.oldest_session.clone().expect("a holder");
    assert!(horizon.sees_all_sessions, "{horizon:?}");
    assert_eq!(session.state.as_deref(), Some("idle in transaction"));
    assert!(session.age_secs.is_some_and(|s| s >= 0.0), "{horizon:?}");
    assert!(session.xid_age >= 0, "{horizon:?}");
    assert!(horizon.held_secs().is_some_and(|s| s >= 0.0), "{horizon:?}");

    pinned.batch_execute("COMMIT").await?;
    wait_until(WAIT, "the committed session no longer reported", || async {
        !held_by(&read(&db).await, pid)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn dead_outbox_rows_are_counted_until_vacuum() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let mut config = CourierConfig::default();
    config.database = db.config.clone();
    let client = db.client().await?;
    // Autovacuum would remove what the test counts.
    client
        .batch_execute("ALTER TABLE courier.outbox SET (autovacuum_enabled = false)")
        .await?;
    let events: Vec<NewEvent> = (0..100)
        .map(|i| {
            NewEvent::new(
                "horizon.events",
                "video",
                format!("k{i}"),
                "video.updated",
                1,
                vec![1u8],
            )
        })
        .collect();
    {
        let mut conn = db.pool.get().await?;
        let tx = conn.transaction().await?;
        Outbox::new(&config).append_all(&tx, events).await?;
        tx.commit().await?;
    }
    // Statistics reach the shared counters when the session is next idle, at most once a
    // second unless told otherwise.
    client
        .batch_execute("DELETE FROM courier.outbox; SELECT pg_stat_force_next_flush();")
        .await?;
    wait_until(WAIT, "100 dead outbox tuples counted", || async {
        read(&db).await.outbox.is_some_and(|o| o.dead >= 100)
    })
    .await?;

    client.batch_execute("VACUUM courier.outbox").await?;
    wait_until(WAIT, "the dead tuples gone after a vacuum", || async {
        read(&db).await.outbox.is_some_and(|o| o.dead == 0)
    })
    .await?;
    Ok(())
}

/// The value of an unlabelled gauge in the rendered metrics.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split(' ').next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn the_relay_samples_the_horizon_with_its_backlog_gauges() -> anyhow::Result<()> {
    use courier::metrics as m;
    courier_testkit::init_logging();
    let handle = courier::metrics::prometheus_handle().expect("the test binary's recorder");
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let relay = courier_testkit::spawn_relay(&config)?;
    let (pinned, _) = pin_snapshot(&db).await?;
    // The relay's own transactions last milliseconds: a second means the pinned snapshot.
    wait_until(WAIT, "the horizon gauge past a second", || async {
        gauge(&handle.render(), m::POSTGRES_XMIN_HORIZON_AGE_SECONDS).is_some_and(|s| s >= 1.0)
    })
    .await?;
    let text = handle.render();
    for name in [
        m::POSTGRES_XMIN_HORIZON_AGE_TRANSACTIONS,
        m::POSTGRES_REPLICATION_SLOT_XMIN_AGE_TRANSACTIONS,
        m::OUTBOX_DEAD_TUPLES,
    ] {
        assert!(
            gauge(&text, name).is_some_and(|v| v >= 0.0),
            "{name} not set:\n{text}"
        );
    }
    pinned.batch_execute("COMMIT").await?;
    wait_until(WAIT, "the horizon gauge back under a second", || async {
        gauge(&handle.render(), m::POSTGRES_XMIN_HORIZON_AGE_SECONDS).is_some_and(|s| s < 1.0)
    })
    .await?;
    relay.kill();
    Ok(())
}
