//! `limits`: this machine's raw ceilings, measured now with the client libraries directly (no
//! framework), so every other command can report its result as a ratio to them:
//! - PostgreSQL: outbox-row inserts in 1- and 10-event transactions at several client counts;
//! - the emulator: publish rate with 1,000 ordering keys and without, StreamingPull
//!   receive-and-ack per stream count, and publish → receive latency at a fixed rate.

use crate::harness::cpu::CpuMeter;
use crate::harness::fixtures::{
    poll_until_done, progress, publish_bounded, warm_up_emulator, warm_up_note, WARM_UP_MAX_ROUNDS,
};
use crate::harness::stages::{Stage, WorksOn};
use crate::report::measures::{Latency, Rate};
use crate::report::Report;
use anyhow::Context as _;
use courier::outbox::attributes::{self, RequiredFields};
use courier::pubsub::SubscriptionSpec;
use courier_testkit::{unique_name, TestDb, TestPubSub};
use google_cloud_pubsub::model::Message;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct LimitsArgs {
    /// How long each PostgreSQL insert probe runs.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Client counts for the PostgreSQL probes.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4, 16])]
    pub clients: Vec<u32>,
    /// Messages per emulator publish probe.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(100..=2_000_000))]
    pub messages: u64,
    /// Rounds of the keyed probe's messages published before the publish probes, stopping
    /// early once a round is less than 10 % faster than the one before (0: probe the cold
    /// emulator, whose JVM publishes at a fraction of its warm rate).
    #[arg(long, default_value_t = WARM_UP_MAX_ROUNDS, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub warm_up_rounds: u32,
    /// Stream counts for the receive probes.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    pub streams: Vec<u32>,
    /// Publish rate of the latency probe, messages per second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub latency_rate: u64,
}

pub async fn run(args: LimitsArgs) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    let db = TestDb::new().await?;
    let mut rates = Vec::new();
    for events_per_tx in [1u32, 10] {
        for &clients in &args.clients {
            rates.push(pg_insert_rate(&db, clients, events_per_tx, args.seconds).await?);
        }
    }
    let warm_up = warm_up_emulator(
        &pubsub,
        || keyed_messages(args.messages, Some(1_000)),
        args.messages,
        args.warm_up_rounds,
    )
    .await?;
    rates.push(raw_publish_rate(&pubsub, args.messages, Some(1_000)).await?);
    rates.push(raw_publish_rate(&pubsub, args.messages, None).await?);
    for &streams in &args.streams {
        let count = (args.messages / 4).max(2_000 * u64::from(streams) * 3);
        rates.push(raw_receive_rate(&pubsub, streams, count, 1_000).await?);
    }
    let latency = raw_latency(
        &pubsub,
        args.latency_rate,
        args.seconds,
        Some(100),
        RawHop::Received,
    )
    .await?;
    Ok(Report {
        benchmark: "limits: this machine's raw ceilings (no framework)".into(),
        parameters: vec![
            ("seconds_per_probe".into(), args.seconds.to_string()),
            ("messages_per_probe".into(), args.messages.to_string()),
            ("latency_rate".into(), args.latency_rate.to_string()),
            ("warm_up_rounds".into(), args.warm_up_rounds.to_string()),
        ],
        rates,
        latency: Some(latency),
        notes: vec![warm_up_note(&warm_up, args.messages)],
        ..Default::default()
    })
}

const PLAIN_INSERT: &str = "
    INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                version, schema_version, payload, occurred_at)
    VALUES ($1, 0, 'limits', 'video', $2, 'video.updated', 1, 1, $3, now())";

