//! The offset store against real PostgreSQL: a lane moves forward only, except by a reset;
//! no save waits for another transaction saving the same lane; and a save costs the same
//! while a long transaction pins the xmin horizon (P9), planned through the index whatever
//! the log looked like when it was planned.

use chrono::{DateTime, Duration as TimeDelta, SubsecRound as _, Utc};
use courier::inbound::OffsetStore;
use courier::operations::Position;
use courier_testkit::{generic_plan, TestDb};
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

/// The store's statements as it runs them, schema `courier`.
fn save_sql() -> String {
    with_newest(
        include_str!("../src/inbound/queries/save_offset.sql"),
        "$8::bigint",
        "$9::timestamptz",
    )
}

/// `sql` with the lane's newest entry looked for from position (`reset`, `time`).
fn with_newest(sql: &str, reset: &str, time: &str) -> String {
    let newest = include_str!("../src/inbound/queries/lane_newest.sql")
        .trim_end()
        .replace("{reset}", reset)
        .replace("{time}", time);
    sql.replace("{schema}", "courier")
        .replace("{newest}", &newest.replace("{schema}", "courier"))
}

fn load_sql() -> String {
    let positions = include_str!("../src/inbound/queries/lane_positions.sql");
    include_str!("../src/inbound/queries/load_offset.sql")
        .replace("{positions}", positions.trim_end())
        .replace("{schema}", "courier")
}

fn prune_sql() -> String {
    with_newest(
        include_str!("../src/inbound/queries/prune_offsets.sql"),
        "$5::bigint",
        "$6::timestamptz",
    )
}

/// A save of `routing_key`'s lane in a transaction of its own on `conn`.
async fn save_on(
    conn: &mut courier::db::PgConnection,
    store: &OffsetStore,
    group: &str,
    routing_key: &str,
    message_id: &str,
    publish_time: DateTime<Utc>,
) -> anyhow::Result<()> {
    let tx = conn.transaction().await?;
    store
        .save(
            &tx,
            group,
            "sub",
            Position {
                routing_key,
                message_id,
                publish_time,
            },
            "test",
        )
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Shared buffers (hit + read) of a plan `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` printed.
fn buffers(explained: &serde_json::Value) -> i64 {
    let plan = &explained[0]["Plan"];
    plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + plan["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// Buffers one save of each lane costs through `conn`'s prepared save statement, its plan as
/// the store plans it (sequential scans off), each save rolled back; and buffers of a load.
/// The saves have seen the lane nowhere: each reads the whole lane, as a store's first does.
async fn cost_of_a_save_and_a_load(
    conn: &mut courier::db::PgConnection,
    lanes: i32,
    publish_time: DateTime<Utc>,
) -> anyhow::Result<(i64, i64)> {
    let name: String = conn
        .query_one(
            "SELECT name FROM pg_prepared_statements WHERE statement = $1",
            &[&save_sql()],
        )
        .await?
        .get(0);
    let mut save = 0;
    for lane in 0..lanes {
        let tx = conn.transaction().await?;
        tx.batch_execute("SET LOCAL enable_seqscan = off").await?;
        let explained: serde_json::Value = tx
            .query_one(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) \
                     EXECUTE {name}('{GROUP}', {lane}, 'sub', 'probe', '{}', 0, 'test', NULL, NULL)",
                    publish_time.to_rfc3339()
                ),
                &[],
            )
            .await?
            .get(0);
        tx.rollback().await?;
        save = save.max(buffers(&explained));
    }
    let explained: serde_json::Value = conn
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", load_sql()),
            &[&GROUP],
        )
        .await?
        .get(0);
    Ok((save, buffers(&explained)))
}

