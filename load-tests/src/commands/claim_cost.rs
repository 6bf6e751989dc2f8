//! `claim-cost`: what rows parked for a retry cost the claim. Goal (issue 20): with 50,000
//! rows parked for retry, claiming the others costs within 2x of an outbox with none.
//!
//! Two outboxes in one run, with the same fresh rows; one also holds `--parked` rows, each of
//! its own key, waiting an hour for their retry and appended before the fresh ones, so a claim
//! in append order meets them first. The relay's own statements (claim, then mark published;
//! no publishing) drain the fresh rows of each outbox `--rounds` times, alternating which goes
//! first; the report gives the cost per claimed row of both and their ratio, and the shared
//! buffers one claim touches in each (the same work counted without a clock).

use crate::harness::fixtures::{events, fill};
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier::operations::{OutboxStore, PublishedRow};
use courier::CourierConfig;
use courier_testkit::TestDb;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(clap::Args)]
pub struct ClaimCostArgs {
    /// Rows parked for a retry, each of its own key, in the second outbox.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    parked: u64,
    /// Fresh rows drained from each outbox per round.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    fresh: u64,
    /// Outbox shards: the parked rows are spread over them, so 1 is the hardest case.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    shards: u32,
    /// Rows per claim (the relay's default).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    /// Drains of each outbox, alternating which goes first so drift hits both alike.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
}

/// Keys of the fresh rows (each key has `fresh / FRESH_KEYS` versions).
const FRESH_KEYS: u64 = 1_000;
/// The lease the claims take (the relay's default); nothing expires during a drain.
const LEASE: Duration = Duration::from_secs(30);
/// The store's candidate window per claimed row (`CLAIM_WINDOW_FACTOR` in store.rs), for the
/// claim run under EXPLAIN.
const CLAIM_WINDOW_FACTOR: i64 = 4;

/// Time spent by one outbox's drains.
#[derive(Default)]
struct Spent {
    rows: u64,
    claim: Duration,
    mark: Duration,
}

impl Spent {
    fn micros_per_row(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.rows.max(1) as f64
    }
}

pub async fn run(args: ClaimCostArgs) -> anyhow::Result<Report> {
    let none = TestDb::new().await?;
    let parked = TestDb::new().await?;
    park(&parked, args.parked, args.shards).await?;
    let fresh = events("t.events", args.fresh, FRESH_KEYS.min(args.fresh));
    let mut spent = [Spent::default(), Spent::default()];
    let mut buffers = [0i64; 2];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let db = if i == 0 { &none } else { &parked };
            let mut config = CourierConfig::default();
            config.database = db.config.clone();
            config.relay.shard_count = args.shards;
            let conn = db.client().await?;
            conn.batch_execute("DELETE FROM courier.outbox WHERE published_at IS NOT NULL")
                .await
                .context("delete the previous round's rows")?;
            fill(db, &config, &fresh, "fresh rows").await?;
            conn.batch_execute("CHECKPOINT")
                .await
                .context("checkpoint")?;
            if round == 0 {
                buffers[i] = claim_buffers(&conn, args.batch).await?;
            }
            eprintln!(
                "round {}/{}: draining {} fresh rows, {} parked",
                round + 1,
                args.rounds,
                args.fresh,
                if i == 0 { 0 } else { args.parked }
            );
            drain(db, &config, args.batch, &mut spent[i]).await?;
            anyhow::ensure!(
                spent[i].rows == args.fresh * u64::from(round + 1),
                "drained {} rows, expected {}",
                spent[i].rows,
                args.fresh * u64::from(round + 1)
            );
        }
    }
    let name = |i: usize, what: &str| {
        let parked = if i == 0 { 0 } else { args.parked };
        format!("{what}, {parked} parked")
    };
    let rates: Vec<Rate> = (0..2)
        .map(|i| {
            let s = &spent[i];
            Rate::new(
                &name(i, "claim, then mark"),
                s.rows,
                (s.claim + s.mark).as_secs_f64(),
            )
        })
        .collect();
    let cost = |i: usize| spent[i].micros_per_row(spent[i].claim + spent[i].mark);
    let claim = |i: usize| spent[i].micros_per_row(spent[i].claim);
    let ratios = vec![
        Ratio::at_most(
            format!("cost per row, {} parked / none", args.parked),
            cost(1) / cost(0),
            Some(2.0),
        ),
        Ratio::at_most("claim alone, parked / none", claim(1) / claim(0), None),
        Ratio::at_most(
            "buffers per claim, parked / none",
            buffers[1] as f64 / buffers[0].max(1) as f64,
            None,
        ),
    ];
    let notes = (0..2)
        .map(|i| {
            format!(
                "{}: {:.1} µs per claimed row (claim {:.1}, mark {:.1}); one claim of {} rows \
                 touched {} shared buffers",
                name(i, "outbox"),
                cost(i),
                claim(i),
                spent[i].micros_per_row(spent[i].mark),
                args.batch,
                buffers[i]
            )
        })
        .collect();
    Ok(Report {
        benchmark: "claim-cost: claiming fresh rows with and without rows parked for retry".into(),
        parameters: vec![
            ("parked".into(), args.parked.to_string()),
            ("fresh".into(), args.fresh.to_string()),
            ("shards".into(), args.shards.to_string()),
            ("batch".into(), args.batch.to_string()),
            ("rounds".into(), args.rounds.to_string()),
        ],
        rates,
        ratios,
        notes,
        ..Default::default()
    })
}

