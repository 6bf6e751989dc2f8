//! The catalog's backfill against real PostgreSQL and the emulator: a new consumer joins a
//! running system and converges to the catalog from a backfill plus live events, with no gap
//! and no version regression; a backfill stopped mid-way resumes and snapshots every video
//! exactly once; a dry run writes nothing; a snapshot never overwrites a newer live event.

use crate::support;

use courier::backfill::{Backfill, BackfillError, BackfillSource, BoxFuture, Step};
use courier::db::{DbError, PgTransaction};
use courier::inbound::{
    uuid_field, Consumer, ConsumerSpec, EventMeta, HandlerError, Projection, VersionedUpsert,
};
use courier::outbox::{NewEvent, Outbox};
use courier::pubsub::SubscriptionSpec;
use courier_catalog::backfill::VideoSnapshots;
use courier_catalog::events::video_event;
use courier_demo::client::Api;
use courier_proto::catalog::v1::{event::Payload, Event, VideoSnapshot, VideoStatus, VideoUpdated};
use courier_testkit::wait_until;
use serde_json::json;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{create_video, run_options, TestStack, FLOW};
use tokio_postgres::Client;
use uuid::Uuid;

/// (title, version, deleted) per video.
type Videos = BTreeMap<Uuid, (String, i64, bool)>;

async fn rename(catalog: &Api, video: Uuid, title: &str) -> anyhow::Result<()> {
    let reply = catalog
        .patch(&format!("/videos/{video}"), &json!({ "title": title }))
        .await?;
    // 409: deleted meanwhile, which is a fine outcome for a random writer.
    anyhow::ensure!(
        reply.status == 200 || reply.status == 409,
        "update: {} {}",
        reply.status,
        reply.body
    );
    Ok(())
}

async fn delete(catalog: &Api, video: Uuid) -> anyhow::Result<()> {
    let reply = catalog
        .delete(&format!("/videos/{video}?reason=test"))
        .await?;
    anyhow::ensure!(
        reply.status == 200,
        "delete: {} {}",
        reply.status,
        reply.body
    );
    Ok(())
}

/// Rows of `sql` selecting (video_id, title, version, deleted), as the test's superuser.
async fn videos(t: &TestStack, sql: &str) -> anyhow::Result<Videos> {
    let conn = t.db.pool.get().await?;
    Ok(conn
        .query(sql, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect())
}

/// The source of truth: the catalog's videos table.
async fn catalog_videos(t: &TestStack) -> anyhow::Result<Videos> {
    videos(
        t,
        "SELECT video_id, title, version, status = 'deleted' FROM catalog.videos",
    )
    .await
}

fn backfill_of(t: &TestStack, source: Arc<dyn BackfillSource>) -> anyhow::Result<Backfill> {
    let pool = courier::db::pool(&t.catalog_config.database, "test-backfill")?;
    Ok(Backfill::new(pool, &t.catalog_config, source))
}

/// `n` videos written straight into the catalog's table (no events: the backfill is the only
/// writer these tests need), at assorted versions, every fifth deleted.
async fn seed_videos(t: &TestStack, n: i64) -> anyhow::Result<()> {
    let conn = t.db.pool.get().await?;
    conn.execute(
        "INSERT INTO catalog.videos (video_id, uploader_id, title, duration_secs, status, version,
                                     deleted_at, deleted_reason)
         SELECT gen_random_uuid(), gen_random_uuid(), 'video ' || i, 60,
                CASE WHEN i % 5 = 0 THEN 'deleted' ELSE 'published' END, 1 + i % 3,
                CASE WHEN i % 5 = 0 THEN now() END, CASE WHEN i % 5 = 0 THEN 'seeded' END
         FROM generate_series(1, $1::bigint) i",
        &[&n],
    )
    .await?;
    Ok(())
}

/// A test-only read model joining late: a search index of video titles, built with versioned
/// upserts, with a trigger recording any version that ever moved backwards.
#[derive(Clone)]
struct SearchIndex {
    whole: VersionedUpsert,
    deleted: VersionedUpsert,
}