#[tokio::test]
async fn a_save_costs_the_same_while_a_snapshot_pins_the_horizon() -> anyhow::Result<()> {
    const LANES: u32 = 16;
    const SAVES: usize = 20_000;
    const EARLY: usize = 1_000;
    let db = TestDb::new().await?;
    let store = OffsetStore::new("courier", LANES);
    let mut conn = db.pool.get().await?;
    // Durability is not what is measured here.
    conn.batch_execute("SET synchronous_commit = off").await?;
    let t = Utc::now() - TimeDelta::hours(1);
    let at = |i: usize| t + TimeDelta::milliseconds(i64::try_from(i).unwrap_or(i64::MAX));

    // A report, a pg_dump, a session idle in transaction: its snapshot keeps every row version
    // deleted or replaced from now on.
    let pin = db.pin_snapshot().await?;

    let mut early = None;
    for i in 1..=SAVES {
        save_on(
            &mut conn,
            &store,
            GROUP,
            &format!("key-{i}"),
            &format!("m{i}"),
            at(i),
        )
        .await?;
        if i == EARLY {
            early = Some(
                cost_of_a_save_and_a_load(
                    &mut conn,
                    LANES as i32,
                    at(i) + TimeDelta::microseconds(500),
                )
                .await?,
            );
        }
    }
    let late = cost_of_a_save_and_a_load(
        &mut conn,
        LANES as i32,
        at(SAVES) + TimeDelta::microseconds(500),
    )
    .await?;
    let early = early.expect("measured after the early saves");
    pin.batch_execute("COMMIT").await?;

    let (save_early, load_early) = early;
    let (save_late, load_late) = late;
    eprintln!(
        "pinned, buffers after {EARLY} and {SAVES} saves: a save {save_early} and {save_late}, \
         a load {load_early} and {load_late}"
    );
    // At most 1.5 times as many, and a few more (a level the index may gain: one per probe).
    let flat = |early: i64, late: i64, probes: i64| 2 * late <= 3 * early + 2 * probes;
    assert!(
        flat(save_early, save_late, 2),
        "a save read {save_early} buffers after {EARLY} saves and {save_late} after {SAVES}, pinned"
    );
    assert!(
        flat(load_early, load_late, 2 * i64::from(LANES)),
        "a load read {load_early} buffers after {EARLY} saves and {load_late} after {SAVES}, pinned"
    );
    let offset = store.load(&db.pool, GROUP).await?.expect("saved");
    assert_eq!(
        offset.message_id.as_deref(),
        Some(format!("m{SAVES}").as_str())
    );
    assert_eq!(offset.lanes, i64::from(LANES));
    Ok(())
}

/// Where a store last saw a lane's newest entry decides only where its next save looks first:
/// a newer entry another process saved and one seen in a transaction that rolled back, before
/// a reset and after it, are read right.
#[tokio::test]
async fn a_save_finds_the_lanes_newest_entry_wherever_its_store_last_saw_it() -> anyhow::Result<()>
{
    let db = TestDb::new().await?;
    let (ours, theirs) = (store(), store());
    let t = Utc::now() - TimeDelta::minutes(10);
    let at = |seconds| t + TimeDelta::seconds(seconds);
    saved_in_own_tx(&db, &ours, "m2", at(2)).await?;
    // Another process moved the lane past what this store saw: an older save moves nothing.
    saved_in_own_tx(&db, &theirs, "m4", at(4)).await?;
    saved_in_own_tx(&db, &ours, "m3", at(3)).await?;
    assert_eq!(message_id(&db, &ours).await?.as_deref(), Some("m4"));
    // This store saw m9 in a transaction that rolled back: the lane stands at m4, m5 moves it.
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    save(&ours, &tx, "m9", at(9)).await?;
    tx.rollback().await?;
    saved_in_own_tx(&db, &ours, "m5", at(5)).await?;
    assert_eq!(message_id(&db, &ours).await?.as_deref(), Some("m5"));
    saved_in_own_tx(&db, &ours, "m1", at(1)).await?;
    assert_eq!(message_id(&db, &ours).await?.as_deref(), Some("m5"));
    // The same after a reset: the lane moves on under the reset's id, or it would rank below.
    ours.reset(&db.pool, GROUP, "sub", at(4), "test", "replay")
        .await?;
    let tx = conn.transaction().await?;
    save(&ours, &tx, "m9", at(9)).await?;
    tx.rollback().await?;
    saved_in_own_tx(&db, &ours, "m7", at(7)).await?;
    assert_eq!(message_id(&db, &ours).await?.as_deref(), Some("m7"));
    Ok(())
}

#[tokio::test]
async fn a_save_that_moves_the_lane_does_not_wait_for_another_transaction_moving_it(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let store = store();
    let t = Utc::now() - TimeDelta::minutes(10);
    saved_in_own_tx(&db, &store, "m1", t + TimeDelta::seconds(1)).await?;

    let mut mover_conn = db.pool.get().await?;
    let mover = mover_conn.transaction().await?;
    save(&store, &mover, "m3", t + TimeDelta::seconds(3)).await?;

    // Saves append: the second mover neither waits nor is lost, and the newest wins whichever
    // commits first.
    tokio::time::timeout(
        Duration::from_secs(5),
        saved_in_own_tx(&db, &store, "m2", t + TimeDelta::seconds(2)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the moving save waited for the open transaction"))??;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m2"));
    mover.commit().await?;
    assert_eq!(message_id(&db, &store).await?.as_deref(), Some("m3"));
    Ok(())
}

