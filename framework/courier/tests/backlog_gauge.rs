//! The relay's backlog gauges (relay/backlog.rs), straight against real PostgreSQL: they count
//! what a count of every unpublished row counts, and while a long transaction pins the xmin
//! horizon a sample reads no more pages after 20,000 rows were published than before (P9; a
//! count of every unpublished-looking entry walks each published row's dead version).

use courier::operations::BacklogGauge;
use courier::operations::{Backlog, OutboxStore};
use courier::outbox::Outbox;
use courier::CourierConfig;
use courier_testkit::keyed_event;
use courier_testkit::TestDb;

const SHARDS: u32 = 4;

/// What the gauges read before floors: every unpublished row, dead ones apart.
const EVERY_UNPUBLISHED_ROW: &str = "
    SELECT count(*) FILTER (WHERE dead_at IS NULL),
           count(*) FILTER (WHERE dead_at IS NOT NULL),
           coalesce(max(publish_attempts) FILTER (WHERE dead_at IS NULL), 0),
           coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
    FROM courier.outbox WHERE published_at IS NULL";

/// Pages the statements run in this database have read (from cache or disk), other than this
/// query's own: `pg_stat_statements` counts a statement as it ends (scripts/stack.sh loads it).
const PAGES_READ: &str = "
    SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
    FROM public.pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND query NOT LIKE '%pg_stat_statements%'";

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
    (from, to): (i64, i64),
) -> anyhow::Result<()> {
    let events = (from..=to)
        .flat_map(|v| (0..keys).map(move |k| keyed_event("t.events", &format!("{prefix}-{k}"), v)))
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
    for look in 0..3 {
        let reference = every_unpublished_row(&db).await?;
        assert_same(
            &gauge.read(&store).await?,
            &reference,
            &format!("look {look}"),
        );
    }
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
    let mut fewest = i64::MAX;
    for _ in 0..3 {
        let before = db.scalar(PAGES_READ).await?;
        gauge.read(store).await?;
        fewest = fewest.min(db.scalar(PAGES_READ).await? - before);
    }
    Ok(fewest)
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
    let reference = every_unpublished_row(&db).await?;
    assert_eq!(reference.pending, 200);
    assert_same(&gauge.read(&store).await?, &reference, "pinned");
    eprintln!("pages per gauge sample: {before} before, {after} after");
    assert!(
        after <= before * 2 + 20,
        "a gauge sample read {before} pages before and {after} after 20,000 rows were \
         published under the pin"
    );
    pin.batch_execute("ROLLBACK").await?;
    Ok(())
}
