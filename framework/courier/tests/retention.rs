//! Retention against real PostgreSQL: the janitor deletes published outbox rows, the version
//! ledger's rows and processed inbox rows past their retention, in batches, and keeps recent,
//! pending and dead rows; while a long transaction pins the xmin horizon its batches cost no
//! more as it goes (P9).

use chrono::{DateTime, Utc};
use courier::config::RetentionConfig;
use courier::operations::{sweep, sweep_from, Positions, RetentionQueries};
use courier::outbox::{NewEvent, Outbox};
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
    let janitor =
        courier::operations::start_janitor(&config, escalate)?.expect("enabled by default");
    wait_until(Duration::from_secs(30), "expired rows gone", || async {
        scalar(&db, "SELECT count(*) FROM courier.inbox").await == 4
            && scalar(&db, "SELECT count(*) FROM courier.outbox").await == 10
    })
    .await?;
    assert_kept(&db).await;
    drop(janitor);
    Ok(())
}

/// Expired rows each step of the pinned run adds to each table, and the steps: 60,000 rows a
/// table, deleted 100 at a time (small batches, so a walk over the dead entries shows against
/// a batch's own work).
const STEP_ROWS: u64 = 3_000;
const STEPS: i32 = 20;
const BATCH: u32 = 100;

/// Adds `$2` expired rows to each of the outbox (published), the ledger and the inbox, stamped
/// in hour `$1` of a day a month ago, so each step's rows are newer than the last's, as when
/// time passes. Within a step the stamps are in an order unrelated to where the rows sit in
/// the heap (as in a table whose vacuumed space is reused), 7 rows to a stamp (the rows one
/// transaction writes share its now()).
const ADD_EXPIRED: &str = "
    WITH stamps AS (
        SELECT i, now() - interval '30 days' + make_interval(hours => $1)
                  + ((i * 7919) % $2 / 7) * interval '1 ms' AS at
        FROM generate_series(0, $2 - 1) i
    ), outbox AS (
        INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                    version, schema_version, payload, occurred_at, created_at,
                                    published_at)
        SELECT gen_random_uuid(), 0, 'retention.events', 'video', format('old-%s-%s', $1, i),
               'video.updated', 1, 1, '\\x01', at, at, at
        FROM stamps
    ), versions AS (
        INSERT INTO courier.outbox_versions (aggregate_id, version, appended_at)
        SELECT format('old-%s-%s', $1, i), 1, at FROM stamps
    )
    INSERT INTO courier.inbox (consumer_group, event_id, publish_time, processed_at)
    SELECT 'g', gen_random_uuid(), at, at FROM stamps";

/// Rows no sweep may delete: 5 outbox rows published now, 3 dead for a month, 2 pending, their
/// 10 ledger rows appended now, 4 inbox rows processed now.
const ADD_KEPT: &str = "
    INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                version, schema_version, payload, occurred_at, created_at,
                                published_at, dead_at)
    SELECT gen_random_uuid(), 0, 'retention.events', 'video', 'kept-' || i, 'video.updated', 1,
           1, '\\x01', now(), now(), CASE WHEN i < 5 THEN now() END,
           CASE WHEN i BETWEEN 5 AND 7 THEN now() - interval '30 days' END
    FROM generate_series(0, 9) i;
    INSERT INTO courier.outbox_versions (aggregate_id, version)
    SELECT 'kept-' || i, 1 FROM generate_series(0, 9) i;
    INSERT INTO courier.inbox (consumer_group, event_id, publish_time)
    SELECT 'g', gen_random_uuid(), now() FROM generate_series(1, 4);";

/// The rows of each table past `retention`'s cutoff: outbox, ledger, inbox.
async fn expired(db: &TestDb, retention: &RetentionConfig) -> [i64; 3] {
    let mut counts = [0; 3];
    for (count, (table, column, hours)) in counts.iter_mut().zip([
        ("outbox", "published_at", retention.outbox_hours),
        ("outbox_versions", "appended_at", retention.version_hours),
        ("inbox", "processed_at", retention.inbox_hours),
    ]) {
        let sql = format!(
            "SELECT count(*) FROM courier.{table} WHERE {column} < now() - interval '{hours} hours'"
        );
        *count = scalar(db, &sql).await;
    }
    counts
}

/// Shared buffers (hit + read) the janitor's next batch of one table touches: its statement
/// `sql` from `position` under `EXPLAIN (ANALYZE, BUFFERS)`, rolled back so it deletes nothing.
async fn next_batch_buffers(
    client: &mut tokio_postgres::Client,
    sql: &str,
    hours: u64,
    position: Option<DateTime<Utc>>,
) -> anyhow::Result<i64> {
    let tx = client.transaction().await?;
    let hours = i32::try_from(hours)?;
    let row = tx
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"),
            &[&hours, &i64::from(BATCH), &position],
        )
        .await?;
    tx.rollback().await?;
    let explained: serde_json::Value = row.get(0);
    let plan = &explained[0]["Plan"];
    let blocks = |name: &str| plan[name].as_i64().unwrap_or(0);
    let buffers = blocks("Shared Hit Blocks") + blocks("Shared Read Blocks");
    anyhow::ensure!(buffers > 0, "no buffer counts in {explained}");
    Ok(buffers)
}

