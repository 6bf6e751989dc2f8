//! The write side end to end: real PostgreSQL, the real Pub/Sub emulator, the real relay.
//! Each test has its own database, topic and subscription, so they run in parallel.

use courier::migrate::{migrate, COURIER};
use courier::outbox::{AppendError, NewEvent, Outbox};
use courier::relay::{Relay, RelayHandle, RelayOptions};
use courier::supervision::{Escalation, EscalationHandler};
use courier::CourierConfig;
use courier_testkit::keyed_event as event;
use courier_testkit::{test_config, wait_until, Collector, TestDb, TestPubSub};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The process's Prometheus recorder, the one every test of the binary shares (it is global).
fn metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    courier::metrics::prometheus_handle().expect("the test binary's recorder")
}

/// The value of a counter in the rendered metrics (summed over label sets).
fn counter(name: &str, label: Option<&str>) -> f64 {
    metrics()
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| label.is_none_or(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Setup {
    db: TestDb,
    config: CourierConfig,
    topic: String,
    collector: Collector,
}

async fn setup(tweak: impl FnOnce(&mut CourierConfig)) -> anyhow::Result<Setup> {
    metrics();
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("outbox").await?;
    let subscription = pubsub.subscription(&topic).await?;
    let collector = Collector::start(&pubsub, &subscription).await?;
    let mut config = test_config(&db, &pubsub);
    tweak(&mut config);
    Ok(Setup {
        db,
        config,
        topic,
        collector,
    })
}

fn recording_escalations() -> (EscalationHandler, Arc<Mutex<Vec<Escalation>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let handler: EscalationHandler = Arc::new(move |e| sink.lock().expect("lock").push(e));
    (handler, seen)
}

fn options() -> RelayOptions {
    RelayOptions {
        escalate: recording_escalations().0,
        ..RelayOptions::default()
    }
}

/// [`options`] with `fault` injected into publishes.
fn with_fault(fault: courier::relay::PublishFault) -> RelayOptions {
    RelayOptions {
        publish_fault: Some(fault),
        ..options()
    }
}

/// Appends `events` in one committed transaction.
async fn commit(db: &TestDb, config: &CourierConfig, events: Vec<NewEvent>) -> anyhow::Result<()> {
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    Outbox::new(config).append_all(&tx, events).await?;
    tx.commit().await?;
    Ok(())
}

/// `-1` when the query fails (inside polls).
async fn count(db: &TestDb, sql: &str) -> i64 {
    db.scalar(sql).await.unwrap_or(-1)
}

async fn all_published(db: &TestDb) -> bool {
    count(
        db,
        "SELECT count(*) FROM courier.outbox WHERE published_at IS NULL",
    )
    .await
        == 0
}

/// Version 1 of `n` keys named `<prefix>-<i>`: the "other keys" that must keep flowing.
fn other_keys(topic: &str, prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| event(topic, &format!("{prefix}-{i}"), 1))
        .collect()
}

/// Whether every key of [`other_keys`] has arrived.
fn other_keys_arrived(collector: &Collector, prefix: &str, n: usize) -> bool {
    let arrivals = collector.publish_order();
    (0..n).all(|i| arrivals.contains_key(&format!("{prefix}-{i}")))
}

/// Claims of one row each, several in flight: each of a key's rows is claimed while the row
/// before it is out (or acknowledged and not yet marked).
fn claim_one_row_at_a_time(c: &mut CourierConfig) {
    c.relay.claim_batch_size = 1;
    c.relay.max_in_flight_batches = 8;
    c.relay.claim_linger_millis = 0;
}

/// Publishes one event and waits until it is delivered and marked: the relay's Pub/Sub
/// connection exists from then on, and only then does a key's row go out alone (without a key
/// publisher, `publisher/lone_row.rs`).
async fn warm_up(s: &Setup) -> anyhow::Result<()> {
    commit(&s.db, &s.config, other_keys(&s.topic, "warm-up", 1)).await?;
    wait_until(WAIT, "the warm-up event delivered and marked", || async {
        other_keys_arrived(&s.collector, "warm-up", 1) && all_published(&s.db).await
    })
    .await
}

/// A publish fault that fails `version` of `key` the first `times` attempts, and the count of
/// attempts it saw at that row.
fn failing(
    key: &'static str,
    version: i64,
    times: u32,
    error: &'static str,
) -> (courier::relay::PublishFault, Arc<AtomicU32>) {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let fault: courier::relay::PublishFault = Arc::new(move |row| {
        (row.aggregate_id == key
            && row.version == version
            && seen.fetch_add(1, Ordering::SeqCst) < times)
            .then(|| error.to_string())
    });
    (fault, attempts)
}

fn spawn(config: &CourierConfig, options: RelayOptions) -> anyhow::Result<RelayHandle> {
    Ok(Relay::spawn(config, options)?)
}

const WAIT: Duration = Duration::from_secs(30);

/// Shards whose newest idle flag says idle.
const IDLE_SHARDS: &str = "SELECT count(*) FROM (SELECT DISTINCT ON (shard) idle \
     FROM courier.outbox_idle_flags ORDER BY shard, flag_seq DESC) f WHERE idle";

#[tokio::test]
async fn committed_events_arrive_with_attributes_and_rolled_back_ones_never_do(
) -> anyhow::Result<()> {
    let s = setup(|_| {}).await?;
    let _relay = spawn(&s.config, options())?;
    let committed: Vec<NewEvent> = (1..=3)
        .map(|v| {
            event(&s.topic, "video-1", v)
                .with_correlation_id("corr-1")
                .with_source_service("catalog")
        })
        .collect();
    commit(&s.db, &s.config, committed.clone()).await?;
    {
        let mut conn = s.db.pool.get().await?;
        let tx = conn.transaction().await?;
        Outbox::new(&s.config)
            .append_all(
                &tx,
                vec![event(&s.topic, "video-2", 1), event(&s.topic, "video-2", 2)],
            )
            .await?;
        tx.rollback().await?;
    }
    // A later committed event: once it and everything before it is published, a rolled-back
    // event would have had every chance to appear.
    commit(&s.db, &s.config, vec![event(&s.topic, "video-3", 1)]).await?;
    wait_until(WAIT, "4 committed events delivered", || async {
        s.collector.distinct_event_ids().len() >= 4 && all_published(&s.db).await
    })
    .await?;

    assert_eq!(count(&s.db, "SELECT count(*) FROM courier.outbox").await, 4);
    let received = s.collector.all();
    assert!(
        received.iter().all(|r| r.ordering_key != "video-2"),
        "rolled-back events were published"
    );
    for sent in &committed {
        let got = received
            .iter()
            .find(|r| r.attribute("event_id") == Some(&sent.event_id.to_string()))
            .expect("committed event delivered");
        assert_eq!(got.ordering_key, "video-1");
        assert_eq!(got.data, sent.payload);
        assert_eq!(got.attribute("event_type"), Some("video.changed"));
        assert_eq!(got.attribute("aggregate_id"), Some("video-1"));
        assert_eq!(got.attribute("aggregate_type"), Some("video"));
        assert_eq!(
            got.attribute("version"),
            Some(sent.version.to_string().as_str())
        );
        assert_eq!(got.attribute("schema_version"), Some("v1"));
        assert_eq!(got.attribute("correlation_id"), Some("corr-1"));
        assert_eq!(got.attribute("source_service"), Some("catalog"));
        let occurred = got.attribute("occurred_at").expect("occurred_at");
        assert!(
            chrono::DateTime::parse_from_rfc3339(occurred).is_ok(),
            "{occurred}"
        );
        assert_eq!(got.attribute("causation_id"), None);
    }
    assert_eq!(s.collector.publish_order()["video-1"], vec![1, 2, 3]);
    Ok(())
}

#[tokio::test]
async fn fifty_keys_of_twenty_versions_written_concurrently_arrive_in_version_order(
) -> anyhow::Result<()> {
    let s = setup(|_| {}).await?;
    let _relay = spawn(&s.config, options())?;
    let writers: Vec<_> = (0..10)
        .map(|w| {
            let pool = s.db.pool.clone();
            let config = s.config.clone();
            let topic = s.topic.clone();
            tokio::spawn(async move {
                let outbox = Outbox::new(&config);
                for version in 1..=20 {
                    for k in 0..5 {
                        let key = format!("key-{w}-{k}");
                        let mut conn = pool.get().await?;
                        let tx = conn.transaction().await?;
                        outbox.append(&tx, event(&topic, &key, version)).await?;
                        tx.commit().await?;
                    }
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    wait_until(Duration::from_secs(60), "1000 events delivered", || async {
        s.collector.distinct_event_ids().len() >= 1000
    })
    .await?;
    let arrivals = s.collector.publish_order();
    assert_eq!(arrivals.len(), 50);
    for (key, versions) in arrivals {
        assert_eq!(
            versions,
            (1..=20).collect::<Vec<_>>(),
            "key {key} out of order"
        );
    }
    Ok(())
}

/// With `retention.outbox_hours = 0` the relay's mark deletes each published row
/// (delete_published.sql) instead of keeping it: every event still arrives, each key in
/// version order, and the outbox ends empty.
#[tokio::test]
async fn with_no_outbox_retention_published_rows_are_deleted_and_every_event_arrives_in_order(
) -> anyhow::Result<()> {
    let s = setup(|c| c.retention.outbox_hours = 0).await?;
    let outbox = Outbox::new(&s.config);
    let mut conn = s.db.pool.get().await?;
    // Keys with several versions (the key publishers' path) and keys of one row each (lone
    // rows, as new aggregates are), written version by version in separate transactions.
    for version in 1..=5 {
        let tx = conn.transaction().await?;
        let mut events: Vec<NewEvent> = (0..20)
            .map(|k| event(&s.topic, &format!("many-{k}"), version))
            .collect();
        events.extend((0..20).map(|k| event(&s.topic, &format!("lone-{version}-{k}"), 1)));
        outbox.append_all(&tx, events).await?;
        tx.commit().await?;
    }
    let total = 5 * 40;
    let relay = spawn(&s.config, options())?;
    wait_until(
        WAIT,
        "every event delivered and its row deleted",
        || async {
            s.collector.distinct_event_ids().len() >= total
                && count(&s.db, "SELECT count(*) FROM courier.outbox").await == 0
        },
    )
    .await?;
    assert_eq!(relay.published(), total as u64, "rows marked by deletion");
    let arrivals = s.collector.publish_order();
    assert_eq!(arrivals.len(), 20 + 100);
    for (key, versions) in arrivals {
        let expected: Vec<i64> = if key.starts_with("many-") {
            (1..=5).collect()
        } else {
            vec![1]
        };
        assert_eq!(versions, expected, "key {key} out of order");
    }
    Ok(())
}

/// Claims resume after their previous claim's last row (claimer.rs, `ScanFrom`), so a row
/// whose transaction took its seq early and committed after later rows were claimed lies
/// below where claims look; it is still published, while other writes keep the relay busy.
/// It stays uncommitted for about three seconds, past several full scans whose floor looks
/// found rows above it (relay/floor.rs: the floor must not pass it).
#[tokio::test]
async fn a_row_committed_after_later_rows_were_claimed_is_still_published() -> anyhow::Result<()> {
    let s = setup(|c| {
        c.relay.shard_count = 1;
        c.relay.claim_batch_size = 10;
    })
    .await?;
    let outbox = Outbox::new(&s.config);
    let mut late_conn = s.db.pool.get().await?;
    let late = late_conn.transaction().await?;
    outbox.append(&late, event(&s.topic, "late", 1)).await?;
    let _relay = spawn(&s.config, options())?;
    let started = Instant::now();
    let mut written = 0;
    let mut late = Some(late);
    while started.elapsed() < Duration::from_secs(5) {
        commit(
            &s.db,
            &s.config,
            other_keys(&s.topic, &format!("busy-{written}"), 10),
        )
        .await?;
        written += 1;
        if started.elapsed() >= Duration::from_secs(3) {
            if let Some(late) = late.take() {
                late.commit().await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until(Duration::from_secs(30), "every row published", || async {
        all_published(&s.db).await
    })
    .await?;
    wait_until(
        Duration::from_secs(30),
        "the late row delivered",
        || async { s.collector.publish_order().contains_key("late") },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_failing_first_version_holds_back_its_key_only() -> anyhow::Result<()> {
    let s = setup(|_| {}).await?;
    let (fault, failures) = failing("stuck", 1, 3, "injected: broker unavailable");
    // Retries 1 s apart give time to look at the held-back state.
    let mut relay_config = s.config.clone();
    relay_config.relay.retry_base_millis = 1_000;
    relay_config.relay.retry_cap_millis = 1_000;
    let _relay = spawn(&relay_config, with_fault(fault))?;
    commit(
        &s.db,
        &s.config,
        (1..=5).map(|v| event(&s.topic, "stuck", v)).collect(),
    )
    .await?;
    commit(&s.db, &s.config, other_keys(&s.topic, "free", 5)).await?;

    wait_until(WAIT, "other keys delivered while v1 fails", || async {
        other_keys_arrived(&s.collector, "free", 5)
    })
    .await?;
    wait_until(WAIT, "a failed attempt recorded on v1", || async {
        count(
            &s.db,
            "SELECT count(*) FROM courier.outbox WHERE aggregate_id = 'stuck' AND version = 1
             AND publish_attempts >= 1 AND last_error LIKE 'injected%' AND next_retry_at IS NOT NULL",
        )
        .await
            == 1
    })
    .await?;
    assert!(
        !s.collector.publish_order().contains_key("stuck"),
        "a later version of the failing key was published before v1"
    );
    assert_eq!(
        count(&s.db, "SELECT count(*) FROM courier.outbox WHERE aggregate_id = 'stuck' AND published_at IS NOT NULL").await,
        0
    );

    wait_until(
        WAIT,
        "the held-back key delivered and marked after recovery",
        || async {
            s.collector.publish_order().get("stuck").map(Vec::len) == Some(5)
                && all_published(&s.db).await
        },
    )
    .await?;
    assert_eq!(s.collector.publish_order()["stuck"], vec![1, 2, 3, 4, 5]);
    assert_eq!(
        failures.load(Ordering::SeqCst),
        4,
        "three injected failures, then success"
    );
    assert_eq!(
        count(&s.db, "SELECT publish_attempts::bigint FROM courier.outbox WHERE aggregate_id = 'stuck' AND version = 1").await,
        4
    );
    // Later versions were never tried while v1 failed: no attempt counted against them.
    assert_eq!(
        count(&s.db, "SELECT max(publish_attempts)::bigint FROM courier.outbox WHERE aggregate_id = 'stuck' AND version > 1").await,
        1
    );
    Ok(())
}

#[tokio::test]
async fn a_failure_deep_in_a_key_with_overlapping_batches_keeps_the_key_in_order(
) -> anyhow::Result<()> {
    // Small batches, several in flight: one key's versions span many batches that publish at
    // the same time, so a failure in the middle must hold back rows already claimed behind it.
    let s = setup(|c| {
        c.relay.claim_batch_size = 5;
        c.relay.max_in_flight_batches = 4;
        c.relay.retry_base_millis = 200;
        c.relay.retry_cap_millis = 200;
    })
    .await?;
    let (fault, failures) = failing("deep", 23, 2, "injected: transient");
    let _relay = spawn(&s.config, with_fault(fault))?;
    let mut events: Vec<NewEvent> = (1..=60).map(|v| event(&s.topic, "deep", v)).collect();
    for v in 1..=3 {
        events.extend((0..20).map(|k| event(&s.topic, &format!("wide-{k}"), v)));
    }
    commit(&s.db, &s.config, events).await?;
    wait_until(
        Duration::from_secs(60),
        "120 events delivered and marked",
        || async { s.collector.distinct_event_ids().len() == 120 && all_published(&s.db).await },
    )
    .await?;
    let arrivals = s.collector.publish_order();
    assert_eq!(
        arrivals["deep"],
        (1..=60).collect::<Vec<_>>(),
        "deep key out of order"
    );
    for k in 0..20 {
        assert_eq!(arrivals[&format!("wide-{k}")], vec![1, 2, 3]);
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        3,
        "two injected failures, then success"
    );
    assert_eq!(
        count(&s.db, "SELECT publish_attempts::bigint FROM courier.outbox WHERE aggregate_id = 'deep' AND version = 23").await,
        3
    );
    Ok(())
}

/// Claims of one row each ([`claim_one_row_at_a_time`]). The key has no key publisher at
/// first: its first row goes out alone (a lone row, `publisher/lone_row.rs`), the rows claimed
/// meanwhile wait for it, and the rows claimed after its acknowledgement follow it at once.
/// All in order, and none given back: a key publisher started with nothing out would give
/// each of them back untried, and the key would crawl through re-claims.
#[tokio::test]
async fn rows_claimed_one_at_a_time_follow_a_lone_first_row_in_order_and_none_goes_back(
) -> anyhow::Result<()> {
    let s = setup(claim_one_row_at_a_time).await?;
    let relay = spawn(&s.config, options())?;
    warm_up(&s).await?;
    let mut events: Vec<NewEvent> = (1..=12).map(|v| event(&s.topic, "solo", v)).collect();
    events.extend(other_keys(&s.topic, "fresh", 20));
    commit(&s.db, &s.config, events).await?;
    wait_until(WAIT, "33 events delivered and marked", || async {
        s.collector.distinct_event_ids().len() == 33 && all_published(&s.db).await
    })
    .await?;
    assert_eq!(
        s.collector.publish_order()["solo"],
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(relay.given_back(), 0, "rows given back untried");
    Ok(())
}

/// A key's row claimed after the row before it was acknowledged, and before that row was
/// marked (marks are held back here), still names that row as unpublished. It goes out at
/// once, right behind it, although no key publisher kept the key's frontier (the row before
/// went out alone); it would otherwise go back untried until the mark.
#[tokio::test]
async fn a_row_claimed_behind_an_acknowledged_unmarked_lone_row_goes_out_at_once(
) -> anyhow::Result<()> {
    let s = setup(|c| c.relay.claim_linger_millis = 0).await?;
    let (open_marks, marks_open) = tokio::sync::watch::channel(false);
    let marks_waiting = Arc::new(AtomicU32::new(0));
    let waiting = marks_waiting.clone();
    let before_mark: courier::relay::BeforeMark = Arc::new(move |_| {
        waiting.fetch_add(1, Ordering::SeqCst);
        let mut open = marks_open.clone();
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
        })
    });
    let relay = spawn(
        &s.config,
        RelayOptions {
            before_mark: Some(before_mark),
            ..options()
        },
    )?;
    open_marks.send_replace(true);
    warm_up(&s).await?;
    open_marks.send_replace(false);
    let marks_before = marks_waiting.load(Ordering::SeqCst);

    commit(&s.db, &s.config, vec![event(&s.topic, "paced", 1)]).await?;
    wait_until(WAIT, "version 1 acknowledged and its mark held", || async {
        marks_waiting.load(Ordering::SeqCst) > marks_before
    })
    .await?;
    // A claimer with rows in flight claims again when a mark completes; with the mark held,
    // a wake-up NOTIFY makes it claim: flag the shards idle so that the append sends one.
    s.db.pool
        .get()
        .await?
        .execute(
            "INSERT INTO courier.outbox_idle_flags (shard, idle) \
             SELECT shard, true FROM courier.outbox_shard_state",
            &[],
        )
        .await?;
    commit(&s.db, &s.config, vec![event(&s.topic, "paced", 2)]).await?;
    wait_until(
        WAIT,
        "version 2 delivered while version 1's mark is held",
        || async { s.collector.publish_order().get("paced").map(Vec::len) == Some(2) },
    )
    .await?;
    open_marks.send_replace(true);
    wait_until(WAIT, "both marked", || async { all_published(&s.db).await }).await?;
    assert_eq!(s.collector.publish_order()["paced"], vec![1, 2]);
    assert_eq!(relay.given_back(), 0, "rows given back untried");
    Ok(())
}

/// A lone row whose publish fails spends an attempt, is retried, and its key's later rows
/// (claimed one at a time, each behind it) follow only its retry. (Rows that waited while a
/// lone row was out, and then see it fail: `tests/congestion.rs`.)
#[tokio::test]
async fn a_failing_lone_row_is_retried_and_its_key_follows_in_order() -> anyhow::Result<()> {
    let s = setup(|c| {
        claim_one_row_at_a_time(c);
        c.relay.retry_base_millis = 200;
        c.relay.retry_cap_millis = 200;
    })
    .await?;
    let (fault, failures) = failing("solo", 1, 2, "injected: transient");
    let _relay = spawn(&s.config, with_fault(fault))?;
    warm_up(&s).await?;
    commit(
        &s.db,
        &s.config,
        (1..=6).map(|v| event(&s.topic, "solo", v)).collect(),
    )
    .await?;
    wait_until(WAIT, "7 events delivered and marked", || async {
        s.collector.distinct_event_ids().len() == 7 && all_published(&s.db).await
    })
    .await?;
    assert_eq!(
        s.collector.publish_order()["solo"],
        (1..=6).collect::<Vec<_>>()
    );
    assert_eq!(
        failures.load(Ordering::SeqCst),
        3,
        "two injected failures, then success"
    );
    assert_eq!(
        count(&s.db, "SELECT publish_attempts::bigint FROM courier.outbox WHERE aggregate_id = 'solo' AND version = 1").await,
        3
    );
    Ok(())
}

#[tokio::test]
async fn a_relay_killed_between_publish_and_mark_republishes_on_restart() -> anyhow::Result<()> {
    let s = setup(|_| {}).await?;
    let stalled = Arc::new(AtomicU32::new(0));
    let flag = stalled.clone();
    let before_mark: courier::relay::BeforeMark = Arc::new(move |_| {
        flag.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::pending())
    });
    let relay = spawn(
        &s.config,
        RelayOptions {
            before_mark: Some(before_mark),
            ..options()
        },
    )?;
    let events: Vec<NewEvent> = (1..=5).map(|v| event(&s.topic, "crashy", v)).collect();
    commit(&s.db, &s.config, events.clone()).await?;
    wait_until(WAIT, "events published but not marked", || async {
        s.collector.distinct_event_ids().len() == 5 && stalled.load(Ordering::SeqCst) >= 1
    })
    .await?;
    assert_eq!(
        count(
            &s.db,
            "SELECT count(*) FROM courier.outbox WHERE published_at IS NULL"
        )
        .await,
        5
    );
    relay.kill();

    let _restarted = spawn(&s.config, options())?;
    wait_until(WAIT, "rows marked published by the new relay", || async {
        all_published(&s.db).await
    })
    .await?;
    wait_until(WAIT, "every event delivered twice", || async {
        s.collector.len() >= 10
    })
    .await?;
    let ids = s.collector.distinct_event_ids();
    for e in &events {
        assert!(
            ids.contains(&e.event_id.to_string()),
            "event {} lost",
            e.event_id
        );
    }
    Ok(())
}

#[tokio::test]
async fn two_relays_split_the_shards_and_one_takes_over_when_the_other_dies() -> anyhow::Result<()>
{
    let s = setup(|_| {}).await?;
    // Claimers restart only on database errors, which no test of this binary causes on the
    // pool; a released shard's claimer must stay stopped, not come back under its supervisor.
    let claimer_restarts = counter("courier_actor_restarts_total", Some("\"claimer\""));
    let a = spawn(&s.config, options())?;
    let started = Instant::now();
    wait_until(WAIT, "relay A owns all 4 shards", || async {
        a.owned_shards().await.len() == 4
    })
    .await?;
    let b = spawn(&s.config, options())?;
    wait_until(WAIT, "A and B own 2 shards each", || async {
        a.owned_shards().await.len() == 2 && b.owned_shards().await.len() == 2
    })
    .await?;
    let (mut owned_a, owned_b) = (a.owned_shards().await, b.owned_shards().await);
    owned_a.extend(&owned_b);
    owned_a.sort_unstable();
    assert_eq!(
        owned_a,
        vec![0, 1, 2, 3],
        "every shard owned by exactly one relay"
    );

    commit(
        &s.db,
        &s.config,
        (0..40)
            .map(|i| event(&s.topic, &format!("k{i}"), 1))
            .collect(),
    )
    .await?;
    b.kill();
    let killed = Instant::now();
    wait_until(WAIT, "A takes over B's shards", || async {
        a.owned_shards().await.len() == 4
    })
    .await?;
    let takeover = killed.elapsed();
    let lease = s.config.relay.claim_lease();
    assert!(
        takeover <= lease * 2,
        "takeover took {takeover:?}, lease is {lease:?}"
    );
    commit(
        &s.db,
        &s.config,
        (40..80)
            .map(|i| event(&s.topic, &format!("k{i}"), 1))
            .collect(),
    )
    .await?;
    wait_until(WAIT, "all 80 events delivered and marked", || async {
        s.collector.distinct_event_ids().len() == 80 && all_published(&s.db).await
    })
    .await?;
    assert_eq!(
        counter("courier_actor_restarts_total", Some("\"claimer\"")),
        claimer_restarts,
        "a released shard's claimer was restarted"
    );
    eprintln!(
        "split after {:?}, takeover in {takeover:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_relay_shutting_down_gracefully_hands_its_shards_over_within_one_tick(
) -> anyhow::Result<()> {
    // A lease of 30 s: a dead relay's shards move after the lease; a relay that shut down
    // gracefully deregistered, so the survivor takes them on its next tick (every 10 s).
    let s = setup(|c| c.relay.claim_lease_secs = 30).await?;
    let a = spawn(&s.config, options())?;
    let b = spawn(&s.config, options())?;
    wait_until(
        Duration::from_secs(60),
        "A and B own 2 shards each",
        || async { a.owned_shards().await.len() == 2 && b.owned_shards().await.len() == 2 },
    )
    .await?;
    b.shutdown(Duration::from_secs(10)).await;
    let stopped = Instant::now();
    wait_until(Duration::from_secs(60), "A owns all 4 shards", || async {
        a.owned_shards().await.len() == 4
    })
    .await?;
    let handover = stopped.elapsed();
    let lease = s.config.relay.claim_lease();
    assert!(
        handover < lease / 2,
        "handover took {handover:?}: the survivor waited for the lease ({lease:?})"
    );
    Ok(())
}

#[tokio::test]
async fn an_idle_relay_publishes_a_new_event_well_under_a_second_through_notify(
) -> anyhow::Result<()> {
    // Polling so slow that only NOTIFY can explain a quick publish.
    let s = setup(|c| {
        c.relay.poll_min_millis = 600_000;
        c.relay.poll_max_millis = 600_000;
    })
    .await?;
    let relay = spawn(&s.config, options())?;
    wait_until(WAIT, "all shards owned and flagged idle", || async {
        relay.owned_shards().await.len() == 4 && count(&s.db, IDLE_SHARDS).await == 4
    })
    .await?;
    for i in 0..3 {
        let committed = Instant::now();
        commit(
            &s.db,
            &s.config,
            vec![event(&s.topic, &format!("quick-{i}"), 1)],
        )
        .await?;
        wait_until(
            Duration::from_secs(1),
            "event delivered within a second of commit",
            || async { s.collector.distinct_event_ids().len() > i },
        )
        .await?;
        eprintln!("commit → delivered in {:?}", committed.elapsed());
        // Let the shard go idle again before the next round.
        wait_until(WAIT, "shards idle again", || async {
            count(&s.db, IDLE_SHARDS).await == 4
        })
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn only_appends_with_wakeups_notify_an_idle_shard() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let store = courier::operations::OutboxStore::new(db.pool.clone(), &db.config.schema);
    for shard in 0..config.relay.shard_count {
        store.set_shard_idle(shard, true, None).await?;
    }
    // A session of our own LISTENs; notifications arrive in commit order.
    let (listener, mut connection) = db
        .config
        .url
        .parse::<tokio_postgres::Config>()?
        .connect(tokio_postgres::NoTls)
        .await?;
    let (tx, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    listener
        .batch_execute(&format!(
            "LISTEN \"{}\"",
            courier::outbox::wake_channel("courier")
        ))
        .await?;

    // On different shards, so a wake-up from the quiet append could not pass for the loud one's.
    let shard_of = |key: &str| courier::outbox::shard_of(key, config.relay.shard_count);
    assert_ne!(shard_of("quiet"), shard_of("loud"));
    let quiet = Outbox::new(&config).without_wakeups();
    let mut conn = db.pool.get().await?;
    let tx_quiet = conn.transaction().await?;
    quiet
        .append(&tx_quiet, event("t.events", "quiet", 1))
        .await?;
    tx_quiet.commit().await?;
    let tx_loud = conn.transaction().await?;
    let loud = Outbox::new(&config)
        .append(&tx_loud, event("t.events", "loud", 1))
        .await?;
    tx_loud.commit().await?;

    let first = tokio::time::timeout(WAIT, notifications.recv()).await?;
    assert_eq!(
        first,
        Some(loud.shard.to_string()),
        "the first wake-up is the loud append's"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM courier.outbox").await,
        2,
        "both rows written"
    );
    Ok(())
}

#[tokio::test]
async fn rows_die_after_max_attempts_or_a_permanent_error_and_other_keys_flow() -> anyhow::Result<()>
{
    let s = setup(|c| c.relay.publish_max_attempts = 3).await?;
    let fault: courier::relay::PublishFault = Arc::new(|row| {
        (row.aggregate_id == "doomed").then(|| "injected: always failing".to_string())
    });
    let dead_before = counter("outbox_dead_total", None);
    let _relay = spawn(&s.config, with_fault(fault))?;
    commit(
        &s.db,
        &s.config,
        vec![event(&s.topic, "doomed", 1), event(&s.topic, "doomed", 2)],
    )
    .await?;
    // A topic that does not exist: NOT_FOUND is permanent, so one attempt is enough.
    commit(
        &s.db,
        &s.config,
        vec![event("no-such-topic-anywhere", "lost-topic", 1)],
    )
    .await?;
    commit(&s.db, &s.config, other_keys(&s.topic, "fine", 5)).await?;

    wait_until(WAIT, "both failing rows dead", || async {
        count(
            &s.db,
            "SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL",
        )
        .await
            == 2
    })
    .await?;
    wait_until(WAIT, "other keys delivered", || async {
        other_keys_arrived(&s.collector, "fine", 5)
    })
    .await?;
    assert_eq!(
        count(&s.db, "SELECT publish_attempts::bigint FROM courier.outbox WHERE aggregate_id = 'doomed' AND version = 1 AND last_error LIKE 'injected%'").await,
        3
    );
    assert_eq!(
        count(&s.db, "SELECT publish_attempts::bigint FROM courier.outbox WHERE aggregate_id = 'lost-topic' AND last_error ILIKE '%not%found%'").await,
        1
    );
    // v2 of the dead key waits behind it, untried.
    assert_eq!(
        count(&s.db, "SELECT count(*) FROM courier.outbox WHERE aggregate_id = 'doomed' AND version = 2 AND published_at IS NULL AND publish_attempts = 0").await,
        1
    );
    assert!(!s.collector.publish_order().contains_key("doomed"));
    assert!(counter("outbox_dead_total", None) >= dead_before + 2.0);
    Ok(())
}

#[tokio::test]
async fn invalid_events_are_rejected_and_nothing_is_written() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let outbox = Outbox::new(&config);
    let mut conn = db.pool.get().await?;

    let tx = conn.transaction().await?;
    let err = outbox
        .append_all(
            &tx,
            vec![event("valid.topic", "a", 1), event("valid.topic", "", 1)],
        )
        .await
        .expect_err("empty aggregate id");
    assert!(
        matches!(&err, AppendError::Invalid(e) if e.field == "aggregate_id"),
        "{err}"
    );
    assert!(err.to_string().contains("aggregate_id"), "{err}");
    let err = outbox
        .append(&tx, event("valid.topic", "a", 0))
        .await
        .expect_err("version 0");
    assert!(
        matches!(&err, AppendError::Invalid(e) if e.field == "version"),
        "{err}"
    );
    let mut huge = event("valid.topic", "a", 1);
    huge.payload = vec![0; 10_000_001];
    assert!(
        matches!(outbox.append(&tx, huge).await, Err(AppendError::Invalid(e)) if e.field == "payload")
    );
    let err = outbox
        .append_all(
            &tx,
            vec![event("valid.topic", "a", 1), event("valid.topic", "a", 1)],
        )
        .await
        .expect_err("duplicate version");
    assert!(matches!(err, AppendError::DuplicateVersion { .. }), "{err}");
    tx.commit().await?;
    assert_eq!(count(&db, "SELECT count(*) FROM courier.outbox").await, 0);

    // A version already committed is a conflict the caller can map to 409.
    let tx = conn.transaction().await?;
    outbox.append(&tx, event("valid.topic", "a", 1)).await?;
    tx.commit().await?;
    let tx = conn.transaction().await?;
    let err = outbox
        .append(&tx, event("valid.topic", "a", 1))
        .await
        .expect_err("conflict");
    assert!(err.is_conflict() && !err.is_transient(), "{err}");
    drop(tx);
    assert_eq!(count(&db, "SELECT count(*) FROM courier.outbox").await, 1);

    // Published, it is still a conflict: the version ledger remembers it (0015), and with
    // `retention.outbox_hours = 0` the published row is not even kept.
    for forget in [
        "UPDATE courier.outbox SET published_at = now()",
        "DELETE FROM courier.outbox",
    ] {
        db.pool.get().await?.batch_execute(forget).await?;
        let tx = conn.transaction().await?;
        let err = outbox
            .append(&tx, event("valid.topic", "a", 1))
            .await
            .expect_err("conflict with a published version");
        assert!(err.is_conflict() && !err.is_transient(), "{forget}: {err}");
    }
    db.pool
        .get()
        .await?
        .batch_execute("DELETE FROM courier.outbox_versions")
        .await?;
    let tx = conn.transaction().await?;
    let first = outbox.append(&tx, event("valid.topic", "a", 1)).await?;
    tx.commit().await?;

    // An event id is unique among unpublished rows (0014_unique_ids_among_unpublished.sql):
    // the same id on another aggregate is a conflict while the first is waiting.
    let mut same_id = event("valid.topic", "b", 1);
    same_id.event_id = first.event_id;
    let tx = conn.transaction().await?;
    let err = outbox
        .append(&tx, same_id)
        .await
        .expect_err("event id in use");
    assert!(err.is_conflict() && !err.is_transient(), "{err}");
    drop(tx);
    assert_eq!(count(&db, "SELECT count(*) FROM courier.outbox").await, 1);
    Ok(())
}

/// An append that names its cause is written once per cause (0021_caused_appends.sql): the
/// same version appended again with the same `causation_id` (a replayed event re-running the
/// projection that emitted it) writes nothing and says so; another cause, or none, is still a
/// conflict. Every form of the statement: pooled and plain transactions, one shard and many,
/// with and without the wake-up, appended and committed together; and a second transaction
/// appending the same cause waits for the first and then skips.
#[tokio::test]
async fn an_append_caused_by_an_event_is_written_once_per_cause() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let outbox = Outbox::new(&config);
    let caused = |key: &str, version: i64, cause: &str| {
        event("valid.topic", key, version).with_causation_id(cause)
    };
    const ROWS: &str = "SELECT count(*) FROM courier.outbox";
    let mut conn = db.pool.get().await?;

    let tx = conn.transaction().await?;
    let first = outbox.append(&tx, caused("a", 1, "cause-1")).await?;
    assert!(!first.replay);
    tx.commit().await?;
    let tx = conn.transaction().await?;
    let again = outbox.append(&tx, caused("a", 1, "cause-1")).await?;
    assert!(again.replay, "{again:?}");
    tx.commit().await?;
    assert_eq!(count(&db, ROWS).await, 1);

    // In one call with new versions, a caused and an uncaused one: only the replay is skipped.
    let tx = conn.transaction().await?;
    let appended = outbox
        .append_all(
            &tx,
            vec![
                caused("a", 1, "cause-1"),
                caused("a", 2, "cause-2"),
                event("valid.topic", "a", 3),
            ],
        )
        .await?;
    tx.commit().await?;
    let replays: Vec<bool> = appended.iter().map(|a| a.replay).collect();
    assert_eq!(replays, [true, false, false]);
    let ids: Vec<uuid::Uuid> = db
        .client()
        .await?
        .query(
            "SELECT id FROM courier.outbox WHERE version > 1 ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ids, [appended[1].event_id, appended[2].event_id]);

    // Another cause of a recorded version, or none, is a conflict, and writes nothing.
    for (conflicting, what) in [
        (caused("a", 1, "cause-9"), "another cause"),
        (event("valid.topic", "a", 1), "no cause"),
        (caused("a", 3, "cause-3"), "a cause for an uncaused version"),
    ] {
        let tx = conn.transaction().await?;
        let err = outbox
            .append_all(&tx, vec![caused("b", 1, "cause-b"), conflicting])
            .await
            .expect_err(what);
        assert!(err.is_conflict() && !err.is_transient(), "{what}: {err}");
    }
    assert_eq!(count(&db, ROWS).await, 3);

    // Events of several shards (the many-shard wake), and the quiet form.
    let other = (0..)
        .map(|i| format!("k{i}"))
        .find(|key| {
            courier::outbox::shard_of(key, config.relay.shard_count)
                != courier::outbox::shard_of("a", config.relay.shard_count)
        })
        .expect("a key of another shard");
    for outbox in [outbox.clone(), outbox.clone().without_wakeups()] {
        let tx = conn.transaction().await?;
        let appended = outbox
            .append_all(
                &tx,
                vec![caused("a", 2, "cause-2"), caused(&other, 1, "cause-o")],
            )
            .await?;
        tx.commit().await?;
        let replays: Vec<bool> = appended.iter().map(|a| a.replay).collect();
        assert!(replays[0], "{appended:?}");
        assert_eq!(count(&db, ROWS).await, 4, "{appended:?}");
    }

    // Appended and committed in one round trip.
    let tx = conn.transaction().await?;
    let appended = outbox
        .append_all_and_commit(
            tx,
            vec![caused(&other, 1, "cause-o"), caused("a", 4, "cause-4")],
        )
        .await?;
    assert_eq!(
        appended.iter().map(|a| a.replay).collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(count(&db, ROWS).await, 5);

    // A plain tokio-postgres transaction (statements not prepared).
    let mut plain = db.client().await?;
    let tx = plain.transaction().await?;
    assert!(outbox.append(&tx, caused("a", 4, "cause-4")).await?.replay);
    assert!(!outbox.append(&tx, caused("a", 5, "cause-5")).await?.replay);
    tx.commit().await?;
    assert_eq!(count(&db, ROWS).await, 6);

    // Two transactions appending one cause's version: the second waits for the first, and
    // skips once the first commits.
    let tx = conn.transaction().await?;
    assert!(!outbox.append(&tx, caused("c", 1, "cause-c")).await?.replay);
    let waiting = {
        let (pool, outbox) = (db.pool.clone(), outbox.clone());
        tokio::spawn(async move {
            let mut conn = pool.get().await?;
            let tx = conn.transaction().await?;
            let appended = outbox.append(&tx, caused("c", 1, "cause-c")).await?;
            tx.commit().await?;
            anyhow::Ok(appended)
        })
    };
    wait_until(
        Duration::from_secs(10),
        "the second append to wait",
        || async {
            count(
            &db,
            "SELECT count(*) FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0",
        )
        .await
            == 1
        },
    )
    .await?;
    tx.commit().await?;
    assert!(waiting.await??.replay);
    assert_eq!(count(&db, ROWS).await, 7);
    Ok(())
}

/// The business rows commit exactly when the events do, with the COMMIT pipelined behind the
/// insert: a failing insert (here a version conflict) rolls the business row back, which it
/// would not if the COMMIT overtook the insert; an invalid event sends nothing.
#[tokio::test]
async fn an_append_committed_with_its_transaction_takes_the_business_rows_with_it(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let outbox = Outbox::new(&config);
    let mut conn = db.pool.get().await?;
    conn.batch_execute("CREATE TABLE public.business (name text PRIMARY KEY)")
        .await?;
    let business = "INSERT INTO public.business (name) VALUES ($1)";

    let tx = conn.transaction().await?;
    tx.execute(business, &[&"committed"]).await?;
    let appended = outbox
        .append_and_commit(tx, event("valid.topic", "a", 1))
        .await?;
    assert_eq!((appended.aggregate_id.as_str(), appended.version), ("a", 1));

    let tx = conn.transaction().await?;
    tx.execute(business, &[&"conflict"]).await?;
    let err = outbox
        .append_and_commit(tx, event("valid.topic", "a", 1))
        .await
        .expect_err("version 1 of a is committed already");
    assert!(err.is_conflict() && !err.is_transient(), "{err}");

    let tx = conn.transaction().await?;
    tx.execute(business, &[&"invalid"]).await?;
    let err = outbox
        .append_and_commit(tx, event("valid.topic", "b", 0))
        .await
        .expect_err("version 0");
    assert!(
        matches!(&err, AppendError::Invalid(e) if e.field == "version"),
        "{err}"
    );

    let tx = conn.transaction().await?;
    tx.execute(business, &[&"no events"]).await?;
    assert!(outbox
        .append_all_and_commit(tx, Vec::new())
        .await?
        .is_empty());

    // The connection is left outside any transaction, ready for the next.
    let tx = conn.transaction().await?;
    let events = vec![event("valid.topic", "c", 1), event("valid.topic", "c", 2)];
    assert_eq!(outbox.append_all_and_commit(tx, events).await?.len(), 2);
    drop(conn);

    let names: Vec<String> = db
        .pool
        .get()
        .await?
        .query("SELECT name FROM public.business ORDER BY name", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(names, ["committed", "no events"]);
    assert_eq!(count(&db, "SELECT count(*) FROM courier.outbox").await, 3);
    Ok(())
}

#[tokio::test]
async fn failed_actors_restart_per_policy_and_escalate_past_their_budget() -> anyhow::Result<()> {
    let s = setup(|_| {}).await?;
    let restarts_before = counter("courier_actor_restarts_total", Some("shard_owner"));
    let listener_restarts_before = counter("courier_actor_restarts_total", Some("notify_listener"));
    let relay = spawn(&s.config, options())?;
    wait_until(WAIT, "shards owned", || async {
        relay.owned_shards().await.len() == 4
    })
    .await?;
    // Kill every connection of the relay (dedicated and pooled): the lock and LISTEN actors fail
    // and must come back by themselves; claims and marks retry on fresh pooled connections.
    let admin = s.db.client().await?;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database()
               AND application_name IN ('courier-shard-locks', 'courier-notify-listener', 'courier-relay')",
            &[],
        )
        .await?;
    wait_until(
        WAIT,
        "shard owner and notify listener restarted",
        || async {
            counter("courier_actor_restarts_total", Some("shard_owner")) > restarts_before
                && counter("courier_actor_restarts_total", Some("notify_listener"))
                    > listener_restarts_before
        },
    )
    .await?;
    wait_until(WAIT, "shards owned again", || async {
        relay.owned_shards().await.len() == 4
    })
    .await?;
    commit(&s.db, &s.config, vec![event(&s.topic, "after-restart", 1)]).await?;
    wait_until(WAIT, "event delivered after restarts", || async {
        !s.collector.is_empty()
    })
    .await?;
    drop(relay);

    // A database that is not there: every start fails, the budget runs out, it escalates.
    let mut broken = s.config.clone();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    broken.database.url = format!("host=127.0.0.1 port={closed_port} user=postgres dbname=none");
    broken.database.connect_timeout_secs = 1;
    let policy = courier::supervision::RestartPolicy {
        max_restarts: 3,
        window_secs: 60,
        initial_delay_millis: 10,
        max_delay_millis: 50,
    };
    broken.supervision.notify_listener = policy;
    broken.supervision.shard_owner = policy;
    let (escalate, escalations) = recording_escalations();
    let _broken = spawn(
        &broken,
        RelayOptions {
            escalate,
            ..RelayOptions::default()
        },
    )?;
    wait_until(WAIT, "both actors escalate", || async {
        let seen = escalations.lock().map(|e| e.clone()).unwrap_or_default();
        ["notify_listener", "shard_owner"].iter().all(|kind| {
            seen.iter()
                .any(|e| e.actor == *kind && e.restarts_in_window == 4)
        })
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn migrations_apply_once_even_when_run_twice_at_the_same_time() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let (a, b) = tokio::join!(
        migrate(&db.pool, "second", &[COURIER]),
        migrate(&db.pool, "second", &[COURIER])
    );
    let (a, b) = (a?, b?);
    assert_eq!(a.applied.len() + b.applied.len(), COURIER.migrations.len());
    assert_eq!(
        a.already_applied + b.already_applied,
        COURIER.migrations.len()
    );
    let again = migrate(&db.pool, "second", &[COURIER]).await?;
    assert!(again.applied.is_empty());
    assert_eq!(
        count(&db, "SELECT count(*) FROM second.schema_migrations").await,
        COURIER.migrations.len() as i64
    );
    Ok(())
}

/// A dead row and the version behind it lie below where a running relay's full scans start
/// once it has moved on (the floor, `relay/scan_from.rs`). An operator's retry wakes the
/// shard with a rescan, so both go out at once rather than never.
#[tokio::test]
async fn a_dead_row_retried_by_an_operator_under_a_running_relay_goes_out_with_the_version_behind_it(
) -> anyhow::Result<()> {
    use courier::operations::{Audit, DeadSelection, OutboxOperator};
    let s = setup(|_| {}).await?;
    let _relay = spawn(&s.config, options())?;
    {
        let mut conn = s.db.pool.get().await?;
        let tx = conn.transaction().await?;
        Outbox::new(&s.config)
            .append_all(&tx, (1..=2).map(|v| event(&s.topic, "doomed", v)).collect())
            .await?;
        tx.execute(
            "UPDATE courier.outbox SET dead_at = now(), publish_attempts = 10, \
             last_error = 'topic gone' WHERE aggregate_id = 'doomed' AND version = 1",
            &[],
        )
        .await?;
        tx.commit().await?;
    }
    // Rows appended after them go out, and full scans (every second) move the floor past
    // the dead row and the one behind it.
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(4) {
        round += 1;
        let prefix = format!("later{round}");
        commit(&s.db, &s.config, other_keys(&s.topic, &prefix, 4)).await?;
        wait_until(WAIT, "later rows delivered", || async {
            other_keys_arrived(&s.collector, &prefix, 4)
        })
        .await?;
    }
    assert!(!s.collector.publish_order().contains_key("doomed"));

    let operator = OutboxOperator::new(s.db.pool.clone(), &s.db.config.schema);
    let retried = operator
        .retry(
            &DeadSelection::All,
            &Audit {
                actor: "test",
                reason: "topic restored",
            },
        )
        .await?;
    assert_eq!(retried.len(), 1);
    wait_until(
        Duration::from_secs(10),
        "the retried row and the one behind it published",
        || async { s.collector.publish_order().get("doomed").map(Vec::len) == Some(2) },
    )
    .await?;
    assert_eq!(s.collector.publish_order()["doomed"], vec![1, 2]);
    Ok(())
}