const SEARCH_INDEX_DDL: &str = "
CREATE TABLE engagement.video_search_index (
    video_id uuid PRIMARY KEY,
    title text NOT NULL DEFAULT '',
    deleted boolean NOT NULL DEFAULT false,
    version bigint NOT NULL);
CREATE TABLE engagement.video_search_regressions (
    video_id uuid NOT NULL, old_version bigint NOT NULL, new_version bigint NOT NULL);
CREATE FUNCTION engagement.record_regression() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version < OLD.version THEN
        INSERT INTO engagement.video_search_regressions VALUES (NEW.video_id, OLD.version, NEW.version);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER regression BEFORE UPDATE ON engagement.video_search_index
    FOR EACH ROW EXECUTE FUNCTION engagement.record_regression();";

impl SearchIndex {
    fn new() -> Self {
        let upsert = |columns: &[&str]| {
            VersionedUpsert::new("video_search_index", &["video_id"], columns).expect("identifiers")
        };
        Self {
            whole: upsert(&["title", "deleted"]),
            deleted: upsert(&["deleted"]),
        }
    }
}

impl Projection for SearchIndex {
    type Event = Event;

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Event,
    ) -> Result<(), HandlerError> {
        let v = meta.version;
        match &event.payload {
            Some(Payload::VideoCreated(e)) => {
                let id = uuid_field("video_id", &e.video_id)?;
                self.whole.execute(tx, &[&id, &e.title, &false], v).await?;
            }
            Some(Payload::VideoSnapshot(e)) => {
                let id = uuid_field("video_id", &e.video_id)?;
                let deleted = e.status == i32::from(VideoStatus::Deleted);
                self.whole
                    .execute(tx, &[&id, &e.title, &deleted], v)
                    .await?;
            }
            Some(Payload::VideoUpdated(e)) => {
                // Changed fields only: applies over an older row, else waits for the snapshot.
                let id = uuid_field("video_id", &e.video_id)?;
                tx.execute(
                    "UPDATE video_search_index SET title = COALESCE($2, title), version = $3
                     WHERE video_id = $1 AND version < $3",
                    &[&id, &e.title, &v],
                )
                .await?;
            }
            Some(Payload::VideoDeleted(e)) => {
                let id = uuid_field("video_id", &e.video_id)?;
                self.deleted.execute(tx, &[&id, &true], v).await?;
            }
            None => return Err(HandlerError::Permanent("no payload".into())),
        }
        Ok(())
    }
}

/// Provisions the search index's subscription and table and starts its consumer (group
/// `engagement_search`) in the engagement schema.
async fn start_search_index(t: &TestStack) -> anyhow::Result<courier::inbound::ConsumerHandle> {
    let mut spec =
        SubscriptionSpec::standard(courier_proto::catalog::TOPIC, "engagement", "search");
    spec.ack_deadline_secs = 10;
    t.pubsub
        .client_for(&t.engagement_config.pubsub)
        .provision(&spec)
        .await?;
    let role = t
        .engagement_config
        .database
        .role
        .clone()
        .expect("a role per service");
    let conn = t.db.pool.get().await?;
    conn.batch_execute(SEARCH_INDEX_DDL).await?;
    conn.batch_execute(&format!(
        "ALTER TABLE engagement.video_search_index OWNER TO {role};
         ALTER TABLE engagement.video_search_regressions OWNER TO {role};"
    ))
    .await?;
    let consumer = ConsumerSpec {
        group: "engagement_search".into(),
        subscription: spec.name.clone(),
        dead_letter_topic: format!("{}.dlq", courier_proto::catalog::TOPIC),
    };
    Ok(Consumer::spawn(
        &t.engagement_config,
        consumer,
        SearchIndex::new(),
        run_options().consumer,
    )?)
}