#[tokio::test]
async fn while_a_snapshot_pins_the_horizon_batches_cost_the_same_and_the_sweep_catches_up_after(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let retention = RetentionConfig {
        batch_size: BATCH,
        ..RetentionConfig::default()
    };
    let queries = RetentionQueries::new("courier");
    let statements = [
        include_str!("../src/retention/queries/delete_published_outbox.sql"),
        include_str!("../src/retention/queries/delete_expired_versions.sql"),
        include_str!("../src/retention/queries/delete_processed_inbox.sql"),
    ]
    .map(|sql| courier::db::render(sql, "courier"));
    let hours = [
        retention.outbox_hours,
        retention.version_hours,
        retention.inbox_hours,
    ];
    let mut client = db.client().await?;
    client.batch_execute(ADD_KEPT).await?;

    // A report's snapshot, open from here on: no row deleted from now on may be removed, by
    // vacuum or by a scan marking its index entry dead.
    let pin = db.pin_snapshot().await?;
    let pinned: bool = client
        .query_one(
            "SELECT count(*) = 1 FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction'
               AND backend_xmin IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    assert!(pinned, "the pinning session holds no snapshot");

    let mut positions = Positions::default();
    let mut costs = Vec::new();
    for step in 0..STEPS {
        client
            .execute(ADD_EXPIRED, &[&step, &i32::try_from(STEP_ROWS)?])
            .await?;
        let mut step_costs = [0; 3];
        for (table, position) in [positions.outbox, positions.versions, positions.inbox]
            .into_iter()
            .enumerate()
        {
            step_costs[table] =
                next_batch_buffers(&mut client, &statements[table], hours[table], position).await?;
        }
        costs.push(step_costs);
        let swept = sweep_from(&db.pool, &queries, &retention, &mut positions).await?;
        assert_eq!(
            (swept.outbox_rows, swept.version_rows, swept.inbox_rows),
            (STEP_ROWS, STEP_ROWS, STEP_ROWS),
            "step {step}"
        );
    }

    // Each table's next batch, as the last steps found it, within 1.5x of what it cost in the
    // first steps (+ a few index pages). Batches that started at the oldest row (before issue
    // 53) walked every row deleted since the pin: by the 20th step 2.4x (ledger) to 6x
    // (outbox) the buffers of the first.
    for (table, name) in ["outbox", "outbox_versions", "inbox"]
        .into_iter()
        .enumerate()
    {
        let mean =
            |steps: &[[i64; 3]]| steps.iter().map(|c| c[table]).sum::<i64>() / steps.len() as i64;
        let (first, last) = (mean(&costs[..3]), mean(&costs[costs.len() - 3..]));
        assert!(
            last <= first * 3 / 2 + 20,
            "{name}: a batch touched {first} buffers in the first steps and {last} in the \
             last ({:?})",
            costs.iter().map(|c| c[table]).collect::<Vec<_>>()
        );
    }

    // A cutoff that moves back below the positions (a clock stepped back, or longer
    // retention) deletes nothing and leaves them where they are.
    let longer = RetentionConfig {
        outbox_hours: 365 * 24,
        version_hours: 365 * 24,
        inbox_hours: 365 * 24,
        ..retention.clone()
    };
    let before = positions;
    let swept = sweep_from(&db.pool, &queries, &longer, &mut positions).await?;
    assert_eq!(
        (swept.outbox_rows, swept.version_rows, swept.inbox_rows),
        (0, 0, 0)
    );
    assert_eq!(positions, before);

    // Once the pin ends, the janitor goes on from where it was and leaves nothing expired,
    // and nothing else.
    pin.batch_execute("COMMIT").await?;
    client
        .execute(ADD_EXPIRED, &[&STEPS, &i32::try_from(STEP_ROWS)?])
        .await?;
    let swept = sweep_from(&db.pool, &queries, &retention, &mut positions).await?;
    assert_eq!(
        (swept.outbox_rows, swept.version_rows, swept.inbox_rows),
        (STEP_ROWS, STEP_ROWS, STEP_ROWS)
    );
    assert_eq!(expired(&db, &retention).await, [0, 0, 0]);
    let fresh = sweep(&db.pool, &queries, &retention).await?;
    assert_eq!(
        (fresh.outbox_rows, fresh.version_rows, fresh.inbox_rows),
        (0, 0, 0)
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM courier.outbox WHERE published_at IS NOT NULL"
        )
        .await,
        5
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM courier.outbox WHERE dead_at IS NOT NULL"
        )
        .await,
        3
    );
    assert_eq!(scalar(&db, "SELECT count(*) FROM courier.outbox").await, 10);
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM courier.outbox_versions").await,
        10
    );
    assert_eq!(scalar(&db, "SELECT count(*) FROM courier.inbox").await, 4);

    // With outbox_hours = 0 every published row is due at once (the relay deletes them as it
    // marks them; the janitor finds skipped ones): a row stamped by a mark still in flight
    // would sit below any position, so the outbox's is not kept from one sweep to the next.
    let none_kept = RetentionConfig {
        outbox_hours: 0,
        ..retention.clone()
    };
    let swept = sweep_from(&db.pool, &queries, &none_kept, &mut positions).await?;
    assert_eq!(swept.outbox_rows, 5);
    assert_eq!(positions.outbox, None);
    assert_eq!(scalar(&db, "SELECT count(*) FROM courier.outbox").await, 5);
    Ok(())
}
