//! The per-connection statement cache against real PostgreSQL: a statement is prepared once
//! per connection, survives the transaction that prepared it, and the cache stays bounded;
//! outbox appends on a pooled transaction use it.

use courier::db::PgConnection;
use courier::outbox::{NewEvent, Outbox};
use courier::CourierConfig;
use courier_testkit::{keyed_event, TestDb};

const SUM: &str = "SELECT $1::int + 1";
/// Followed by a number, the text of one of many distinct statements.
const DISTINCT: &str = "SELECT $1::int -";

/// Named statements on `conn`'s session whose text starts with `prefix`.
async fn prepared_on_session(conn: &PgConnection, prefix: &str) -> anyhow::Result<i64> {
    let row = conn
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(statement, $1)",
            &[&prefix],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn a_statement_is_prepared_once_per_connection() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut conn = db.pool.get().await?;
    for n in 0..3 {
        let sum = conn.prepared(SUM).await?;
        let row = conn.query_one(&sum, &[&n]).await?;
        assert_eq!(row.get::<_, i32>(0), n + 1);
    }
    let tx = conn.transaction().await?;
    let sum = tx.prepared(SUM).await?;
    assert_eq!(tx.query_one(&sum, &[&41]).await?.get::<_, i32>(0), 42);
    tx.commit().await?;
    assert_eq!(prepared_on_session(&conn, SUM).await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_statement_prepared_in_a_failed_transaction_stays_usable() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let sum = tx.prepared(SUM).await?;
    tx.query_one(&sum, &[&1]).await?;
    // Abort the transaction, then roll it back: the server keeps protocol-level statements.
    assert!(tx.execute("SELECT 1/0", &[]).await.is_err());
    tx.rollback().await?;
    let sum = conn.prepared(SUM).await?;
    assert_eq!(conn.query_one(&sum, &[&1]).await?.get::<_, i32>(0), 2);
    assert_eq!(prepared_on_session(&conn, SUM).await?, 1);
    Ok(())
}

#[tokio::test]
async fn the_cache_is_bounded() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let conn = db.pool.get().await?;
    let distinct = 300;
    for n in 0..distinct {
        let sql = format!("{DISTINCT} {n}");
        let statement = conn.prepared(&sql).await?;
        let row = conn.query_one(&statement, &[&n]).await?;
        assert_eq!(row.get::<_, i32>(0), 0);
    }
    // Those past the bound were closed when their last handle dropped; the cached ones stay.
    let kept = prepared_on_session(&conn, DISTINCT).await?;
    assert!(
        kept > 0 && kept < i64::from(distinct),
        "{kept} of {distinct} statements kept"
    );
    Ok(())
}

#[tokio::test]
async fn appends_on_a_pooled_transaction_run_prepared_and_plain_transactions_still_append(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let config = CourierConfig {
        database: db.config.clone(),
        ..Default::default()
    };
    let event = |version| {
        NewEvent::new(
            "t.events",
            "video",
            "v-1",
            "video.changed",
            version,
            vec![1u8],
        )
    };
    let outbox = Outbox::new(&config);
    let quiet = Outbox::new(&config).without_wakeups();
    let mut conn = db.pool.get().await?;
    for version in 1..=3 {
        let tx = conn.transaction().await?;
        outbox.append(&tx, event(version)).await?;
        tx.commit().await?;
    }
    let tx = conn.transaction().await?;
    quiet.append(&tx, event(4)).await?;
    tx.commit().await?;
    // One statement with the wake-up, one without (both record the versions first); each
    // prepared once on this session.
    assert_eq!(prepared_on_session(&conn, "WITH versions AS").await?, 2);

    // A plain tokio-postgres transaction has no cache: the same append, parsed each time.
    let mut plain = db.client().await?;
    let tx = plain.transaction().await?;
    outbox.append(&tx, event(5)).await?;
    tx.commit().await?;
    let versions: Vec<i64> = conn
        .query("SELECT version FROM courier.outbox ORDER BY seq", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    Ok(())
}

/// PostgreSQL plans a prepared statement anew at each of its first five runs, then keeps its
/// generic plan only if that is estimated no costlier than the custom plans were. The append's
/// wake costed ten shards in the generic plan (the planner's guess for an array) against one in
/// the custom ones, so every append was planned again: 127 µs of PostgreSQL's CPU per write, as
/// much as running it. Appends of one shard's events, as most are, must keep the generic plan;
/// appends spanning shards still append and wake.
#[tokio::test]
async fn appends_of_one_shards_events_keep_their_generic_plan() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let config = CourierConfig {
        database: db.config.clone(),
        ..Default::default()
    };
    let outbox = Outbox::new(&config);
    let event = |key: &str, version| keyed_event("t.events", key, version);
    let mut conn = db.pool.get().await?;
    for version in 1..=12 {
        let tx = conn.transaction().await?;
        outbox.append_and_commit(tx, event("v-1", version)).await?;
    }
    let row = conn
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
             WHERE starts_with(statement, 'WITH versions AS')",
            &[],
        )
        .await?;
    let (generic, custom): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        generic >= 6 && custom <= 6,
        "the append was planned anew: {generic} generic plans, {custom} custom"
    );

    // Events of many shards in one append.
    let tx = conn.transaction().await?;
    let events: Vec<NewEvent> = (0..32).map(|i| event(&format!("k-{i}"), 1)).collect();
    outbox.append_all(&tx, events).await?;
    tx.commit().await?;
    let shards: i64 = conn
        .query_one("SELECT count(DISTINCT shard) FROM courier.outbox", &[])
        .await?
        .get(0);
    assert!(shards > 1, "32 keys landed in {shards} shard");
    Ok(())
}
