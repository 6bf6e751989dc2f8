//! `project`: how fast the read side turns a subscription backlog into a committed projection,
//! against the emulator's raw receive-and-ack rate measured in the same run with a bare
//! subscriber on the same number of streams (the emulator paces each stream).
//!
//! Per round, one topic and two identical ordered subscriptions created before the backlog is
//! published: one is drained by bare streams that ack everything, the other by a Courier
//! consumer whose projection applies every event with a versioned upsert, as the shipped
//! projections do. Rounds alternate which drains first (AB, BA, …) so drift of the emulator
//! or the machine falls on both alike, after the emulator's JVM was warmed up by receive
//! rounds until a round is less than 10 % faster than the one before.

use crate::harness::fixtures::{poll_until_done, publish_bounded};
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier::db::PgTransaction;
use courier::inbound::{
    Consumer, ConsumerOptions, ConsumerSpec, EventMeta, HandlerError, Projection, VersionedUpsert,
};
use courier::pubsub::SubscriptionSpec;
use courier_testkit::{test_config, unique_name, TestDb, TestPubSub};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct ProjectArgs {
    /// Events pre-published to the topic.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=2_000_000))]
    events: u64,
    /// Aggregates (ordering keys) they are spread over.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    keys: u64,
    /// StreamingPull streams, for the consumer and the bare subscriber alike (default: the
    /// framework's default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    streams: Option<u32>,
    /// Flow control: messages each stream may hold unacked (default: the framework's
    /// default). More outstanding means more events of one aggregate waiting together, so
    /// larger transactions.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_outstanding: Option<u32>,
    /// Events of one aggregate per transaction (default: the framework's default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    events_per_transaction: Option<u32>,
    /// Pooled connections, i.e. projection transactions at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=256))]
    pool_size: u32,
    /// Give up on either drain after this long.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Rounds, alternating which side drains first.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10))]
    rounds: u32,
    /// Most warm-up receive rounds (of a tenth of --events) before measuring; 0: none.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=20))]
    warm_up_rounds: u32,
    /// Exactly-once subscriptions: the consumer confirms every ack (the bare subscriber acks
    /// as usual). The emulator accepts the setting without enforcing it, so this measures the
    /// client side's cost only.
    #[arg(long)]
    exactly_once: bool,
}

/// The benchmark's payload.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Change {
    #[prost(string, tag = "1")]
    pub title: String,
}

/// `bench.videos` through the versioned upsert, one statement per event (the trait's default
/// `apply_group` applies each event of a group, as catalog's and engagement's projections do).
struct BenchVideos {
    upsert: VersionedUpsert,
}

impl Projection for BenchVideos {
    type Event = Change;

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Change,
    ) -> Result<(), HandlerError> {
        self.upsert
            .execute(tx, &[&meta.aggregate_id, &event.title], meta.version)
            .await?;
        Ok(())
    }
}

pub async fn run(args: ProjectArgs) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    let template = TestDb::new().await?;
    let mut config = test_config(&template, &pubsub);
    drop(template);
    config.database.pool_size = args.pool_size;
    if let Some(streams) = args.streams {
        config.consumer.streams = streams;
    }
    if let Some(n) = args.max_outstanding {
        config.consumer.max_outstanding_messages = n;
    }
    if let Some(n) = args.events_per_transaction {
        config.consumer.max_events_per_transaction = n;
    }
    let streams = config.consumer.streams;
    let warm_up = warm_up_receive(&pubsub, &args, streams).await?;

    let mut rates = Vec::new();
    let mut seconds = [0.0f64; 2];
    let mut duplicates = 0;
    for round in 0..args.rounds {
        let (raw, projected) = provision_round(&pubsub, &args).await?;
        let order = if round % 2 == 0 {
            [Side::Raw, Side::Projection]
        } else {
            [Side::Projection, Side::Raw]
        };
        for side in order {
            let rate = match side {
                Side::Raw => {
                    crate::commands::limits::raw_receive(
                        &pubsub,
                        &raw,
                        streams,
                        args.events,
                        args.timeout_secs,
                    )
                    .await?
                }
                Side::Projection => {
                    let (rate, redelivered) = project(&pubsub, &config, &args, &projected).await?;
                    duplicates += redelivered;
                    rate
                }
            };
            seconds[side as usize] += rate.seconds;
            rates.push(Rate::new(
                &format!("round {}: {}", round + 1, rate.name),
                rate.events,
                rate.seconds,
            ));
        }
    }
    let drained = args.events * u64::from(args.rounds);
    let raw_rate = Rate::new(
        &format!("emulator raw receive+ack ({streams} streams, all rounds)"),
        drained,
        seconds[Side::Raw as usize],
    );
    let projected_rate = Rate::new(
        "projection, committed and acked (all rounds)",
        drained,
        seconds[Side::Projection as usize],
    );
    let ratio = Ratio::to_lowest(
        "projection / raw receive",
        &projected_rate,
        &[&raw_rate],
        0.9,
    );
    rates.push(raw_rate);
    rates.push(projected_rate);
    Ok(Report {
        benchmark: "project: consumer vs raw receive-and-ack".into(),
        parameters: vec![
            ("events".into(), args.events.to_string()),
            ("keys".into(), args.keys.to_string()),
            ("streams".into(), streams.to_string()),
            ("rounds".into(), args.rounds.to_string()),
            (
                "events_per_transaction".into(),
                config.consumer.max_events_per_transaction.to_string(),
            ),
            (
                "max_outstanding".into(),
                config.consumer.max_outstanding_messages.to_string(),
            ),
            ("pool_size".into(), args.pool_size.to_string()),
            ("exactly_once".into(), args.exactly_once.to_string()),
            ("redelivered_duplicates".into(), duplicates.to_string()),
        ],
        rates,
        ratios: vec![ratio],
        notes: vec![format!(
            "emulator warmed up before measuring: receive rounds at {}",
            warm_up
                .iter()
                .map(|r| format!("{r:.0}/s"))
                .collect::<Vec<_>>()
                .join(", ")
        )],
        ..Default::default()
    })
}

