//! The limits a drain is measured against: the emulator's raw publish (one client, and a
//! client per 1,000 keys at several windows) and PostgreSQL's raw claim-and-mark, and the
//! phases each is timed as.

use crate::harness::fixtures::{progress, publish_bounded_with};
use crate::harness::middle::Milestones;
use crate::report::measures::Rate;
use anyhow::Context as _;
use courier::operations::CLIENT_BATCH_DELAY;
use courier::operations::{OutboxStore, PublishedRow, PublishedRows};
use courier::operations::{TopicClients, KEYS_PER_CLIENT, REQUESTS_THE_CONNECTION_CARRIES};
use courier::outbox::NewEvent;
use courier_testkit::{TestDb, TestPubSub};
use google_cloud_pubsub::model::Message;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::runtime::Handle;
use uuid::Uuid;

/// Concurrent sessions running the raw claim-and-mark ceiling.
pub(super) const CLAIM_SESSIONS: u32 = 4;

/// Unacknowledged publishes allowed at once in the raw publish ceiling (with unique keys the
/// raw publish through a client per 1,000 keys also runs at what the relay's connection
/// carries, 1,124, and at 400, and the fastest over all pairs counts).
pub(super) const RAW_PUBLISH_IN_FLIGHT: usize = 10_000;

/// A phase's rate over all its events, and when its count crossed the bounds of their middle.
#[derive(Debug, Clone)]
pub(super) struct Phase {
    pub(super) whole: Rate,
    pub(super) milestones: Milestones,
}

impl Phase {
    pub(super) fn middle(&self) -> Option<Rate> {
        self.milestones.middle_rate(&self.whole.name)
    }
}

/// One statement claiming a shard's first `$1` rows and marking them published: the relay's
/// index, no head-of-line check, no publishing. It names `outbox_ready`'s whole predicate, as
/// the claim does, and marks the rows at the addresses it locked them at: without
/// `next_retry_at IS NULL` no index keeps the shard's rows in seq order (0013 dropped the one
/// that did), and each statement read and sorted the shard's whole backlog, a ceiling 3-8x
/// below the relay's own two statements.
pub(super) const CLAIM_AND_MARK: &str = "
    WITH claimed AS (
        SELECT ctid FROM courier.outbox
        WHERE shard = $2 AND published_at IS NULL AND dead_at IS NULL
          AND next_retry_at IS NULL
        ORDER BY seq
        LIMIT $1
        FOR UPDATE SKIP LOCKED)
    UPDATE courier.outbox o
    SET published_at = now(), publish_attempts = o.publish_attempts + 1
    FROM claimed WHERE o.ctid = claimed.ctid AND o.published_at IS NULL";

/// PostgreSQL's ceiling: `sessions` sessions, each owning every `sessions`-th shard, repeating
/// [`CLAIM_AND_MARK`] per shard until their shards are empty.
pub(super) async fn raw_claim_and_mark(
    db: &TestDb,
    shards: u32,
    batch: u32,
    sessions: u32,
    total: u64,
) -> anyhow::Result<Rate> {
    let mut database = db.config.clone();
    database.pool_size = sessions.max(2);
    let pool = courier::db::pool(&database, "courier-load claim-and-mark")?;
    let step = move |shard: u32| {
        let pool = pool.clone();
        async move {
            let conn = pool.get().await.context("claim-and-mark connection")?;
            let statement = conn.prepared(CLAIM_AND_MARK).await?;
            let shard = i32::try_from(shard)?;
            Ok(conn
                .execute(&statement, &[&i64::from(batch), &shard])
                .await?)
        }
    };
    let what = "PostgreSQL raw claim-and-mark";
    drain_shards(shards, sessions, total, what, step).await
}

/// What the relay's own statements cost PostgreSQL without publishing: `sessions` sessions of
/// the relay's pool settings, each owning every `sessions`-th shard, claiming a batch with a
/// lock token (`OutboxStore::claim`, head-of-line check included) and marking it published
/// at once (`OutboxStore::mark_published`), until their shards are empty. No rows wait
/// between claim and mark, so this is the least the relay's database work can cost.
pub(super) async fn raw_claim_then_mark(
    db: &TestDb,
    config: &courier::CourierConfig,
    sessions: u32,
    total: u64,
) -> anyhow::Result<Rate> {
    let mut database = db.config.clone();
    database.pool_size = sessions.max(2);
    let pool = courier::db::relay_pool(&database, "courier-load claim-then-mark")?;
    let published = PublishedRows::from_config(&config.retention);
    let store = Arc::new(OutboxStore::with_published_rows(
        pool,
        &database.schema,
        published,
    ));
    let (lease, batch) = (config.relay.claim_lease(), config.relay.claim_batch_size);
    let token = Uuid::new_v4();
    let step = move |shard: u32| {
        let store = store.clone();
        async move {
            let rows = store.claim(shard, token, lease, batch).await?;
            let published: Vec<_> = rows
                .iter()
                .map(|r| PublishedRow::acked_now(r.address))
                .collect();
            Ok(store.mark_published(&published, token).await?)
        }
    };
    let what = "PostgreSQL claim, then mark (the relay's statements)";
    drain_shards(config.relay.shard_count, sessions, total, what, step).await
}

