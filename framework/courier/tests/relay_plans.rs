//! The relay's writes to rows it claimed (the mark, the failure mark, the release) are planned
//! as fetches of the rows' addresses, whatever the outbox looked like when they were planned,
//! on the relay's own sessions (`db::relay_pool`) and with the plan a prepared statement keeps
//! (generic). Both shapes that went wrong are here:
//! - a relay keeping up: few rows unpublished among many published, with statistics. With a
//!   `published_at IS NULL` conjunct the planner read the rows through a full scan of a
//!   partial index on unpublished rows, which holds an entry for every row published since
//!   the last vacuum: 3 ms a mark at 500 rows/s, where the fetch costs microseconds;
//! - a new, empty outbox never analyzed: a sequential scan looks cheapest and, cached, would
//!   read the whole table once it has grown.

use courier::db::{relay_pool, PgConnection};
use courier_testkit::{generic_plan, TestDb};

/// The statements, as shipped: name, text, parameter types, arguments for `EXECUTE`.
const STATEMENTS: [(&str, &str, &str, &str); 4] = [
    (
        "mark_published.sql",
        include_str!("../src/relay/queries/mark_published.sql"),
        "tid[], uuid, int8[]",
        "'{\"(0,1)\"}', '00000000-0000-0000-0000-000000000000', '{1000}'",
    ),
    (
        "delete_published.sql",
        include_str!("../src/relay/queries/delete_published.sql"),
        "tid[], uuid",
        "'{\"(0,1)\"}', '00000000-0000-0000-0000-000000000000'",
    ),
    (
        "mark_failed.sql",
        include_str!("../src/relay/queries/mark_failed.sql"),
        "tid[], text[], timestamptz[], boolean[], boolean[], uuid",
        "'{\"(0,1)\"}', '{e}', '{2030-01-01}', '{f}', '{t}', \
         '00000000-0000-0000-0000-000000000000'",
    ),
    (
        "release.sql",
        include_str!("../src/relay/queries/release.sql"),
        "tid[], uuid",
        "'{\"(0,1)\"}', '00000000-0000-0000-0000-000000000000'",
    ),
];

/// The generic plan of each statement on `conn`, as `EXPLAIN` prints it.
async fn generic_plans(conn: &PgConnection) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut plans = Vec::new();
    for (name, sql, types, args) in STATEMENTS {
        let sql = sql.replace("{schema}", "courier");
        plans.push((name, generic_plan(conn, &sql, types, args).await?));
    }
    Ok(plans)
}

fn assert_address_fetches(plans: &[(&str, String)], outbox: &str) {
    for (name, plan) in plans {
        assert!(
            plan.contains("Tid Scan") && !plan.contains("Index") && !plan.contains("Seq Scan"),
            "{name} on {outbox} is not planned as a fetch of its addresses:\n{plan}"
        );
    }
}

#[tokio::test]
async fn the_relays_writes_fetch_their_addresses_on_an_empty_outbox_and_on_one_keeping_up(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let pool = relay_pool(&db.config, "relay-plans-test")?;
    let conn = pool.get().await?;
    assert_address_fetches(&generic_plans(&conn).await?, "a new outbox, never analyzed");

    // 20,000 rows published and one not, with statistics: the partial indexes on unpublished
    // rows look nearly empty to the planner.
    db.client()
        .await?
        .batch_execute(
            "INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id,
                                         event_type, version, schema_version, payload,
                                         occurred_at, published_at)
             SELECT gen_random_uuid(), i % 8, 't', 'video', 'k' || i, 'e', 1, 1, '\\x00',
                    now(), CASE WHEN i > 1 THEN now() END
             FROM generate_series(1, 20000) i;
             ANALYZE courier.outbox",
        )
        .await?;
    assert_address_fetches(
        &generic_plans(&conn).await?,
        "an outbox of published rows and one unpublished",
    );
    Ok(())
}
