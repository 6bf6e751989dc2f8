//! The relay's backlog gauges (relay/backlog.rs), straight against real PostgreSQL: they count
//! what a count of every unpublished row counts, per shard and topic too (what `courier outbox
//! stats`, `courier status` and the console show), and while a long transaction pins the xmin
//! horizon a sample, and a one-off read from fresh floors, reads no more pages after 20,000 rows
//! were published than before (P9; a count of every unpublished-looking entry walks each
//! published row's dead version). A running relay counts each shard from its claimer's floor,
//! never above the claimer's own rows in flight.

use courier::operations::BacklogGauge;
use courier::operations::{Backlog, LimitSnapshot, OutboxOperator, OutboxStore, ShardStats};
use courier::outbox::Outbox;
use courier::CourierConfig;
use courier_testkit::keyed_event;
use courier_testkit::TestDb;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 4;

/// What the gauges read before floors: every unpublished row, dead ones apart.
const EVERY_UNPUBLISHED_ROW: &str = "
    SELECT count(*) FILTER (WHERE dead_at IS NULL),
           count(*) FILTER (WHERE dead_at IS NOT NULL),
           coalesce(max(publish_attempts) FILTER (WHERE dead_at IS NULL), 0),
           coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
    FROM courier.outbox WHERE published_at IS NULL";

/// What `courier outbox stats` read before floors: every unpublished row, per shard.
const EVERY_UNPUBLISHED_ROW_BY_SHARD: &str = "
    SELECT shard,
           count(*) FILTER (WHERE dead_at IS NULL) AS pending,
           count(*) FILTER (WHERE dead_at IS NULL AND lock_token IS NOT NULL
                              AND locked_at >= now() - interval '60 seconds') AS in_flight,
           count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
           coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
               AS oldest_pending_secs
    FROM courier.outbox
    WHERE published_at IS NULL
    GROUP BY shard
    ORDER BY shard";

/// The claim lease the per-shard reads are given.
const LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// The relay instance whose heartbeat records the floors.
const RELAY: uuid::Uuid = uuid::Uuid::from_u128(7);

/// A relay's configuration with [`SHARDS`] shards, publishing to a new topic named `topic`.
async fn relay_config(db: &TestDb, topic: &str) -> anyhow::Result<(CourierConfig, String)> {
    let pubsub = courier_testkit::TestPubSub::get().await?;
    let topic = pubsub.topic(topic).await?;
    let mut config = courier_testkit::test_config(db, &pubsub);
    config.relay.shard_count = SHARDS;
    Ok((config, topic))
}

async fn outbox(db: &TestDb) -> anyhow::Result<(Outbox, OutboxStore)> {
    let mut config = CourierConfig::default();
    config.database = db.config.clone();
    config.relay.shard_count = SHARDS;
    Ok((
        Outbox::new(&config),
        OutboxStore::new(db.pool.clone(), "courier"),
    ))
}

/// Appends versions `from..=to` of keys `{prefix}-0..keys`, in one transaction.
async fn append(
    db: &TestDb,
    outbox: &Outbox,
    prefix: &str,
    keys: usize,
    versions: (i64, i64),
) -> anyhow::Result<()> {
    append_on(db, outbox, "t.events", prefix, keys, versions).await
}

/// [`append`] on `topic`.
async fn append_on(
    db: &TestDb,
    outbox: &Outbox,
    topic: &str,
    prefix: &str,
    keys: usize,
    (from, to): (i64, i64),
) -> anyhow::Result<()> {
    let events = (from..=to)
        .flat_map(|v| (0..keys).map(move |k| keyed_event(topic, &format!("{prefix}-{k}"), v)))
        .collect();
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    outbox.append_all(&tx, events).await?;
    tx.commit().await?;
    Ok(())
}

async fn every_unpublished_row(db: &TestDb) -> anyhow::Result<Backlog> {
    let row = db
        .client()
        .await?
        .query_one(EVERY_UNPUBLISHED_ROW, &[])
        .await?;
    Ok(Backlog {
        pending: row.get(0),
        dead: row.get(1),
        max_attempts: row.get(2),
        oldest_pending_secs: row.get(3),
    })
}