#[tokio::test]
async fn a_reset_moves_every_lane_back_and_the_lanes_go_on_from_there() -> anyhow::Result<()> {
    const LANES: u32 = 4;
    let db = TestDb::new().await?;
    let store = OffsetStore::new("courier", LANES);
    let mut conn = db.pool.get().await?;
    // Microseconds, as PostgreSQL keeps them.
    let t = (Utc::now() - TimeDelta::minutes(10)).trunc_subsecs(6);
    // Enough saves that every lane has been pruned a few times.
    for i in 1..=1_000 {
        let at = t + TimeDelta::milliseconds(i);
        save_on(
            &mut conn,
            &store,
            GROUP,
            &format!("key-{i}"),
            &format!("m{i}"),
            at,
        )
        .await?;
    }
    let before = store.load(&db.pool, GROUP).await?.expect("saved");
    assert_eq!(before.lanes, i64::from(LANES));
    assert_eq!(before.message_id.as_deref(), Some("m1000"));
    assert_eq!(store.groups(&db.pool).await?, vec![GROUP.to_string()]);
    let m1000 = store.publish_time_of(&db.pool, GROUP, "m1000").await?;
    assert_eq!(m1000, Some(before.newest_publish_time));

    let to = t + TimeDelta::milliseconds(500);
    let reset = store
        .reset(&db.pool, GROUP, "sub", to, "test", "rebuild")
        .await?;
    assert_eq!(reset.old_publish_time, Some(before.newest_publish_time));
    let after = store.load(&db.pool, GROUP).await?.expect("reset");
    assert_eq!(
        (
            after.newest_publish_time,
            after.oldest_publish_time,
            after.lanes
        ),
        (to, to, i64::from(LANES))
    );
    assert_eq!(after.message_id, None);
    let audited = db
        .scalar("SELECT count(*) FROM courier.consumer_offset_resets WHERE reason = 'rebuild'")
        .await?;
    assert_eq!(audited, 1);

    // A lane moves on from the reset, never back behind it; the others stay where it put them.
    save_on(
        &mut conn,
        &store,
        GROUP,
        "key-1",
        "early",
        to - TimeDelta::milliseconds(1),
    )
    .await?;
    assert_eq!(store.load(&db.pool, GROUP).await?, Some(after.clone()));
    let later = to + TimeDelta::milliseconds(1);
    save_on(&mut conn, &store, GROUP, "key-1", "replayed", later).await?;
    let moved = store.load(&db.pool, GROUP).await?.expect("saved");
    assert_eq!(moved.message_id.as_deref(), Some("replayed"));
    assert_eq!(
        (moved.newest_publish_time, moved.oldest_publish_time),
        (later, to)
    );
    // The view keeps the table's old shape: one row per lane, its position.
    let lanes = db
        .scalar("SELECT count(*) FROM courier.consumer_offsets WHERE publish_time >= now() - interval '1 day'")
        .await?;
    assert_eq!(lanes, i64::from(LANES));
    Ok(())
}

#[tokio::test]
async fn saves_prune_their_lanes_without_waiting_for_each_other() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let t = Utc::now() - TimeDelta::minutes(10);
    let mut conn = db.pool.get().await?;
    let first = store();
    for i in 1..=1_000 {
        let at = t + TimeDelta::milliseconds(i);
        save_on(&mut conn, &first, GROUP, "k", &format!("m{i}"), at).await?;
    }
    let entries = "SELECT count(*) FROM courier.consumer_offset_log";
    assert!(
        db.scalar(entries).await? <= 3 * 64,
        "the lane was not pruned"
    );

    // Two stores (two processes) pruning the lane at once: the second skips what the first
    // holds instead of waiting for its commit.
    let (second, third) = (store(), store());
    let mut open_conn = db.pool.get().await?;
    let open = open_conn.transaction().await?;
    for i in 1_001..=1_064 {
        save(
            &second,
            &open,
            &format!("m{i}"),
            t + TimeDelta::milliseconds(i),
        )
        .await?;
    }
    let mut other_conn = db.pool.get().await?;
    tokio::time::timeout(Duration::from_secs(5), async {
        let tx = other_conn.transaction().await?;
        for i in 2_001..=2_064 {
            save(
                &third,
                &tx,
                &format!("m{i}"),
                t + TimeDelta::milliseconds(i),
            )
            .await?;
        }
        tx.commit().await?;
        anyhow::Ok(())
    })
    .await
    .map_err(|_| anyhow::anyhow!("a prune waited for another transaction's prune"))??;
    open.commit().await?;
    assert_eq!(message_id(&db, &first).await?.as_deref(), Some("m2064"));
    Ok(())
}

