//! Benchmark data: events spread over keys, written into a fresh database's outbox.

use crate::harness::middle::Milestones;
use anyhow::Context as _;
use courier::operations::OutboxStore;
use courier::outbox::{NewEvent, Outbox};
use courier::CourierConfig;
use courier_testkit::TestDb;
use indicatif::{ProgressBar, ProgressStyle};
use std::future::Future;
use std::time::{Duration, Instant};

/// `count` events round-robin over `keys` aggregates (versions 1, 2, … per key), ~200-byte
/// payloads, all for `topic`.
pub fn events(topic: &str, count: u64, keys: u64) -> Vec<NewEvent> {
    event_stream(topic, count, keys).collect()
}

/// The same events as [`events`], made one at a time: a fill of millions of rows then holds
/// a transaction's worth, not gigabytes the allocator returns while the run is measured.
pub fn event_stream(topic: &str, count: u64, keys: u64) -> impl Iterator<Item = NewEvent> + '_ {
    (0..count).map(move |i| {
        let key = format!("video-{:06}", i % keys);
        let version = i64::try_from(i / keys).unwrap_or(i64::MAX - 1) + 1;
        let payload = format!("{key}:{version}:{}", "x".repeat(180));
        NewEvent::new(
            topic,
            "video",
            key,
            "video.updated",
            version,
            payload.into_bytes(),
        )
        .with_source_service("courier-load")
    })
}

/// Writes `events` through the outbox API, 1,000 per transaction.
pub async fn fill(
    db: &TestDb,
    config: &CourierConfig,
    events: &[NewEvent],
    what: &str,
) -> anyhow::Result<()> {
    fill_from(
        db,
        config,
        events.iter().cloned(),
        events.len() as u64,
        what,
    )
    .await
}

/// Writes `count` events taken from `events` through the outbox API, 1,000 per transaction.
pub async fn fill_from(
    db: &TestDb,
    config: &CourierConfig,
    mut events: impl Iterator<Item = NewEvent> + Send,
    count: u64,
    what: &str,
) -> anyhow::Result<()> {
    let outbox = Outbox::new(config);
    let bar = progress(count, what);
    let mut conn = db.pool.get().await.context("fill: connection")?;
    loop {
        let chunk: Vec<NewEvent> = events.by_ref().take(1_000).collect();
        if chunk.is_empty() {
            break;
        }
        let len = chunk.len() as u64;
        let tx = conn.transaction().await.context("fill: begin")?;
        outbox.append_all(&tx, chunk).await?;
        tx.commit().await.context("fill: commit")?;
        bar.inc(len);
    }
    bar.finish_and_clear();
    conn.batch_execute("VACUUM ANALYZE courier.outbox")
        .await
        .context("fill: vacuum")?;
    Ok(())
}

/// Marks every shard idle or busy, which decides whether appends send the wake-up NOTIFY.
pub async fn set_shards_idle(db: &TestDb, shard_count: u32, idle: bool) -> anyhow::Result<()> {
    let store = OutboxStore::new(db.pool.clone(), &db.config.schema);
    for shard in 0..shard_count {
        store.set_shard_idle(shard, idle, None).await?;
    }
    Ok(())
}

/// Publishes `messages` (`len` of them) through `publisher`, at most `in_flight` awaiting
/// the server's acknowledgement at once, moving a progress bar labelled `what`; returns how
/// many were acknowledged.
pub async fn publish_bounded(
    publisher: &google_cloud_pubsub::client::Publisher,
    messages: impl IntoIterator<Item = google_cloud_pubsub::model::Message>,
    len: u64,
    in_flight: usize,
    what: &str,
) -> anyhow::Result<u64> {
    let mut milestones = Milestones::start(len);
    publish_bounded_with(
        |m| publisher.publish(m),
        messages,
        len,
        in_flight,
        what,
        &mut milestones,
    )
    .await
}