/// PostgreSQL's write ceiling: `clients` sessions committing transactions of `events_per_tx`
/// prepared outbox-row inserts (no NOTIFY, no framework) for `seconds`. Each transaction is
/// one round trip (BEGIN, the inserts and COMMIT sent together): the best PostgreSQL does for
/// a transaction of this shape, so no client-side trick of the framework's (it pipelines its
/// COMMIT behind the append) can flatter a ratio against it.
pub async fn pg_insert_rate(
    db: &TestDb,
    clients: u32,
    events_per_tx: u32,
    seconds: u64,
) -> anyhow::Result<Rate> {
    let bar = progress(
        seconds,
        &format!("s: PostgreSQL {events_per_tx}-event tx, {clients} clients"),
    );
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..clients {
        let client = db.client().await?;
        writers.push(tokio::spawn(async move {
            let insert = client.prepare(PLAIN_INSERT).await?;
            let payload = vec![7u8; 200];
            let mut committed = 0u64;
            while Instant::now() < deadline {
                let rows: Vec<(uuid::Uuid, String)> = (0..events_per_tx)
                    .map(|_| {
                        let id = uuid::Uuid::now_v7();
                        (id, id.to_string())
                    })
                    .collect();
                let inserts = rows.iter().map(|(id, key)| {
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                        [id, key, &payload];
                    client.execute_raw(&insert, params)
                });
                // `join!` polls in order, and each request goes out on its first poll.
                let (begun, inserted, committed_tx) = futures::join!(
                    client.batch_execute("BEGIN"),
                    futures::future::join_all(inserts),
                    client.batch_execute("COMMIT")
                );
                begun?;
                for result in inserted {
                    result?;
                }
                committed_tx?;
                committed += u64::from(events_per_tx);
            }
            anyhow::Ok(committed)
        }));
    }
    let ticker = {
        let bar = bar.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                bar.inc(1);
            }
        })
    };
    let mut committed = 0;
    for writer in writers {
        committed += writer.await.context("insert client panicked")??;
    }
    ticker.abort();
    bar.finish_and_clear();
    Ok(Rate::new(
        &format!("PostgreSQL raw insert, {events_per_tx}-event tx, {clients} clients"),
        committed,
        started.elapsed().as_secs_f64(),
    ))
}

/// Attributes as the framework sends them, for messages published around it.
pub(crate) fn message(key: &str, version: i64, data: Vec<u8>) -> Message {
    Message::new()
        .set_data(data)
        .set_attributes(attributes::build(
            RequiredFields {
                event_id: uuid::Uuid::now_v7(),
                event_type: "video.updated",
                aggregate_id: key,
                aggregate_type: "video",
                version,
                occurred_at: chrono::Utc::now(),
                schema_version: 1,
            },
            [],
        ))
}

/// Publishes `count` ~200-byte messages round-robin over `keys` ordering keys (`None`: no
/// ordering key), keeping at most 10,000 unacknowledged; returns the rate.
pub async fn publish_messages(
    pubsub: &TestPubSub,
    topic: &str,
    count: u64,
    keys: Option<u64>,
    what: &str,
) -> anyhow::Result<Rate> {
    let publisher = pubsub
        .client()
        .publisher(topic, courier::operations::CLIENT_BATCH_DELAY)
        .await?;
    let started = Instant::now();
    publish_bounded(&publisher, keyed_messages(count, keys), count, 10_000, what).await?;
    Ok(Rate::new(what, count, started.elapsed().as_secs_f64()))
}

/// `count` ~200-byte messages round-robin over `keys` ordering keys (`None`: no ordering key).
fn keyed_messages(count: u64, keys: Option<u64>) -> impl Iterator<Item = Message> {
    (0..count).map(move |i| {
        let key_no = keys.map_or(i, |k| i % k);
        let key = format!("video-{key_no:06}");
        let version = keys.map_or(1, |k| i64::try_from(i / k).unwrap_or(i64::MAX - 1) + 1);
        let m = message(&key, version, vec![b'x'; 200]);
        if keys.is_some() {
            m.set_ordering_key(key)
        } else {
            m
        }
    })
}