/// The two sides of a round, in the order `seconds` keeps them.
#[derive(Debug, Clone, Copy)]
enum Side {
    Raw = 0,
    Projection = 1,
}

/// A topic with the raw and the projected subscription, then the backlog published to it.
/// Returns the two subscriptions.
async fn provision_round(
    pubsub: &TestPubSub,
    args: &ProjectArgs,
) -> anyhow::Result<(String, SubscriptionSpec)> {
    let topic = unique_name("bench.project");
    let mut projected = SubscriptionSpec::standard(&topic, "bench", "projector");
    // The backlog is read once; retaining it would only grow the emulator's heap.
    projected.retain_acked = false;
    projected.exactly_once = args.exactly_once;
    let raw = SubscriptionSpec {
        name: format!("{topic}.bench-raw"),
        dead_letter: None,
        ..projected.clone()
    };
    let client = pubsub.client();
    client.provision(&projected).await?;
    client.provision(&raw).await?;
    publish_backlog(pubsub, &topic, args.events, args.keys).await?;
    Ok((raw.name, projected))
}

/// Receive rounds of a tenth of the backlog on a scratch subscription until a round is less
/// than 10 % faster than the one before; returns each round's rate.
async fn warm_up_receive(
    pubsub: &TestPubSub,
    args: &ProjectArgs,
    streams: u32,
) -> anyhow::Result<Vec<f64>> {
    let mut rates = Vec::new();
    let count = (args.events / 10).max(1_000);
    for _ in 0..args.warm_up_rounds {
        let rate =
            crate::commands::limits::raw_receive_rate(pubsub, streams, count, args.keys).await?;
        rates.push(rate.per_second);
        if crate::harness::fixtures::plateaued(&rates) {
            break;
        }
    }
    Ok(rates)
}

/// A fresh database and a Courier consumer on `projected` until the backlog is committed and
/// acked; returns the rate and how many redelivered duplicates the inbox absorbed.
async fn project(
    pubsub: &TestPubSub,
    config: &courier::CourierConfig,
    args: &ProjectArgs,
    projected: &SubscriptionSpec,
) -> anyhow::Result<(Rate, u64)> {
    let db = TestDb::new().await?;
    db.client()
        .await?
        .batch_execute(
            "CREATE SCHEMA bench;
             CREATE TABLE bench.videos (video_id text PRIMARY KEY, title text NOT NULL,
                                        version bigint NOT NULL);",
        )
        .await
        .context("create the benchmark's read model")?;
    let mut config = config.clone();
    config.database = courier::config::DatabaseConfig {
        pool_size: config.database.pool_size,
        ..db.config.clone()
    };
    config.pubsub = pubsub.config();
    let dead_letter_topic = projected
        .dead_letter
        .as_ref()
        .map(|d| d.topic.clone())
        .context("the standard subscription has a dead-letter topic")?;
    let projection = BenchVideos {
        upsert: VersionedUpsert::new("bench.videos", &["video_id"], &["title"])
            .map_err(anyhow::Error::msg)?,
    };
    let started = Instant::now();
    let consumer = Consumer::spawn(
        &config,
        ConsumerSpec {
            group: "bench".into(),
            subscription: projected.name.clone(),
            dead_letter_topic,
        },
        projection,
        ConsumerOptions::default(),
    )?;
    let consumer_ref = &consumer;
    let seconds = poll_until_done(
        started,
        args.events,
        "projected (committed and acked)",
        Duration::from_secs(args.timeout_secs),
        Duration::from_millis(50),
        || async move {
            let stats = consumer_ref.stats();
            anyhow::ensure!(
                stats.dead_lettered == 0,
                "{} events were dead-lettered; see the log",
                stats.dead_lettered
            );
            Ok(stats.applied)
        },
    )
    .await?;
    let stats = consumer.stats();
    consumer.kill();
    Ok((
        Rate::new("projection (committed and acked)", stats.applied, seconds),
        stats.duplicates,
    ))
}

/// Publishes `count` events round-robin over `keys` ordering keys, with the framework's
/// attributes, keeping at most 10,000 unacknowledged.
async fn publish_backlog(
    pubsub: &TestPubSub,
    topic: &str,
    count: u64,
    keys: u64,
) -> anyhow::Result<()> {
    let publisher = pubsub
        .client()
        .publisher(topic, courier::operations::CLIENT_BATCH_DELAY)
        .await?;
    let messages = (0..count).map(|i| {
        let key = format!("video-{:06}", i % keys);
        let version = i64::try_from(i / keys).unwrap_or(i64::MAX - 1) + 1;
        let data = prost::Message::encode_to_vec(&Change {
            title: format!("{key} at {version} {}", "x".repeat(160)),
        });
        crate::commands::limits::message(&key, version, data).set_ordering_key(key)
    });
    publish_bounded(&publisher, messages, count, 10_000, "published (backlog)").await?;
    Ok(())
}
