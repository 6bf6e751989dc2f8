//! `courier verify`: a deployment's write side checked end to end, e.g. after a deploy or a
//! database or Pub/Sub change (`scripts/demo` shows whole services; this needs only the
//! config).
//!
//! Migrates the framework schema, provisions a topic and a fresh ordered subscription, starts
//! a relay (the deployment's own relays may publish some of the rows instead: shards are
//! leased, and any relay that owns one publishes its rows), appends events for many
//! aggregates through the outbox (several per transaction), and watches the subscription
//! until every event arrived. It fails if one is missing or a key's versions arrive out of
//! order; duplicates are allowed (at-least-once) and counted. It deletes its subscription
//! and keeps the topic, so it needs the right to create both.

use anyhow::Context as _;
use courier::outbox::{NewEvent, Outbox};
use courier::pubsub::{PubSub, SubscriptionSpec};
use courier::relay::{Relay, RelayOptions};
use courier::CourierConfig;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(clap::Args, Clone)]
pub struct VerifyArgs {
    /// Events to append in total.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    events: u32,
    /// Aggregates (ordering keys) the events are spread over.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    keys: u32,
    /// Events per committed transaction.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    per_transaction: u32,
    /// Topic the check publishes to (created if missing).
    #[arg(long, default_value = "courier.verify.events")]
    topic: String,
    /// Give up waiting for arrivals after this long.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
}

/// One arrival seen on the subscription.
struct Arrival {
    key: String,
    version: i64,
    event_id: String,
    latency: Option<Duration>,
}

pub async fn run(config: CourierConfig, args: VerifyArgs) -> anyhow::Result<()> {
    courier::outbox::check_topic_id(&args.topic)
        .map_err(|reason| anyhow::anyhow!("--topic {:?}: {reason}", args.topic))?;
    println!(
        "{}",
        crate::describe(&config, &crate::migrate(&config).await?)
    );

    let pubsub = PubSub::new(config.pubsub.clone());
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let subscription = format!("{}.verify-{run_id}", args.topic);
    provision(&pubsub, &args.topic, &subscription).await?;
    println!(
        "watching {subscription} (ordered) on project {}",
        pubsub.project()
    );
    let mut arrivals = watch(&pubsub, &subscription).await?;

    let relay = Relay::spawn(&config, RelayOptions::default()).context("start the relay")?;
    let started = Instant::now();
    let bars = MultiProgress::new();
    let append_bar = bars.add(progress(u64::from(args.events), "appended"));
    let writer = tokio::spawn(append_events(
        config.clone(),
        run_id,
        args.clone(),
        append_bar,
    ));

    let expected = args.events as usize;
    let bar = bars.add(progress(expected as u64, "arrived"));
    let mut seen = HashSet::new();
    let mut last_version: HashMap<String, i64> = HashMap::new();
    let mut out_of_order = Vec::new();
    let mut duplicates = 0usize;
    let mut latencies = Vec::with_capacity(expected);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout_secs);
    while seen.len() < expected {
        let arrival = match tokio::time::timeout_at(deadline, arrivals.recv()).await {
            Ok(Some(arrival)) => arrival,
            Ok(None) => anyhow::bail!("the subscription stream ended early"),
            Err(_) => break,
        };
        if !seen.insert(arrival.event_id) {
            duplicates += 1;
            continue;
        }
        let last = last_version.entry(arrival.key.clone()).or_insert(0);
        if arrival.version != *last + 1 {
            out_of_order.push(format!(
                "{}: v{} after v{}",
                arrival.key, arrival.version, last
            ));
        }
        *last = (*last).max(arrival.version);
        latencies.extend(arrival.latency);
        bar.inc(1);
    }
    bar.finish();
    let elapsed = started.elapsed();
    let appended = writer.await.context("the writer task panicked")??;
    relay.shutdown(Duration::from_secs(5)).await;
    delete_subscription(&pubsub, &subscription).await;

    latencies.sort();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .map_or("-".to_string(), |d| format!("{} ms", d.as_millis()))
    };
    println!(
        "appended {appended} events over {} keys; {} arrived in {:.1} s ({:.0} events/s), {duplicates} duplicate deliveries",
        args.keys,
        seen.len(),
        elapsed.as_secs_f64(),
        seen.len() as f64 / elapsed.as_secs_f64()
    );
    println!(
        "commit → arrival latency: p50 {}, p99 {}",
        percentile(0.50),
        percentile(0.99)
    );
    anyhow::ensure!(
        out_of_order.is_empty(),
        "{} arrivals out of version order, first: {}",
        out_of_order.len(),
        out_of_order[0]
    );
    anyhow::ensure!(
        seen.len() == expected,
        "only {} of {expected} events arrived within {} s",
        seen.len(),
        args.timeout_secs
    );
    println!("every event arrived, each key in version order");
    Ok(())
}