#[actix_rt::test]
async fn a_new_consumer_converges_from_a_backfill_while_writes_go_on() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let catalog = t.catalog();

    // History the new consumer will never receive as events.
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(create_video(&catalog, &format!("old {i}")).await?);
    }
    for (i, id) in ids.iter().enumerate().take(10) {
        rename(&catalog, *id, &format!("old renamed {i}")).await?;
    }
    for id in ids.iter().skip(25) {
        delete(&catalog, *id).await?;
    }

    // The new read model joins: subscription first, then the consumer, then the backfill.
    let search = start_search_index(&t).await?;

    // Live writes go on during the backfill: creates, renames, deletes.
    let ids = Rc::new(RefCell::new(ids));
    let writes_done = Rc::new(std::cell::Cell::new(false));
    let writer = {
        let (catalog, ids, done) = (catalog.clone(), ids.clone(), writes_done.clone());
        actix_rt::spawn(async move {
            for i in 0..90usize {
                let pick = {
                    let ids = ids.borrow();
                    ids[(i * 7919) % ids.len()]
                };
                match i % 6 {
                    0 | 3 => {
                        let id = create_video(&catalog, &format!("live {i}")).await?;
                        ids.borrow_mut().push(id);
                    }
                    5 => delete(&catalog, pick).await?,
                    _ => rename(&catalog, pick, &format!("live renamed {i}")).await?,
                }
            }
            done.set(true);
            anyhow::Ok(())
        })
    };

    // Samples the index while it converges: a video's version must never go down.
    let sampling = Rc::new(std::cell::Cell::new(true));
    let sampler = {
        let (pool, sampling) = (t.db.pool.clone(), sampling.clone());
        actix_rt::spawn(async move {
            let mut seen: BTreeMap<Uuid, i64> = BTreeMap::new();
            let mut regressions = Vec::new();
            let mut samples = 0;
            // Bounded: the convergence waits below give up long before 5,000 samples.
            while sampling.get() && samples < 5_000 {
                samples += 1;
                let conn = pool.get().await?;
                for row in conn
                    .query(
                        "SELECT video_id, version FROM engagement.video_search_index",
                        &[],
                    )
                    .await?
                {
                    let (id, version): (Uuid, i64) = (row.get(0), row.get(1));
                    let before = seen.insert(id, version);
                    if before.is_some_and(|b| b > version) {
                        regressions.push((id, before, version));
                    }
                }
                drop(conn);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok((samples, regressions))
        })
    };

    let backfill = backfill_of(&t, Arc::new(VideoSnapshots))?;
    let mut reports = 0;
    let report = backfill
        .run(7, "test", "new search index", |_| reports += 1)
        .await?;
    assert!(!report.resumed);
    assert!(report.batches_now >= 5, "{report:?}");
    assert!(
        reports as u64 > report.batches_now,
        "progress after every batch"
    );
    writer.await??;
    assert!(writes_done.get());

    let truth = catalog_videos(&t).await?;
    assert!(truth.len() > 40, "{} videos", truth.len());
    assert!(
        report.emitted_total >= 30,
        "every video existing at the start was snapshotted: {report:?}"
    );
    wait_until(
        Duration::from_secs(60),
        "the search index equals the catalog",
        || async {
            videos(
                &t,
                "SELECT video_id, title, version, deleted FROM engagement.video_search_index",
            )
            .await
            .is_ok_and(|index| index == truth)
        },
    )
    .await
    .map_err(|e| e.context(format!("catalog: {truth:?}")))?;
    // The old consumer applied the snapshots too (and dead-lettered none).
    wait_until(
        FLOW,
        "the engagement replica equals the catalog",
        || async {
            videos(
            &t,
            "SELECT video_id, title, version, status = 'deleted' FROM engagement.videos_replica",
        )
        .await
        .is_ok_and(|replica| replica == truth)
        },
    )
    .await?;

    sampling.set(false);
    let (samples, sampled_regressions) = sampler.await??;
    // The trigger sees every write; the samples check what a reader saw meanwhile.
    assert!(samples >= 3, "only {samples} samples of the index");
    assert!(
        sampled_regressions.is_empty(),
        "versions went backwards: {sampled_regressions:?}"
    );
    let regressions = t
        .count("SELECT count(*) FROM engagement.video_search_regressions")
        .await;
    assert_eq!(
        regressions, 0,
        "a version of the search index went backwards"
    );
    assert_eq!(search.stats().dead_lettered, 0);
    for (group, stats) in t.stack().engagement.consumer_stats() {
        assert_eq!(stats.dead_lettered, 0, "{group} dead-lettered a message");
    }
    search.kill();
    Ok(())
}

