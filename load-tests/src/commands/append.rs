//! `append`: the write path, 1 business row + 1 event per transaction from several clients,
//! four ways in one run:
//! - a prepared plain INSERT of the outbox row (the database's ceiling, for reference);
//! - `Outbox::append` without wake-ups (the no-notify rate the goal is measured against);
//! - `Outbox::append` while the relay is busy (its shards flagged not idle: no NOTIFY sent);
//! - `Outbox::append` while the relay is idle (every commit sends the wake-up NOTIFY);
//! - `Outbox::append_and_commit` without wake-ups (the COMMIT sent right behind the insert).
//!
//! Waking only idle shards is what keeps the write path near the ceiling under load while an
//! idle relay still hears about the first event at once.
//!
//! `--via sql` measures instead the SQL append producers in other languages call
//! (`courier.append_event`, migrations/courier/0020_sql_append.sql, docs/sql-producers.md)
//! against `Outbox::append`, both with the relay busy (the same idle-flag probe, no NOTIFY),
//! with the machine's CPU per event of each.

use crate::harness::cpu::{CpuMeter, CpuUse};
use crate::harness::fixtures::set_shards_idle;
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier::outbox::{NewEvent, Outbox};
use courier_testkit::{TestDb, TestPubSub};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct AppendArgs {
    /// Concurrent writers, each on its own connection.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// How long each variant runs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    seconds: u64,
    /// Rounds of the three variants, interleaved so drift hits all alike; the best of each counts.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// What to measure: `rust`, the Rust write path's variants; `sql`, the SQL function
    /// `courier.append_event` against `Outbox::append`.
    #[arg(long, value_enum, default_value_t = Via::Rust)]
    via: Via,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Via {
    Rust,
    Sql,
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    PlainInsert,
    NoWakeups,
    RelayBusy,
    RelayIdle,
    PipelinedCommit,
    /// `SELECT courier.append_event(…)`, prepared, relay busy.
    SqlFunction,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::PlainInsert => "prepared plain INSERT (reference)",
            Variant::NoWakeups => "Outbox::append without wake-ups",
            Variant::RelayBusy => "Outbox::append, relay busy (no NOTIFY)",
            Variant::RelayIdle => "Outbox::append, relay idle (NOTIFY each tx)",
            Variant::PipelinedCommit => "Outbox::append_and_commit without wake-ups",
            Variant::SqlFunction => "SQL courier.append_event, relay busy (no NOTIFY)",
        }
    }
}

const PLAIN_INSERT: &str = "
    INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                version, schema_version, payload, attributes, occurred_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
const SQL_APPEND: &str = "SELECT courier.append_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const BUSINESS_ROW: &str = "INSERT INTO public.bench_videos (id, title) VALUES ($1, $2)";

