//! `--history N`: the same events drained from an outbox already holding N published rows.

use super::relay_drain;
use super::DrainArgs;

use crate::harness::fixtures::{fill, set_shards_idle};
use crate::report::measures::{Rate, Ratio};
use anyhow::Context as _;
use courier::outbox::NewEvent;
use courier_testkit::TestDb;
use std::time::Instant;

/// The relay's drain of `events` from `empty` (no history) and from a second outbox holding
/// `--history` published rows, `--rounds` times each in ABBA order. Before each drain the
/// previous round's rows are deleted, the events filled in, the table vacuumed and analyzed
/// and a CHECKPOINT taken, so no drain pays for the setup's writes. Returns each drain's rate,
/// the two totals and their ratio (goal ≥ 0.9).
pub(super) async fn history_rounds(
    args: &DrainArgs,
    config: &courier::CourierConfig,
    empty: &TestDb,
    events: &[NewEvent],
) -> anyhow::Result<(Vec<Rate>, Ratio)> {
    let history = TestDb::new().await?;
    insert_history(&history, &events[0].topic, args.history, args.shards).await?;
    let total = events.len() as u64;
    let mut rates = Vec::new();
    let mut seconds = [0.0f64; 2];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_history in order {
            let db = if with_history { &history } else { empty };
            let mut config = config.clone();
            config.database = courier::config::DatabaseConfig {
                pool_size: config.database.pool_size,
                ..db.config.clone()
            };
            let conn = db.client().await?;
            conn.batch_execute(
                "DELETE FROM courier.outbox WHERE aggregate_id NOT LIKE 'history-%'",
            )
            .await
            .context("delete the previous round's rows")?;
            fill(db, &config, events, "rows for the relay").await?;
            conn.batch_execute("CHECKPOINT")
                .await
                .context("checkpoint")?;
            set_shards_idle(db, args.shards, true).await?;
            let rate = relay_drain(db, &config, total, args.timeout_secs).await?;
            seconds[usize::from(with_history)] += rate.seconds;
            let name = if with_history {
                format!(
                    "round {}: relay drain, {} published rows in the table",
                    round + 1,
                    args.history
                )
            } else {
                format!("round {}: relay drain, no history", round + 1)
            };
            rates.push(Rate::new(&name, total, rate.seconds));
        }
    }
    let drained = total * u64::from(args.rounds);
    let without = Rate::new("relay drain, no history (all rounds)", drained, seconds[0]);
    let with = Rate::new(
        &format!("relay drain, {} published rows (all rounds)", args.history),
        drained,
        seconds[1],
    );
    let ratio = Ratio::to_lowest(
        "relay with history / relay without",
        &with,
        &[&without],
        0.9,
    );
    rates.push(without);
    rates.push(with);
    Ok((rates, ratio))
}

/// `count` published rows in one statement (keys `history-…`, apart from the benchmark's),
/// published a day ago, ~200-byte payloads like the events; then VACUUM ANALYZE, as
/// autovacuum would have done to a table that grew this way.
pub(super) async fn insert_history(
    db: &TestDb,
    topic: &str,
    count: u64,
    shards: u32,
) -> anyhow::Result<()> {
    const INSERT: &str = "
        INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                    version, schema_version, payload, occurred_at, created_at,
                                    published_at, publish_attempts)
        SELECT gen_random_uuid(), (i % $3::int)::int, $1, 'video', 'history-' || (i / 100),
               'video.updated', i % 100 + 1, 1, convert_to(repeat('h', 200), 'UTF8'),
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', 1
        FROM generate_series(0::bigint, $2::bigint - 1) i";
    let conn = db.client().await?;
    let started = Instant::now();
    eprintln!("inserting {count} published rows of history…");
    conn.execute(INSERT, &[&topic, &(count as i64), &(shards as i32)])
        .await
        .context("insert the published history")?;
    conn.batch_execute("VACUUM ANALYZE courier.outbox")
        .await
        .context("vacuum the history")?;
    eprintln!(
        "history in place after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
