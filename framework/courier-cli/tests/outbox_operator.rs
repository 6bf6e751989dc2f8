//! `courier outbox stats | dead list | dead retry | dead skip` against real PostgreSQL and the
//! emulator: a skipped dead row is never sent and its key flows again; a retried one is
//! published; both are audited.

use crate::support;

use courier::outbox::{NewEvent, Outbox};
use courier::relay::{Relay, RelayOptions};
use courier_testkit::{test_config, wait_until, Collector, TestDb, TestPubSub};
use serde_json::Value;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Runs `courier <args>` against the test database.
async fn courier(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    support::courier(None, Some(db), args).await
}

async fn json(db: &TestDb, args: &[&str]) -> Value {
    let (ok, stdout, stderr) = courier(db, args).await;
    assert!(ok, "courier {args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("courier {args:?}: {e}: {stdout}"))
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.scalar(sql).await.expect(sql)
}

#[tokio::test]
async fn dead_rows_are_listed_skipped_and_retried_with_an_audit_trail() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let topic = pubsub.topic("operator").await?;
    let collector = Collector::start(&pubsub, &pubsub.subscription(&topic).await?).await?;

    // k1 v1..v3 and k2 v1, then k1 v1 and k2 v1 "die" (as the relay marks exhausted rows).
    let events: Vec<NewEvent> = [("k1", 1), ("k1", 2), ("k1", 3), ("k2", 1)]
        .iter()
        .map(|(key, v)| NewEvent::new(&topic, "video", *key, "video.updated", *v, vec![1u8]))
        .collect();
    let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
    {
        let mut conn = db.pool.get().await?;
        let tx = conn.transaction().await?;
        Outbox::new(&config).append_all(&tx, events).await?;
        tx.execute(
            "UPDATE courier.outbox SET dead_at = now(), publish_attempts = 10, last_error = 'topic gone'
             WHERE version = 1",
            &[],
        )
        .await?;
        tx.commit().await?;
    }

    let stats = json(&db, &["outbox", "stats", "--json"]).await;
    let total = |field: &str| {
        stats.as_array().map(|a| {
            a.iter()
                .map(|s| s[field].as_i64().unwrap_or(0))
                .sum::<i64>()
        })
    };
    assert_eq!(
        (total("pending"), total("dead")),
        (Some(2), Some(2)),
        "{stats}"
    );
    let dead = json(&db, &["outbox", "dead", "list", "--json"]).await;
    assert_eq!(dead.as_array().map(Vec::len), Some(2), "{dead}");
    assert_eq!(dead[0]["last_error"], "topic gone");

    // A dry run changes nothing; an id that is not dead is an error naming it.
    let dry = json(
        &db,
        &["outbox", "dead", "retry", "--all", "--dry-run", "--json"],
    )
    .await;
    assert_eq!(dry.as_array().map(Vec::len), Some(2));
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL"
        )
        .await,
        2
    );
    let (ok, _, stderr) = courier(&db, &["outbox", "dead", "retry", &ids[1]]).await;
    assert!(!ok && stderr.contains(&ids[1]), "{stderr}");
    let (ok, _, stderr) = courier(
        &db,
        &["outbox", "dead", "skip", "not-a-uuid", "--reason", "x"],
    )
    .await;
    assert!(!ok && stderr.contains("not-a-uuid"), "{stderr}");

    // Skip k1 v1, retry k2 v1; then the relay publishes k1 v2, v3 and k2 v1, never k1 v1.
    let (ok, stdout, stderr) = courier(
        &db,
        &["outbox", "dead", "skip", &ids[0], "--reason", "superseded"],
    )
    .await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("flow again"), "{stdout}");
    let retried = json(
        &db,
        &[
            "outbox",
            "dead",
            "retry",
            &ids[3],
            "--reason",
            "topic back",
            "--json",
        ],
    )
    .await;
    assert_eq!(retried[0]["event_id"], ids[3].as_str());
    let relay = Relay::spawn(&config, RelayOptions::default())?;
    wait_until(WAIT, "k1 v2, v3 and k2 v1 delivered", || async {
        let got = collector.distinct_event_ids();
        ids[1..].iter().all(|id| got.contains(id))
    })
    .await?;
    assert!(
        !collector.distinct_event_ids().contains(&ids[0]),
        "a skipped row was sent"
    );
    let audit = db
        .pool
        .get()
        .await?
        .query(
            "SELECT action, reason, actor, event_id::text FROM courier.outbox_operator_actions ORDER BY id",
            &[],
        )
        .await?;
    let audit: Vec<(String, String, String, String)> = audit
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        audit,
        vec![
            (
                "skip".into(),
                "superseded".into(),
                "test-operator".into(),
                ids[0].clone()
            ),
            (
                "retry".into(),
                "topic back".into(),
                "test-operator".into(),
                ids[3].clone()
            ),
        ]
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM courier.outbox WHERE skipped_at IS NOT NULL"
        )
        .await,
        1
    );
    relay.kill();
    Ok(())
}

/// `courier status` shows each live relay's adaptive publish limit, what it has in flight and
/// its recent publish latency, as written with the relay's heartbeat.
#[tokio::test]
async fn status_shows_each_relays_publish_limit() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let topic = pubsub.topic("status").await?;
    let events: Vec<NewEvent> = (0..50)
        .map(|i| {
            NewEvent::new(
                &topic,
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
    let relay = Relay::spawn(&config, RelayOptions::default())?;
    wait_until(
        WAIT,
        "a heartbeat after the rows were published",
        || async {
            let status = json(&db, &["status", "--json"]).await;
            let relay = &status["relays"][0];
            status["pending"] == 0
                && relay["publishes_in_flight"] == 0
                && relay["publish_keys_out"] == 0
                && relay["publish_latency_ms"]
                    .as_f64()
                    .is_some_and(|ms| ms > 0.0)
        },
    )
    .await?;
    let status = json(&db, &["status", "--json"]).await;
    assert_eq!(
        status["relays"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    let limit = status["relays"][0]["publish_limit"].as_u64().unwrap_or(0);
    let bounds = config.relay.publish_limit_min..=config.relay.publish_limit_max;
    assert!(bounds.contains(&(limit as u32)), "{status}");
    let (ok, text, stderr) = courier(&db, &["status"]).await;
    assert!(ok, "{stderr}");
    assert!(
        text.contains(&format!(
            "0 of {limit} publishes in flight (0 ordering keys)"
        )),
        "{text}"
    );
    relay.kill();
    Ok(())
}