async fn every_unpublished_row_by_shard(db: &TestDb) -> anyhow::Result<Vec<ShardStats>> {
    let rows = db
        .client()
        .await?
        .query(EVERY_UNPUBLISHED_ROW_BY_SHARD, &[])
        .await?;
    Ok(rows
        .iter()
        .map(|r| ShardStats {
            shard: r.get("shard"),
            pending: r.get("pending"),
            in_flight: r.get("in_flight"),
            dead: r.get("dead"),
            oldest_pending_secs: r.get("oldest_pending_secs"),
        })
        .collect())
}

/// `courier outbox stats`'s rows (from fresh floors) equal every unpublished row's count.
async fn assert_stats_same(db: &TestDb, when: &str) -> anyhow::Result<()> {
    let operator = OutboxOperator::new(db.pool.clone(), "courier");
    let stats = operator.shard_stats(SHARDS, LEASE).await?;
    let reference = every_unpublished_row_by_shard(db).await?;
    let counts = |s: &[ShardStats]| -> Vec<(i32, i64, i64, i64)> {
        s.iter()
            .map(|s| (s.shard, s.pending, s.in_flight, s.dead))
            .collect()
    };
    assert_eq!(counts(&stats), counts(&reference), "{when}");
    for (s, r) in stats.iter().zip(&reference) {
        assert!(
            (s.oldest_pending_secs - r.oldest_pending_secs).abs() < 1.0,
            "{when}: {s:?} against {r:?}"
        );
    }
    Ok(())
}

