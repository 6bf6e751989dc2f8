//! The offset store against real PostgreSQL: a lane moves forward only, and a save that moves
//! nothing does not wait for another transaction that is moving the same lane.

use chrono::{DateTime, Duration as TimeDelta, Utc};
use courier::inbound::offsets::Position;
use courier::inbound::OffsetStore;
use courier_testkit::TestDb;
use std::time::Duration;

const GROUP: &str = "g";

/// One lane, so every save lands on the same row.
fn store() -> OffsetStore {
    OffsetStore::new("courier", 1)
}

async fn save(
    store: &OffsetStore,
    tx: &courier::db::PgTransaction<'_>,
    message_id: &str,
    publish_time: DateTime<Utc>,
) -> anyhow::Result<()> {
    store
        .save(
            tx,
            GROUP,
            "sub",
            Position {
                routing_key: "k",
                message_id,
                publish_time,
            },
            "test",
        )
        .await?;
    Ok(())
}

async fn saved_in_own_tx(
    db: &TestDb,
    store: &OffsetStore,
    message_id: &str,
    publish_time: DateTime<Utc>,
) -> anyhow::Result<()> {
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    save(store, &tx, message_id, publish_time).await?;
    tx.commit().await?;
    Ok(())
}

async fn message_id(db: &TestDb, store: &OffsetStore) -> anyhow::Result<Option<String>> {
    Ok(store
        .load(&db.pool, GROUP)
        .await?
        .and_then(|offset| offset.message_id))
}

#[tokio::test]
async fn a_lane_moves_forward_only() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let store = store();
    let t = Utc::now() - TimeDelta::minutes(10);
    saved_in_own_tx(&db, &store, "m2", t + TimeDelta::seconds(2)).await?;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m2"));
    saved_in_own_tx(&db, &store, "m1", t + TimeDelta::seconds(1)).await?;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m2"));
    saved_in_own_tx(&db, &store, "m3", t + TimeDelta::seconds(3)).await?;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m3"));
    Ok(())
}

#[tokio::test]
async fn a_save_that_moves_nothing_does_not_wait_for_a_transaction_moving_the_lane(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let store = store();
    let t = Utc::now() - TimeDelta::minutes(10);
    saved_in_own_tx(&db, &store, "m2", t + TimeDelta::seconds(2)).await?;

    // A transaction moves the lane to m5 and stays open, holding the row's lock.
    let mut mover_conn = db.pool.get().await?;
    let mover = mover_conn.transaction().await?;
    save(&store, &mover, "m5", t + TimeDelta::seconds(5)).await?;

    // A save of an older message must not queue behind it (projection transactions of one
    // lane would otherwise run one commit at a time).
    tokio::time::timeout(
        Duration::from_secs(5),
        saved_in_own_tx(&db, &store, "m1", t + TimeDelta::seconds(1)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the no-op save waited for the open transaction"))??;

    mover.commit().await?;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m5"));
    Ok(())
}