#[tokio::test]
async fn the_save_and_the_prune_are_planned_through_the_index() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let store = OffsetStore::new("courier", 16);
    let t = Utc::now() - TimeDelta::minutes(10);
    let mut conn = db.pool.get().await?;
    // A new log, never analyzed; then the log as it is while no horizon is pinned: one entry
    // per lane, analyzed (a sequential scan of its page looks cheapest).
    for log in ["new", "small and analyzed"] {
        if log != "new" {
            for i in 1..=200 {
                let at = t + TimeDelta::milliseconds(i);
                save_on(&mut conn, &store, GROUP, &format!("key-{i}"), "m", at).await?;
            }
            conn.batch_execute(
                "DELETE FROM courier.consumer_offset_log o WHERE EXISTS (
                     SELECT FROM courier.consumer_offset_log n
                     WHERE n.consumer_group = o.consumer_group AND n.lane = o.lane
                       AND n.publish_time > o.publish_time)",
            )
            .await?;
            conn.batch_execute("VACUUM ANALYZE courier.consumer_offset_log")
                .await?;
        }
        // Planned as the store plans them: in its transaction, after its save.
        let tx = conn.transaction().await?;
        save(&store, &tx, "probe", Utc::now()).await?;
        let probe_time = "'2030-01-01'::timestamptz";
        let plans = [
            (
                "save_offset.sql",
                generic_plan(
                    &tx,
                    &save_sql(),
                    "text, int, text, text, timestamptz, bigint, text, bigint, timestamptz",
                    &format!("'{GROUP}', 0, 'sub', 'm', {probe_time}, 0, 'test', 0, {probe_time}"),
                )
                .await?,
            ),
            (
                "prune_offsets.sql",
                generic_plan(
                    &tx,
                    &prune_sql(),
                    "text, int, bigint, timestamptz, bigint, timestamptz",
                    &format!("'{GROUP}', 0, 0, {probe_time}, 0, {probe_time}"),
                )
                .await?,
            ),
        ];
        tx.rollback().await?;
        for (name, plan) in &plans {
            assert!(
                !plan.contains("Seq Scan"),
                "{name} on a {log} log reads the whole table:\n{plan}"
            );
        }
        // The lane's newest entry is looked for from where the store saw it first: below lie
        // the dead entries a pinned horizon keeps (lane_newest.sql).
        for ((name, plan), (reset, time)) in plans.iter().zip([("$8", "$9"), ("$5", "$6")]) {
            let bounded = format!(
                "Index Cond: ((consumer_group = $1) AND (lane = $2) AND (reset_id = {reset}) \
                 AND (publish_time >= {time}))"
            );
            assert!(
                plan.contains(&bounded),
                "{name} on a {log} log does not bound its look for the lane's newest:\n{plan}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_migration_to_the_log_keeps_every_lanes_offset() -> anyhow::Result<()> {
    use courier::migrate::{migrate, COURIER};
    let db = TestDb::new().await?;
    db.migrate_before("upgraded", "0018_append_offsets").await?;
    db.client()
        .await?
        .batch_execute(
            "INSERT INTO upgraded.consumer_offsets
                 (consumer_group, lane, subscription, message_id, publish_time, lag_millis, updated_by)
             VALUES ('g', 0, 'sub', 'm0', '2026-01-01T00:00:00Z', 5, 'old'),
                    ('g', 1, 'sub', 'm1', '2026-01-01T00:00:01Z', 7, 'old'),
                    ('h', 0, 'sub', 'n0', '2026-01-02T00:00:00Z', 0, 'old')",
        )
        .await?;
    migrate(&db.pool, "upgraded", &[COURIER]).await?;

    let store = OffsetStore::new("upgraded", 2);
    assert_eq!(store.groups(&db.pool).await?, vec!["g", "h"]);
    let g = store.load(&db.pool, "g").await?.expect("kept");
    assert_eq!(
        (g.message_id.as_deref(), g.lanes, g.max_lag_millis),
        (Some("m1"), 2, 7)
    );
    assert_eq!(
        g.oldest_publish_time.to_rfc3339(),
        "2026-01-01T00:00:00+00:00"
    );
    // A lane goes on from its migrated position, never back behind it.
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let t = "2025-12-31T00:00:00Z".parse()?;
    let early = Position {
        routing_key: "k",
        message_id: "early",
        publish_time: t,
    };
    for lane_key in ["a", "b", "c", "d"] {
        let position = Position {
            routing_key: lane_key,
            ..early.clone()
        };
        store.save(&tx, "g", "sub", position, "test").await?;
    }
    tx.commit().await?;
    assert_eq!(store.load(&db.pool, "g").await?, Some(g));
    Ok(())
}