/// The catalog's source, failing (after doing its work in the transaction) on batch `fail_at`
/// of this process: what a crash in the middle of a batch leaves.
struct FailOnBatch {
    fail_at: usize,
    calls: AtomicUsize,
}

static CATALOG: VideoSnapshots = VideoSnapshots;

impl BackfillSource for FailOnBatch {
    fn aggregate_type(&self) -> &'static str {
        CATALOG.aggregate_type()
    }

    fn count_after<'a>(
        &'a self,
        client: &'a Client,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<i64, DbError>> {
        CATALOG.count_after(client, after)
    }

    fn snapshot_batch<'a, 'tx: 'a>(
        &'a self,
        tx: &'a PgTransaction<'tx>,
        after: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<NewEvent>, BackfillError>> {
        Box::pin(async move {
            let events = CATALOG.snapshot_batch(tx, after, limit).await?;
            if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
                return Err(BackfillError::Snapshot {
                    aggregate_type: "video".into(),
                    aggregate_id: events
                        .last()
                        .map(|e| e.aggregate_id.clone())
                        .unwrap_or_default(),
                    reason: "simulated crash".into(),
                });
            }
            Ok(events)
        })
    }
}

/// Snapshot rows in the catalog's outbox per video.
async fn snapshots_per_video(t: &TestStack) -> anyhow::Result<BTreeMap<Uuid, i64>> {
    let conn = t.db.pool.get().await?;
    Ok(conn
        .query(
            "SELECT aggregate_id::uuid, count(*) FROM catalog.outbox
             WHERE event_type = 'video.snapshotted' GROUP BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

#[actix_rt::test]
async fn a_stopped_backfill_resumes_and_snapshots_every_video_once() -> anyhow::Result<()> {
    let t = TestStack::prepared(None).await?;
    seed_videos(&t, 25).await?;
    let before = catalog_videos(&t).await?;

    // One batch committed, then the process is gone.
    let first = backfill_of(&t, Arc::new(VideoSnapshots))?;
    let (run, resumed) = first.start_or_resume(5, "test", "resume test").await?;
    assert!(!resumed);
    assert_eq!(
        first.step(run.run_id, 5).await?,
        Step::Emitted {
            snapshots: 5,
            run_total: 5
        }
    );
    drop(first);

    // A second attempt commits two batches and dies inside the third.
    let failing = backfill_of(
        &t,
        Arc::new(FailOnBatch {
            fail_at: 3,
            calls: AtomicUsize::new(0),
        }),
    )?;
    let error = failing
        .run(5, "test", "resume test", |_| {})
        .await
        .expect_err("the third batch fails");
    assert!(error.to_string().contains("simulated crash"), "{error}");
    let unfinished = failing.unfinished().await?.expect("the run is unfinished");
    assert_eq!((unfinished.run_id, unfinished.emitted), (run.run_id, 15));
    assert_eq!(
        snapshots_per_video(&t).await?.values().sum::<i64>(),
        15,
        "the failed batch rolled back with its snapshots"
    );

    // A dry run now says what resuming would do.
    let plan = failing.plan().await?;
    assert_eq!(plan.resumes.map(|r| r.run_id), Some(run.run_id));
    assert_eq!(plan.would_emit, 10);

    // Rerun: it resumes after the last committed batch and finishes.
    let report = backfill_of(&t, Arc::new(VideoSnapshots))?
        .run(5, "test", "resume test", |_| {})
        .await?;
    assert!(report.resumed);
    assert_eq!(
        (report.run_id, report.emitted_now, report.emitted_total),
        (run.run_id, 10, 25)
    );
    let per_video = snapshots_per_video(&t).await?;
    assert_eq!(per_video.len(), 25);
    assert!(per_video.values().all(|n| *n == 1), "{per_video:?}");
    let after = catalog_videos(&t).await?;
    for (id, (title, version, deleted)) in &before {
        assert_eq!(
            after.get(id),
            Some(&(title.clone(), version + 1, *deleted)),
            "video {id}: one version bump per run, nothing else changed"
        );
    }
    // Each snapshot carries the video's new version.
    let mismatched = t
        .count(
            "SELECT count(*) FROM catalog.outbox o JOIN catalog.videos v
             ON v.video_id = o.aggregate_id::uuid
             WHERE o.event_type = 'video.snapshotted' AND o.version <> v.version",
        )
        .await;
    assert_eq!(mismatched, 0);
    assert_eq!(
        t.count("SELECT count(*) FROM catalog.backfill_runs WHERE finished_at IS NULL")
            .await,
        0
    );
    Ok(())
}

#[actix_rt::test]
async fn a_dry_run_counts_and_writes_nothing() -> anyhow::Result<()> {
    let t = TestStack::prepared(None).await?;
    seed_videos(&t, 12).await?;
    let before = catalog_videos(&t).await?;
    let plan = backfill_of(&t, Arc::new(VideoSnapshots))?.plan().await?;
    assert_eq!((plan.would_emit, plan.resumes), (12, None));
    assert_eq!(catalog_videos(&t).await?, before);
    assert_eq!(t.count("SELECT count(*) FROM catalog.outbox").await, 0);
    assert_eq!(
        t.count("SELECT count(*) FROM catalog.backfill_runs").await,
        0
    );
    Ok(())
}

#[actix_rt::test]
async fn a_snapshot_after_a_newer_event_does_not_overwrite_it() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let video = create_video(&t.catalog(), "Original").await?;
    let replica = |title: &str, version: i64| {
        format!(
            "SELECT count(*) FROM engagement.videos_replica
             WHERE video_id = '{video}' AND title = '{title}' AND version = {version}"
        )
    };
    wait_until(FLOW, "the replica has v1", || async {
        t.count(&replica("Original", 1)).await == 1
    })
    .await?;

    // Out of order on purpose (as a replay or a late redelivery would bring them): an update
    // at v3 is appended and published before a snapshot at v2, each in its own transaction.
    let outbox = Outbox::new(&t.catalog_config);
    let newer = video_event(
        video,
        3,
        Payload::VideoUpdated(VideoUpdated {
            video_id: video.to_string(),
            title: Some("Newer".into()),
            ..VideoUpdated::default()
        }),
    );
    let older = video_event(
        video,
        2,
        Payload::VideoSnapshot(VideoSnapshot {
            video_id: video.to_string(),
            uploader_id: Uuid::new_v4().to_string(),
            title: "Older snapshot".into(),
            duration_secs: 300,
            status: VideoStatus::Published.into(),
            ..VideoSnapshot::default()
        }),
    );
    let ids = [newer.event_id, older.event_id];
    for event in [newer, older] {
        let mut conn = t.db.pool.get().await?;
        let tx = conn.transaction().await?;
        outbox.append(&tx, event).await?;
        tx.commit().await?;
    }
    let both = format!(
        "SELECT count(*) FROM engagement.inbox
         WHERE consumer_group = 'engagement_reader' AND event_id IN ('{}', '{}')",
        ids[0], ids[1]
    );
    wait_until(FLOW, "the replica processed both events", || async {
        t.count(&both).await == 2
    })
    .await?;
    assert_eq!(
        t.count(&replica("Newer", 3)).await,
        1,
        "the older snapshot overwrote the newer update"
    );
    for (group, stats) in t.stack().engagement.consumer_stats() {
        assert_eq!(stats.dead_lettered, 0, "{group} dead-lettered a message");
    }
    Ok(())
}