pub async fn run(args: AppendArgs) -> anyhow::Result<Report> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let mut config = courier_testkit::test_config(&db, &pubsub);
    config.relay.shard_count = 8;
    db.pool
        .get()
        .await?
        .batch_execute(
            "CREATE TABLE public.bench_videos (id text PRIMARY KEY, title text NOT NULL)",
        )
        .await
        .context("create the business table")?;
    if args.via == Via::Sql {
        return run_sql(&args, &db, &pubsub, &config).await;
    }
    let variants = [
        Variant::PlainInsert,
        Variant::NoWakeups,
        Variant::RelayBusy,
        Variant::RelayIdle,
        Variant::PipelinedCommit,
    ];
    let mut best = [0.0f64; 5];
    let mut runs: Vec<Rate> = vec![Rate::new("", 0, 0.0); 5];
    for round in 0..args.rounds {
        for (i, variant) in variants.iter().enumerate() {
            set_shards_idle(
                &db,
                config.relay.shard_count,
                *variant == Variant::RelayIdle,
            )
            .await?;
            eprintln!(
                "round {}/{}: {} for {} s",
                round + 1,
                args.rounds,
                variant.name(),
                args.seconds
            );
            let outbox = match variant {
                Variant::NoWakeups | Variant::PipelinedCommit => {
                    Outbox::new(&config).without_wakeups()
                }
                _ => Outbox::new(&config),
            };
            let rate = measure(&Arc::new(outbox), &config, *variant, round, &args).await?;
            if rate.per_second > best[i] {
                best[i] = rate.per_second;
                runs[i] = rate;
            }
        }
    }
    let busy = Ratio::to_lowest("relay busy / no wake-ups", &runs[2], &[&runs[1]], 0.9);
    let idle = Ratio::to_lowest("relay idle / no wake-ups", &runs[3], &[&runs[1]], 0.0);
    let api = Ratio::to_lowest(
        "no wake-ups / prepared plain INSERT",
        &runs[1],
        &[&runs[0]],
        0.0,
    );
    let pipelined = Ratio::to_lowest("COMMIT pipelined / no wake-ups", &runs[4], &[&runs[1]], 0.0);
    Ok(Report {
        benchmark: "append: write path with and without the wake-up NOTIFY".into(),
        parameters: parameters(&args),
        rates: runs,
        ratios: vec![busy, idle, api, pipelined],
        ..Default::default()
    })
}

/// `--via sql`: the SQL function against `Outbox::append`, relay busy for both, rounds
/// interleaved (each round in the other order), the best of each with the machine's CPU per
/// event during it.
async fn run_sql(
    args: &AppendArgs,
    db: &TestDb,
    pubsub: &TestPubSub,
    config: &courier::CourierConfig,
) -> anyhow::Result<Report> {
    let conn = db.pool.get().await?;
    courier::outbox::record_shard_count(&conn, config)
        .await
        .context("record the shard count the SQL function reads")?;
    drop(conn);
    set_shards_idle(db, config.relay.shard_count, false).await?;
    let variants = [Variant::RelayBusy, Variant::SqlFunction];
    let mut runs: Vec<(Rate, Option<CpuUse>)> = vec![(Rate::new("", 0, 0.0), None); 2];
    let outbox = Arc::new(Outbox::new(config));
    for round in 0..args.rounds {
        // Every round appends to tables the rounds before grew: alternating which goes first
        // keeps the larger tables from always falling to the same side.
        let mut order = [0, 1];
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let variant = variants[i];
            eprintln!(
                "round {}/{}: {} for {} s",
                round + 1,
                args.rounds,
                variant.name(),
                args.seconds
            );
            let meter = CpuMeter::start(&pubsub.host);
            let rate = measure(&outbox, config, variant, round, args).await?;
            let cpu = meter.stop();
            if rate.per_second > runs[i].0.per_second {
                runs[i] = (rate, Some(cpu));
            }
        }
    }
    let notes = runs
        .iter()
        .filter_map(|(rate, cpu)| Some(cpu.as_ref()?.describe(&rate.name, rate.events)))
        .collect();
    // Issue 57's goal: a producer in another language appends within 10 % of the Rust path,
    // in events/s and in the machine's CPU per event.
    let cpu_per_event = |(rate, cpu): &(Rate, Option<CpuUse>)| {
        cpu.as_ref().map_or(0.0, |cpu| cpu.per_event(rate.events))
    };
    let (rust_cpu, sql_cpu) = (cpu_per_event(&runs[0]), cpu_per_event(&runs[1]));
    let cpu = if rust_cpu > 0.0 {
        sql_cpu / rust_cpu
    } else {
        0.0
    };
    let cpu = Ratio::at_most(
        "CPU per event: SQL append_event / Outbox::append",
        cpu,
        Some(1.1),
    );
    let rates: Vec<Rate> = runs.into_iter().map(|(rate, _)| rate).collect();
    let rate = Ratio::to_lowest(
        "SQL append_event / Outbox::append",
        &rates[1],
        &[&rates[0]],
        0.9,
    );
    Ok(Report {
        benchmark: "append --via sql: the SQL function against Outbox::append".into(),
        parameters: parameters(args),
        rates,
        ratios: vec![rate, cpu],
        notes,
        ..Default::default()
    })
}