/// The emulator's publish ceiling through the official client.
pub async fn raw_publish_rate(
    pubsub: &TestPubSub,
    count: u64,
    keys: Option<u64>,
) -> anyhow::Result<Rate> {
    let topic = pubsub.topic("limits.publish").await?;
    let what = match keys {
        Some(k) => format!("emulator raw publish, {k} ordering keys"),
        None => "emulator raw publish, no ordering keys".into(),
    };
    publish_messages(pubsub, &topic, count, keys, &what).await
}

/// The emulator's receive ceiling: a backlog of `count` messages over `keys` keys on an
/// ordered subscription, drained by `streams` bare streams that ack on receipt.
pub async fn raw_receive_rate(
    pubsub: &TestPubSub,
    streams: u32,
    count: u64,
    keys: u64,
) -> anyhow::Result<Rate> {
    Ok(raw_receive_rate_metered(pubsub, streams, count, keys)
        .await?
        .0)
}

/// [`raw_receive_rate`], with what publishing the backlog and receiving it cost the machine.
pub async fn raw_receive_rate_metered(
    pubsub: &TestPubSub,
    streams: u32,
    count: u64,
    keys: u64,
) -> anyhow::Result<(Rate, [Stage; 2])> {
    let topic = pubsub.topic("limits.receive").await?;
    let subscription = unordered_or_ordered(pubsub, &topic, true).await?;
    let meter = CpuMeter::start(&pubsub.host);
    publish_messages(
        pubsub,
        &topic,
        count,
        Some(keys),
        "published (receive backlog)",
    )
    .await?;
    let publish = Stage {
        name: format!("raw publish ({keys} keys)"),
        events: count,
        cpu: meter.stop(),
        works_on: WorksOn::Broker,
    };
    let meter = CpuMeter::start(&pubsub.host);
    let rate = raw_receive(pubsub, &subscription, streams, count, 600).await?;
    let receive = Stage {
        name: format!("raw receive+ack ({streams} streams)"),
        events: rate.events,
        cpu: meter.stop(),
        works_on: WorksOn::Broker,
    };
    Ok((rate, [publish, receive]))
}

async fn unordered_or_ordered(
    pubsub: &TestPubSub,
    topic: &str,
    ordering: bool,
) -> anyhow::Result<String> {
    let spec = SubscriptionSpec {
        ordering,
        retain_acked: false,
        ..SubscriptionSpec::plain(&unique_name(&format!("{topic}.raw")), topic)
    };
    pubsub.client().provision(&spec).await?;
    Ok(spec.name)
}