/// Runs `sessions` workers at once, each owning every `sessions`-th shard and calling
/// `step(shard)` on its shards in turn until a call returns 0 rows (that shard is empty);
/// checks that `total` rows were done and returns the rate.
pub(super) async fn drain_shards<F, Fut>(
    shards: u32,
    sessions: u32,
    total: u64,
    what: &str,
    step: F,
) -> anyhow::Result<Rate>
where
    F: Fn(u32) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + Send,
{
    let bar = progress(total, what);
    let started = Instant::now();
    let mut workers = Vec::new();
    for session in 0..sessions {
        let (bar, step) = (bar.clone(), step.clone());
        let mut mine: Vec<u32> = (session..shards).step_by(sessions as usize).collect();
        workers.push(tokio::spawn(async move {
            let mut done = 0u64;
            while !mine.is_empty() {
                let mut still_busy = Vec::with_capacity(mine.len());
                for shard in mine {
                    let n = step(shard).await?;
                    if n > 0 {
                        still_busy.push(shard);
                    }
                    done += n;
                    bar.inc(n);
                }
                mine = still_busy;
            }
            anyhow::Ok(done)
        }));
    }
    let mut done = 0;
    for worker in workers {
        done += worker.await.context("shard worker panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    anyhow::ensure!(done == total, "{what}: {done} of {total} rows");
    Ok(Rate::new(what, done, seconds))
}

/// The emulator's ceiling: the same messages published straight through the official client.
pub(super) async fn raw_publish(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
    in_flight: usize,
) -> anyhow::Result<Phase> {
    let publisher = pubsub.client().publisher(topic, CLIENT_BATCH_DELAY).await?;
    timed_publish(
        |m| publisher.publish(m),
        events,
        in_flight,
        "published (raw client)",
        "emulator raw publish (1 client, ordering keys)",
    )
    .await
}

/// `events`' messages handed to `publish` (see `publish_bounded_with`), timed as a phase named
/// `name` from the first message on.
pub(super) async fn timed_publish(
    publish: impl FnMut(Message) -> google_cloud_pubsub::publisher::PublishFuture,
    events: &[NewEvent],
    in_flight: usize,
    what: &str,
    name: &str,
) -> anyhow::Result<Phase> {
    let total = events.len() as u64;
    let mut milestones = Milestones::start(total);
    let acknowledged = publish_bounded_with(
        publish,
        messages(events),
        total,
        in_flight,
        what,
        &mut milestones,
    )
    .await?;
    Ok(Phase {
        whole: Rate::new(name, acknowledged, milestones.elapsed_seconds()),
        milestones,
    })
}

/// Unacknowledged publishes of the narrowest raw window: four times the requests the crate's
/// channel sends at once (100), so it always has requests ready to send.
pub(super) const NARROW_RAW_WINDOW: usize = 400;

/// The windows of unacknowledged publishes [`raw_publish_per_generation`] runs at:
/// [`RAW_PUBLISH_IN_FLIGHT`], what the relay's connection carries (see
/// `courier::relay::topic_clients`), where the relay's limit settles with a key per row, and
/// [`NARROW_RAW_WINDOW`]. With a key per row a raw publish is faster at the narrower windows,
/// so a ceiling measured at 10,000 alone flattered a relay holding 1,124
/// (docs/benchmarks-history.md).
pub(super) fn per_generation_windows() -> Vec<usize> {
    let mut windows = vec![
        RAW_PUBLISH_IN_FLIGHT,
        REQUESTS_THE_CONNECTION_CARRIES,
        NARROW_RAW_WINDOW,
    ];
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// The raw publish as a publisher whose memory is bounded must run it with this crate: through
/// the relay's own topic clients (`relay::topic_clients`), a new client on one connection every
/// [`KEYS_PER_CLIENT`] keys, each dropped once its last message is handed over, so the crate's
/// per-key state is built and torn down within the measurement, as in the relay. A single
/// client, as in [`raw_publish`], keeps every key's state to the end (~17 KB a key) and frees
/// it after. The relay is held to the faster of the two (see [`Pair::raw_ceiling`]).
pub(super) async fn raw_publish_per_generation(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
    in_flight: usize,
) -> anyhow::Result<Phase> {
    let clients = TopicClients::new(pubsub.client(), Handle::current(), CLIENT_BATCH_DELAY);
    // Opens the connection before the clock starts; its client serves the first message.
    let mut first = Some(clients.for_new_key(topic).await?);
    let publish = |message| {
        // Every message is a key of its own, taken as a new key publisher takes its client.
        let client = first
            .take()
            .or_else(|| clients.for_new_key_now(topic))
            .expect("the connection exists once the first client was made");
        client.publisher.publish(message)
    };
    timed_publish(
        publish,
        events,
        in_flight,
        &format!("published (raw, a client per {KEYS_PER_CLIENT} keys, {in_flight} in flight)"),
        &format!(
            "emulator raw publish, a new client every {KEYS_PER_CLIENT} keys, {in_flight} in flight"
        ),
    )
    .await
}

/// The messages the relay would publish for `events`: same data, ordering keys and attributes.
pub(super) fn messages(events: &[NewEvent]) -> impl Iterator<Item = Message> + '_ {
    events.iter().map(NewEvent::message)
}