/// What both reports were run with.
fn parameters(args: &AppendArgs) -> Vec<(String, String)> {
    vec![
        ("clients".into(), args.clients.to_string()),
        ("seconds".into(), args.seconds.to_string()),
        ("rounds".into(), args.rounds.to_string()),
        (
            "events_per_transaction".into(),
            "1 (+1 business row)".into(),
        ),
    ]
}

async fn measure(
    outbox: &Arc<Outbox>,
    config: &courier::CourierConfig,
    variant: Variant,
    round: u32,
    args: &AppendArgs,
) -> anyhow::Result<Rate> {
    let mut database = config.database.clone();
    database.pool_size = args.clients.max(2);
    let pool = courier::db::pool(&database, "courier-load append")?;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut writers = Vec::new();
    for client_no in 0..args.clients {
        // A pooled connection, as a service's handler has: appends on it run prepared.
        let mut client = pool.get_owned().await.context("writer connection")?;
        let outbox = outbox.clone();
        let shard_count = config.relay.shard_count;
        writers.push(tokio::spawn(async move {
            let plain = client.prepared(PLAIN_INSERT).await?;
            let sql_append = match variant {
                Variant::SqlFunction => Some(client.prepared(SQL_APPEND).await?),
                _ => None,
            };
            let business = client.prepared(BUSINESS_ROW).await?;
            let mut committed = 0u64;
            while Instant::now() < deadline {
                let key = format!("v{}-{round}-{client_no}-{committed}", variant as u8);
                let event = NewEvent::new(
                    "bench.append",
                    "video",
                    &key,
                    "video.created",
                    1,
                    vec![7u8; 200],
                );
                let tx = client.transaction().await?;
                tx.execute(&business, &[&key, &"a title"]).await?;
                match variant {
                    Variant::PlainInsert => {
                        let shard = i32::try_from(courier::outbox::shard_of(&key, shard_count))?;
                        let attributes = serde_json::json!(event.optional_attributes());
                        tx.execute(
                            &plain,
                            &[
                                &event.event_id,
                                &shard,
                                &event.topic,
                                &event.aggregate_type,
                                &event.aggregate_id,
                                &event.event_type,
                                &event.version,
                                &event.schema_version,
                                &event.payload,
                                &attributes,
                                &event.occurred_at,
                            ],
                        )
                        .await?;
                        tx.commit().await?;
                    }
                    Variant::PipelinedCommit => {
                        outbox.append_and_commit(tx, event).await?;
                    }
                    Variant::SqlFunction => {
                        let statement = sql_append
                            .as_ref()
                            .context("the SQL append is prepared for this variant")?;
                        let attributes = serde_json::json!(event.optional_attributes());
                        tx.execute(
                            statement,
                            &[
                                &event.topic,
                                &event.aggregate_type,
                                &event.aggregate_id,
                                &event.event_type,
                                &event.version,
                                &event.payload,
                                &attributes,
                                &event.schema_version,
                                &event.event_id,
                                &event.occurred_at,
                            ],
                        )
                        .await?;
                        tx.commit().await?;
                    }
                    Variant::NoWakeups | Variant::RelayBusy | Variant::RelayIdle => {
                        outbox.append(&tx, event).await?;
                        tx.commit().await?;
                    }
                }
                committed += 1;
            }
            anyhow::Ok(committed)
        }));
    }
    let mut committed = 0;
    for writer in writers {
        committed += writer.await.context("writer panicked")??;
    }
    Ok(Rate::new(
        variant.name(),
        committed,
        started.elapsed().as_secs_f64(),
    ))
}