async fn provision(pubsub: &PubSub, topic: &str, subscription: &str) -> anyhow::Result<()> {
    let created = pubsub
        .ensure_topic(&pubsub.topic_admin().await?, topic)
        .await?;
    println!(
        "topic {topic}: {}",
        if created { "created" } else { "exists" }
    );
    pubsub
        .ensure_subscription(
            &pubsub.subscription_admin().await?,
            &SubscriptionSpec::plain(subscription, topic),
        )
        .await?;
    Ok(())
}

/// Best effort: the check's subscription is of no use after the run.
async fn delete_subscription(pubsub: &PubSub, subscription: &str) {
    let result = async {
        pubsub
            .subscription_admin()
            .await?
            .delete_subscription()
            .set_subscription(pubsub.subscription_path(subscription))
            .send()
            .await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(
            subscription,
            "could not delete the check's subscription: {e:#}"
        );
    }
}

/// Receives and acks on one long-lived stream (never cancelled: see docs/emulator.md), forwarding
/// what arrives. The channel is bounded, so a slow reader slows the stream.
async fn watch(pubsub: &PubSub, subscription: &str) -> anyhow::Result<mpsc::Receiver<Arrival>> {
    let subscriber = pubsub.subscriber().await?;
    let mut stream = subscriber
        .subscribe(pubsub.subscription_path(subscription))
        .build();
    let (tx, rx) = mpsc::channel(1_024);
    tokio::spawn(async move {
        let _subscriber = subscriber;
        while let Some(item) = stream.next().await {
            let (message, handler) = match item {
                Ok(received) => received,
                Err(e) => {
                    tracing::error!("subscription stream failed: {e}");
                    return;
                }
            };
            let attribute = |name: &str| message.attributes.get(name).cloned().unwrap_or_default();
            let latency = chrono::DateTime::parse_from_rfc3339(&attribute("occurred_at"))
                .ok()
                .and_then(|at| (chrono::Utc::now() - at.to_utc()).to_std().ok());
            let arrival = Arrival {
                key: message.ordering_key.clone(),
                version: attribute("version").parse().unwrap_or(-1),
                event_id: attribute("event_id"),
                latency,
            };
            handler.ack();
            if tx.send(arrival).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Appends `events` round-robin over `keys` aggregates, `per_transaction` per commit, so each
/// key's versions are written in order across many transactions.
async fn append_events(
    config: CourierConfig,
    run_id: String,
    args: VerifyArgs,
    bar: ProgressBar,
) -> anyhow::Result<u32> {
    let VerifyArgs {
        events,
        keys,
        per_transaction,
        topic,
        ..
    } = args;
    let pool = courier::db::pool(&config.database, "courier-verify")?;
    let outbox = Outbox::new(&config);
    let event = |i: u32| {
        let key = format!("video-{run_id}-{:05}", i % keys);
        let version = i64::from(i / keys) + 1;
        let payload = format!(r#"{{"video_id":"{key}","title":"take {version}"}}"#);
        NewEvent::new(
            &topic,
            "video",
            key,
            "video.updated",
            version,
            payload.into_bytes(),
        )
        .with_source_service("courier-verify")
    };
    let mut next = 0;
    while next < events {
        let end = (next + per_transaction).min(events);
        // Built just before the commit, so occurred_at measures commit → arrival.
        let chunk: Vec<NewEvent> = (next..end).map(event).collect();
        let mut conn = pool.get().await.context("database connection")?;
        let tx = conn.transaction().await.context("begin")?;
        outbox.append_all_and_commit(tx, chunk).await?;
        bar.inc(u64::from(end - next));
        next = end;
    }
    bar.finish();
    Ok(events)
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