/// [`publish_bounded`], each message handed to `publish`, each acknowledgement observed by
/// `milestones`.
pub async fn publish_bounded_with(
    mut publish: impl FnMut(
        google_cloud_pubsub::model::Message,
    ) -> google_cloud_pubsub::publisher::PublishFuture,
    messages: impl IntoIterator<Item = google_cloud_pubsub::model::Message>,
    len: u64,
    in_flight: usize,
    what: &str,
    milestones: &mut Milestones,
) -> anyhow::Result<u64> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let bar = progress(len, what);
    let mut pending: FuturesUnordered<google_cloud_pubsub::publisher::PublishFuture> =
        FuturesUnordered::new();
    let mut acknowledged = 0u64;
    for message in messages {
        if pending.len() >= in_flight.max(1) {
            if let Some(result) = pending.next().await {
                result.with_context(|| format!("{what}: publish"))?;
                acknowledged += 1;
                milestones.observe(acknowledged);
                bar.inc(1);
            }
        }
        pending.push(publish(message));
    }
    while let Some(result) = pending.next().await {
        result.with_context(|| format!("{what}: publish"))?;
        acknowledged += 1;
        milestones.observe(acknowledged);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(acknowledged)
}

/// Most rounds [`warm_up_emulator`] publishes before giving up on a plateau.
pub const WARM_UP_MAX_ROUNDS: u32 = 8;

/// Publishes `messages()` to a scratch topic in rounds until a round is less than 10 %
/// faster than the one before, or `max_rounds` ran; returns each round's rate. The emulator
/// is a JVM: cold, it publishes at a fraction of its warm rate (on this machine 26k/s in the
/// first 200k messages, 37k–53k/s after 600k), so a publish ceiling measured cold flatters
/// whatever is compared with it.
pub async fn warm_up_emulator<I>(
    pubsub: &courier_testkit::TestPubSub,
    messages: impl Fn() -> I,
    len: u64,
    max_rounds: u32,
) -> anyhow::Result<Vec<f64>>
where
    I: IntoIterator<Item = google_cloud_pubsub::model::Message>,
{
    let mut rates: Vec<f64> = Vec::new();
    if max_rounds == 0 {
        return Ok(rates);
    }
    let topic = pubsub.topic("warm-up").await?;
    let publisher = pubsub
        .client()
        .publisher(&topic, courier::operations::CLIENT_BATCH_DELAY)
        .await?;
    for round in 1..=max_rounds {
        let started = Instant::now();
        let what = format!("warming the emulator up, round {round}");
        let published = publish_bounded(&publisher, messages(), len, 10_000, &what).await?;
        rates.push(published as f64 / started.elapsed().as_secs_f64().max(1e-9));
        if plateaued(&rates) {
            break;
        }
    }
    Ok(rates)
}

/// The last round was less than 10 % faster than the one before it.
pub fn plateaued(rates: &[f64]) -> bool {
    matches!(rates, [.., previous, last] if *last < previous * 1.1)
}

/// A report note saying how the emulator was warmed up before its ceiling was measured.
pub fn warm_up_note(rates: &[f64], len: u64) -> String {
    if rates.is_empty() {
        return "the emulator was not warmed up (--warm-up-rounds 0): its publish ceiling is a cold JVM's".into();
    }
    let listed: Vec<String> = rates.iter().map(|r| format!("{:.0}/s", r)).collect();
    format!(
        "emulator warmed up before its ceiling was measured: {} rounds of {len} messages at {}",
        rates.len(),
        listed.join(", ")
    )
}

pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Polls `done` every `every` until it reports `total`, moving a progress bar labelled `what`;
/// fails with how far it got once `timeout` has passed since `started`. Returns the seconds
/// from `started` to done.
pub async fn poll_until_done<F, Fut>(
    started: Instant,
    total: u64,
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: F,
) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<u64>>,
{
    let bar = progress(total, what);
    let deadline = started + timeout;
    loop {
        let n = done().await?;
        bar.set_position(n);
        if n >= total {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: {n} of {total} after {timeout:?}"
        );
        tokio::time::sleep(every).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_stops_once_a_round_is_not_clearly_faster() {
        assert!(!plateaued(&[]));
        assert!(!plateaued(&[21_000.0]), "one round says nothing yet");
        assert!(!plateaued(&[21_000.0, 46_000.0]), "still warming up");
        assert!(plateaued(&[21_000.0, 46_000.0, 48_000.0]));
        assert!(
            plateaued(&[46_000.0, 38_000.0]),
            "a slower round ends it too"
        );
    }

    #[test]
    fn the_note_lists_every_round_or_says_the_ceiling_is_cold() {
        let note = warm_up_note(&[21_667.4, 46_289.0], 200_000);
        assert!(
            note.contains("2 rounds of 200000 messages at 21667/s, 46289/s"),
            "{note}"
        );
        assert!(warm_up_note(&[], 200_000).contains("not warmed up"));
    }
}