fn assert_same(gauge: &Backlog, reference: &Backlog, when: &str) {
    assert_eq!(
        (gauge.pending, gauge.dead, gauge.max_attempts),
        (reference.pending, reference.dead, reference.max_attempts),
        "{when}: gauge {gauge:?}, every row {reference:?}"
    );
    assert!(
        (gauge.oldest_pending_secs - reference.oldest_pending_secs).abs() < 1.0,
        "{when}: gauge {gauge:?}, every row {reference:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gauges_count_every_unpublished_row_from_their_floors() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let (outbox, store) = outbox(&db).await?;
    let mut gauge = BacklogGauge::new(SHARDS);
    append(&db, &outbox, "key", 20, (1, 10)).await?;
    let client = db.client().await?;
    // key-3 v4 waits for its retry and key-5 v2 is dead: their later versions wait behind them.
    client
        .batch_execute(
            "UPDATE courier.outbox SET next_retry_at = now() + interval '1 hour',
                    publish_attempts = 3
             WHERE aggregate_id = 'key-3' AND version = 4;
             UPDATE courier.outbox SET dead_at = now(), publish_attempts = 9
             WHERE aggregate_id = 'key-5' AND version = 2;",
        )
        .await?;
    // Two rows of key-7 are in flight (claimed under a live lease), one of key-8's lease ran out.
    client
        .batch_execute(
            "UPDATE courier.outbox SET lock_token = gen_random_uuid(), locked_at = now()
             WHERE aggregate_id = 'key-7' AND version <= 2;
             UPDATE courier.outbox SET lock_token = gen_random_uuid(),
                    locked_at = now() - interval '10 minutes'
             WHERE aggregate_id = 'key-8' AND version = 1;",
        )
        .await?;
    for look in 0..3 {
        let reference = every_unpublished_row(&db).await?;
        assert_same(
            &gauge.read(&store).await?,
            &reference,
            &format!("look {look}"),
        );
    }
    assert_stats_same(&db, "before publishing").await?;
    // Everything else goes out, so each shard's floor rises past the rows waiting behind the
    // two failed ones: those are counted through their key.
    client
        .batch_execute(
            "UPDATE courier.outbox SET published_at = now()
             WHERE NOT (aggregate_id = 'key-3' AND version >= 4)
               AND NOT (aggregate_id = 'key-5' AND version >= 2)",
        )
        .await?;
    append(&db, &outbox, "key", 20, (11, 11)).await?;
    for look in 0..3 {
        let reference = every_unpublished_row(&db).await?;
        assert_eq!(reference.pending, 7 + 9 + 20 - 1, "the reference itself");
        assert_same(
            &gauge.read(&store).await?,
            &reference,
            &format!("published, look {look}"),
        );
    }
    // Per shard: from the shards' starts (no relay recorded a floor), then from the floors the
    // gauge recorded as a relay's heartbeat does, now above the rows waiting behind the failed
    // ones: the failed rows and the ones behind them, nothing in flight.
    assert_stats_same(&db, "published, no floors recorded").await?;
    assert!(
        gauge.floors().iter().all(|f| *f > 0),
        "{:?}",
        gauge.floors()
    );
    record_floors(&store, &gauge.floors()).await?;
    assert_stats_same(&db, "published, from the recorded floors").await?;
    let stats = OutboxOperator::new(db.pool.clone(), "courier")
        .shard_stats(SHARDS, LEASE)
        .await?;
    assert_eq!(stats.iter().map(|s| s.pending).sum::<i64>(), 7 + 9 + 20 - 1);
    assert_eq!(stats.iter().map(|s| s.dead).sum::<i64>(), 1);
    Ok(())
}

/// The pages one gauge sample reads, its floors settled: the fewest of three samples after
/// three reads. Beside another test's stream of short transactions one sample read 376 → 4,850
/// pages, once in seven runs, its floors not risen: most likely a floor look that met a
/// transaction ending between its snapshot and its read of the lock table, which it cannot
/// tell from a writer of the outbox, so it kept its floor for one more look.
async fn sample_pages(
    db: &TestDb,
    gauge: &mut BacklogGauge,
    store: &OutboxStore,
) -> anyhow::Result<i64> {
    for _ in 0..3 {
        gauge.read(store).await?;
    }
    db.fewest_pages("", 3, async || {
        gauge.read(store).await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sample_reads_no_more_pages_after_rows_published_under_a_pinned_horizon(
) -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    db.enable_statement_stats().await?;
    let (outbox, store) = outbox(&db).await?;
    let mut gauge = BacklogGauge::new(SHARDS);
    let pin = db.pin_snapshot().await?;
    pin.batch_execute("SELECT count(*) FROM courier.outbox")
        .await?;
    // Versions 1 wait for their retry and versions 2 behind them: neither holds a floor.
    append(&db, &outbox, "key", 100, (1, 2)).await?;
    db.client()
        .await?
        .execute(
            "UPDATE courier.outbox SET next_retry_at = now() + interval '1 hour', \
             publish_attempts = 1 WHERE version = 1",
            &[],
        )
        .await?;
    // With statistics, as autovacuum keeps them (none on a new table: PostgreSQL then plans for
    // an outbox of a page or so, and how it walks one does not matter).
    db.client()
        .await?
        .batch_execute("ANALYZE courier.outbox")
        .await?;
    let before = sample_pages(&db, &mut gauge, &store).await?;
    record_floors(&store, &gauge.floors()).await?;
    let once_before = read_once_pages(&db, &store).await?;
    let client = db.client().await?;
    for round in 0..40 {
        append(&db, &outbox, &format!("filler-{round}"), 500, (1, 1)).await?;
        client
            .execute(
                "UPDATE courier.outbox SET published_at = now() \
                 WHERE published_at IS NULL AND aggregate_id LIKE 'filler-%'",
                &[],
            )
            .await?;
    }
    let after = sample_pages(&db, &mut gauge, &store).await?;
    record_floors(&store, &gauge.floors()).await?;
    let once_after = read_once_pages(&db, &store).await?;
    let reference = every_unpublished_row(&db).await?;
    assert_eq!(reference.pending, 200);
    assert_same(&gauge.read(&store).await?, &reference, "pinned");
    eprintln!("pages per gauge sample: {before} before, {after} after");
    assert!(
        after <= before * 2 + 20,
        "a gauge sample read {before} pages before and {after} after 20,000 rows were \
         published under the pin"
    );
    eprintln!("pages per one-off read: {once_before} before, {once_after} after");
    assert!(
        once_after <= once_before * 2 + 20,
        "a one-off read (courier outbox stats) read {once_before} pages before and \
         {once_after} after 20,000 rows were published under the pin"
    );
    assert_stats_same(&db, "pinned").await?;
    pin.batch_execute("ROLLBACK").await?;
    Ok(())
}

/// Records `floors` as a relay's heartbeat does.
async fn record_floors(store: &OutboxStore, floors: &[i64]) -> anyhow::Result<()> {
    let limit = LimitSnapshot {
        limit: 1,
        in_flight: 0,
        keys_out: 0,
        latency_ms: 0.0,
    };
    store.heartbeat(RELAY, &[], LEASE, limit, floors).await?;
    Ok(())
}

/// The pages a one-off read from the recorded floors reads (`courier outbox stats`, `courier
/// status`, the console): the fewest of three.
async fn read_once_pages(db: &TestDb, store: &OutboxStore) -> anyhow::Result<i64> {
    db.fewest_pages("", 3, async || {
        BacklogGauge::read_once(store, SHARDS, LEASE).await?;
        Ok(())
    })
    .await
}

/// A running relay records its gauge's floors with its heartbeat, risen past what it published,
/// and `courier outbox stats` counts the rows appended after them from those floors as a count
/// of every unpublished row does.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_records_its_floors_and_stats_count_from_them() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let (config, topic) = relay_config(&db, "floors").await?;
    let outbox = Outbox::new(&config);
    let relay = courier_testkit::spawn_relay(&config)?;
    append_on(&db, &outbox, &topic, "before", 50, (1, 1)).await?;
    let highest_published = "SELECT coalesce(max(seq), 0) FROM courier.outbox";
    courier_testkit::wait_until(
        std::time::Duration::from_secs(30),
        "every row published",
        || async {
            db.scalar("SELECT count(*) FROM courier.outbox WHERE published_at IS NULL")
                .await
                .ok()
                == Some(0)
        },
    )
    .await?;
    let published_up_to = db.scalar(highest_published).await?;
    // Every shard's floor above the published rows (each shard had some of the 50 keys).
    courier_testkit::wait_until(
        std::time::Duration::from_secs(30),
        "the relay's floors recorded above the published rows",
        || async {
            db.scalar(&format!(
                "SELECT count(*) FROM courier.relay_instances, unnest(backlog_floors) f
                 WHERE cardinality(backlog_floors) = {SHARDS} AND f > {published_up_to}"
            ))
            .await
            .ok()
                == Some(i64::from(SHARDS))
        },
    )
    .await?;
    let store = OutboxStore::new(db.pool.clone(), "courier");
    let recorded = store.recorded_floors(SHARDS).await?;
    assert!(
        recorded.iter().all(|f| *f > published_up_to),
        "{recorded:?}"
    );
    // A graceful shutdown deletes the relay's row: record its floors again as a relay that
    // stopped without one would have left them, then append behind its back.
    relay.shutdown(std::time::Duration::from_secs(5)).await;
    record_floors(&store, &recorded).await?;
    append_on(&db, &outbox, &topic, "after", 50, (1, 1)).await?;
    assert_stats_same(&db, "after the relay stopped").await?;
    let stats = OutboxOperator::new(db.pool.clone(), "courier")
        .shard_stats(SHARDS, LEASE)
        .await?;
    assert_eq!(stats.iter().map(|s| s.pending).sum::<i64>(), 50);
    Ok(())
}

/// A running relay's gauge takes each shard's floor from its claimer, lowered to the claimer's
/// own rows in flight, which its floor leaves out. With every mark held back, published rows
/// stay unmarked in flight while later rows keep the claimers scanning (their floors move past
/// the held rows): each floor the relay records stays at or below its shard's lowest held row,
/// and `courier outbox stats` counts the held rows from those floors.
#[tokio::test(flavor = "multi_thread")]
async fn a_relays_floors_stay_below_its_rows_in_flight() -> anyhow::Result<()> {
    const WAIT: Duration = Duration::from_secs(30);
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let (config, topic) = relay_config(&db, "floors-in-flight").await?;
    let outbox = Outbox::new(&config);
    let (open_marks, marks_open) = tokio::sync::watch::channel(true);
    let marks_held = Arc::new(AtomicU32::new(0));
    let held = marks_held.clone();
    let before_mark: courier::relay::BeforeMark = Arc::new(move |_| {
        let mut open = marks_open.clone();
        let held = held.clone();
        Box::pin(async move {
            if !*open.borrow() {
                held.fetch_add(1, Ordering::SeqCst);
            }
            let _ = open.wait_for(|open| *open).await;
        })
    });
    let relay = courier::relay::Relay::spawn(
        &config,
        courier::relay::RelayOptions {
            before_mark: Some(before_mark),
            escalate: Arc::new(|e| tracing::error!(?e, "actor escalated")),
            ..courier::relay::RelayOptions::default()
        },
    )?;
    let unpublished = "SELECT count(*) FROM courier.outbox WHERE published_at IS NULL";
    append_on(&db, &outbox, &topic, "warm", 40, (1, 1)).await?;
    courier_testkit::wait_until(WAIT, "the warm-up published", || async {
        db.scalar(unpublished).await.ok() == Some(0)
    })
    .await?;
    open_marks.send_replace(false);
    append_on(&db, &outbox, &topic, "held", 40, (1, 1)).await?;
    courier_testkit::wait_until(
        WAIT,
        "the held rows claimed and their marks held",
        || async {
            db.scalar(
                "SELECT count(*) FROM courier.outbox
             WHERE aggregate_id LIKE 'held-%' AND lock_token IS NULL",
            )
            .await
            .ok()
                == Some(0)
                && marks_held.load(Ordering::SeqCst) > 0
        },
    )
    .await?;
    let lowest_held: Vec<(i32, i64)> = db
        .client()
        .await?
        .query(
            "SELECT shard, min(seq) FROM courier.outbox WHERE aggregate_id LIKE 'held-%'
             GROUP BY shard ORDER BY shard",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(lowest_held.len(), SHARDS as usize, "{lowest_held:?}");
    let store = OutboxStore::new(db.pool.clone(), "courier");
    let heartbeat = "SELECT coalesce(max(extract(epoch FROM heartbeat_at)), 0)::float8
                     FROM courier.relay_instances";
    let heartbeat_at = || async {
        db.client()
            .await?
            .query_one(heartbeat, &[])
            .await
            .map(|r| r.get::<_, f64>(0))
            .map_err(anyhow::Error::from)
    };
    // Later rows keep every claimer claiming, so full scans move its floor past the held rows
    // (its own in flight), over several heartbeats; each heartbeat's floors are checked.
    let mut heartbeats = 0;
    let mut last_beat = heartbeat_at().await?;
    for round in 0..60 {
        append_on(&db, &outbox, &topic, &format!("later-{round}"), 8, (1, 1)).await?;
        let beat = heartbeat_at().await?;
        if beat > last_beat {
            last_beat = beat;
            heartbeats += 1;
            let recorded = store.recorded_floors(SHARDS).await?;
            for &(shard, lowest) in &lowest_held {
                assert!(
                    recorded[shard as usize] <= lowest,
                    "heartbeat {heartbeats}: shard {shard}'s floor {} is above its lowest row \
                     in flight, {lowest} (floors {recorded:?})",
                    recorded[shard as usize]
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(heartbeats >= 3, "{heartbeats} heartbeats in the rounds");
    assert_stats_same(&db, "marks held").await?;
    open_marks.send_replace(true);
    courier_testkit::wait_until(WAIT, "everything marked", || async {
        db.scalar(unpublished).await.ok() == Some(0)
    })
    .await?;
    relay.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