/// `count` rows of distinct keys, spread over `shards`, that failed once and retry in an hour:
/// one statement, then VACUUM ANALYZE, as autovacuum would have done by then.
async fn park(db: &TestDb, count: u64, shards: u32) -> anyhow::Result<()> {
    const INSERT: &str = "
        INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                    version, schema_version, payload, occurred_at,
                                    publish_attempts, next_retry_at, last_error)
        SELECT gen_random_uuid(), (i % $2::int)::int, 't.events', 'video', 'parked-' || i,
               'video.updated', 1, 1, convert_to(repeat('p', 200), 'UTF8'), now(),
               1, now() + interval '1 hour', 'unavailable'
        FROM generate_series(0::bigint, $1::bigint - 1) i";
    let conn = db.client().await?;
    conn.execute(INSERT, &[&(count as i64), &(shards as i32)])
        .await
        .context("insert the parked rows")?;
    conn.batch_execute("VACUUM ANALYZE courier.outbox")
        .await
        .context("vacuum the parked rows")?;
    Ok(())
}

/// Claims, then marks published, shard after shard until every shard is empty, as one
/// claimer per shard would (without publishing); adds the time of each statement to `spent`.
async fn drain(
    db: &TestDb,
    config: &CourierConfig,
    batch: u32,
    spent: &mut Spent,
) -> anyhow::Result<()> {
    let store = OutboxStore::new(db.pool.clone(), &db.config.schema);
    let token = Uuid::new_v4();
    let mut busy: Vec<u32> = (0..config.relay.shard_count).collect();
    while !busy.is_empty() {
        let mut still_busy = Vec::with_capacity(busy.len());
        for shard in busy {
            let started = Instant::now();
            let rows = store.claim(shard, token, LEASE, batch).await?;
            spent.claim += started.elapsed();
            if rows.is_empty() {
                continue;
            }
            let published: Vec<_> = rows
                .iter()
                .map(|r| PublishedRow::acked_now(r.address))
                .collect();
            let started = Instant::now();
            spent.rows += store.mark_published(&published, token).await?;
            spent.mark += started.elapsed();
            still_busy.push(shard);
        }
        busy = still_busy;
    }
    Ok(())
}

/// Shared buffers (hit + read) one claim of `batch` rows in shard 0 touches, from
/// `EXPLAIN (ANALYZE, BUFFERS)` of the relay's claim statement, rolled back.
async fn claim_buffers(conn: &tokio_postgres::Client, batch: u32) -> anyhow::Result<i64> {
    let claim = courier::operations::claim_statement("courier");
    conn.batch_execute("BEGIN").await?;
    let explained = conn
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim}"),
            &[
                &0i32,
                &Uuid::new_v4(),
                &LEASE.as_secs_f64(),
                &i64::from(batch),
                &(i64::from(batch) * CLAIM_WINDOW_FACTOR),
                // From the shard's start, as `OutboxStore::claim` looks.
                &0i64,
            ],
        )
        .await
        .context("explain the claim");
    conn.batch_execute("ROLLBACK").await?;
    let explained: serde_json::Value = explained?.get(0);
    let plan = &explained[0]["Plan"];
    let blocks = |name: &str| plan[name].as_i64().unwrap_or(0);
    Ok(blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"))
}