/// `streams` bare streams on `subscription` that ack every message on receipt, until `total`
/// arrived.
pub async fn raw_receive(
    pubsub: &TestPubSub,
    subscription: &str,
    streams: u32,
    total: u64,
    timeout_secs: u64,
) -> anyhow::Result<Rate> {
    let client = pubsub.client();
    let subscriber = Arc::new(client.subscriber().await?);
    let received = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    for _ in 0..streams {
        let mut stream = subscriber
            .subscribe(client.subscription_path(subscription))
            .build();
        let received = received.clone();
        // Left running when the count is reached: cancelling a stream mid-`next()` strands
        // messages in the emulator, and the subscription is not used again.
        tokio::spawn(async move {
            while let Some(Ok((_message, handler))) = stream.next().await {
                handler.ack();
                received.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let received_so_far = &received;
    let seconds = poll_until_done(
        started,
        total,
        &format!("received and acked (raw, {streams} streams)"),
        Duration::from_secs(timeout_secs),
        Duration::from_millis(20),
        || async move { Ok(received_so_far.load(Ordering::Relaxed)) },
    )
    .await?;
    Ok(Rate::new(
        &format!("emulator raw receive+ack ({streams} streams)"),
        received.load(Ordering::Relaxed),
        seconds,
    ))
}

/// Where the emulator's own latency is measured to: what the pipeline's measured hop ends with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RawHop {
    /// A subscriber's receipt (end to end runs: their hop ends at the projection).
    Received,
    /// The broker's acknowledgement of the publish (relay-only runs: their hop ends when the
    /// row is marked, after the acknowledgement; no subscription reads their topic).
    Acknowledged,
}

impl RawHop {
    /// Where the hop ends, as the reports name it ("publish → …").
    pub fn end(self) -> &'static str {
        match self {
            RawHop::Received => "receive",
            RawHop::Acknowledged => "acknowledged",
        }
    }
}

/// The emulator's own latency at `rate` messages per second for `seconds`, round-robin over
/// `keys` ordering keys (`None`: a new key per message): publish → receive on an ordered
/// subscription with one stream, or publish → acknowledged with no subscription. Each message
/// counts from the instant it was due to be published, so a stalled publisher counts against
/// the latency.
pub async fn raw_latency(
    pubsub: &TestPubSub,
    rate: u64,
    seconds: u64,
    keys: Option<u64>,
    hop: RawHop,
) -> anyhow::Result<Latency> {
    let topic = pubsub.topic("limits.latency").await?;
    let client = pubsub.client();
    let origin = Instant::now();
    let total = rate * seconds;
    // Room for every probe: the acknowledged mode's tasks send before anything reads, and the
    // publish loop waits for them (a smaller bound would hang a run of more probes).
    let capacity = usize::try_from(total)
        .unwrap_or(usize::MAX)
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(capacity);
    if hop == RawHop::Received {
        let subscription = unordered_or_ordered(pubsub, &topic, true).await?;
        let subscriber = client.subscriber().await?;
        let mut stream = subscriber
            .subscribe(client.subscription_path(&subscription))
            .build();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(Ok((message, handler))) = stream.next().await {
                handler.ack();
                let arrived = origin.elapsed().as_micros() as u64;
                let due: u64 = message
                    .attributes
                    .get("due_micros")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(arrived);
                if tx.send(arrived.saturating_sub(due)).await.is_err() {
                    break;
                }
            }
        });
    }
    let publisher = client
        .publisher(&topic, courier::operations::CLIENT_BATCH_DELAY)
        .await?;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let bar = progress(total, &format!("latency probe at {rate}/s"));
    let mut pending = Vec::new();
    for i in 0..total {
        let due = interval * u32::try_from(i).unwrap_or(u32::MAX);
        tokio::time::sleep_until((origin + due).into()).await;
        let key = match keys {
            Some(keys) => format!("video-{:06}", i % keys.max(1)),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let mut attributes = std::collections::HashMap::new();
        attributes.insert("due_micros".to_string(), due.as_micros().to_string());
        let m = Message::new()
            .set_data(vec![b'x'; 200])
            .set_ordering_key(key)
            .set_attributes(attributes);
        // Awaited in a task of its own, so the acknowledgement's instant is when it came.
        let published = publisher.publish(m);
        let acknowledged = (hop == RawHop::Acknowledged).then(|| tx.clone());
        pending.push(tokio::spawn(async move {
            published.await?;
            if let Some(tx) = acknowledged {
                let micros = origin.elapsed().as_micros() as u64;
                let _ = tx.send(micros.saturating_sub(due.as_micros() as u64)).await;
            }
            anyhow::Ok(())
        }));
        bar.inc(1);
    }
    drop(tx);
    for result in futures::future::join_all(pending).await {
        result
            .context("latency probe publish task")?
            .context("latency probe publish")?;
    }
    bar.finish_and_clear();
    let mut histogram = crate::report::measures::new_histogram();
    let deadline = Instant::now() + Duration::from_secs(60);
    while histogram.len() < total {
        let remaining = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(
            !remaining.is_zero(),
            "latency probe: {} of {total} arrived within 60 s",
            histogram.len()
        );
        match tokio::time::timeout(remaining, rx.recv()).await {
            Ok(Some(micros)) => histogram.saturating_record(micros),
            _ => anyhow::bail!("latency probe: the receiving stream ended"),
        }
    }
    Ok(Latency::from_histogram(
        &format!("emulator raw publish → {} at {rate}/s", hop.end()),
        &histogram,
    ))
}
