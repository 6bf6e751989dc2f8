//! `courier offsets reset` rebuilds a projection by replay: the catalog's engagement projection
//! is wiped, the group is reset to before the writes (audited), the subscription sought, and
//! the projection comes back. The subscription is unordered here because the emulator does not
//! implement Seek on ordered subscriptions (docs/emulator.md); real Pub/Sub does.

use crate::support;

use courier_testkit::wait_until;
use serde_json::json;
use support::{courier, TestStack, FLOW};
use uuid::Uuid;

/// Both services on an unordered catalog subscription (Seek works on the emulator only
/// without ordering), a video, and `likes` users liking it, all projected. Returns the stack
/// and a time just before the likes were written.
async fn liked_video(likes: i64) -> anyhow::Result<(TestStack, chrono::DateTime<chrono::Utc>)> {
    let mut t = TestStack::prepared_with(None, |spec| spec.ordering = false).await?;
    t.stack = Some(courier_demo::stack::Stack::start(&t.configs(), support::run_options()).await?);
    let (catalog, engagement) = (t.catalog(), t.engagement());
    let body = json!({ "uploader_id": Uuid::new_v4(), "title": "Replayed", "duration_secs": 60 });
    let video = catalog.post("/videos", &body).await?.text("aggregate_id");
    let before_writes = chrono::Utc::now() - chrono::Duration::seconds(1);
    for _ in 0..likes {
        let path = format!("/videos/{video}/likes/{}", Uuid::new_v4());
        wait_until(FLOW, "the like is accepted", || async {
            engagement
                .put(&path, None)
                .await
                .map(|r| r.status == 200)
                .unwrap_or(false)
        })
        .await?;
    }
    wait_until(FLOW, "the likes projected", || async {
        t.count(LIKED).await == likes
    })
    .await?;
    Ok((t, before_writes))
}

const LIKED: &str = "SELECT count(*) FROM catalog.video_user_engagements_projection WHERE liked";

#[actix_rt::test]
async fn an_offset_reset_rebuilds_a_projection_by_replay_and_is_audited() -> anyhow::Result<()> {
    let (t, before_writes) = liked_video(3).await?;
    let before_writes = before_writes.to_rfc3339();
    let liked = LIKED;
    courier(&t, &["offsets", "show", "--json"]).await?;

    // The read model is lost; reset the group to before the writes and let the replay rebuild it.
    t.db.pool
        .get()
        .await?
        .execute("DELETE FROM catalog.video_user_engagements_projection", &[])
        .await?;
    courier(
        &t,
        &[
            "offsets",
            "reset",
            "--group",
            "catalog_projector",
            "--subscription",
            "engagement.video.events.catalog-projector",
            "--to-time",
            &before_writes,
            "--reason",
            "rebuild after wipe",
        ],
    )
    .await?;
    wait_until(FLOW, "the projection rebuilt by replay", || async {
        t.count(liked).await == 3
    })
    .await?;
    let audited = "SELECT count(*) FROM catalog.consumer_offset_resets
                   WHERE consumer_group = 'catalog_projector' AND reason = 'rebuild after wipe'";
    assert_eq!(t.count(audited).await, 1);

    // To a message instead of a time: the publish time saved with that message id.
    let conn = t.db.pool.get().await?;
    let message_id: String = conn
        .query_one(
            "SELECT message_id FROM catalog.consumer_offsets
             WHERE consumer_group = 'catalog_projector' AND message_id IS NOT NULL LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    courier(
        &t,
        &[
            "offsets",
            "reset",
            "--group",
            "catalog_projector",
            "--subscription",
            "engagement.video.events.catalog-projector",
            "--to-message",
            &message_id,
            "--reason",
            "to a message",
            "--json",
        ],
    )
    .await?;
    assert_eq!(
        t.count(
            "SELECT count(*) FROM catalog.consumer_offset_resets WHERE reason = 'to a message'"
        )
        .await,
        1
    );
    // A bare replay (Seek only): the inbox keeps the replayed events from a second effect.
    courier(
        &t,
        &[
            "replay",
            "--subscription",
            "engagement.video.events.catalog-projector",
            "--to-time",
            &before_writes,
        ],
    )
    .await?;
    wait_until(FLOW, "the projection intact after the replay", || async {
        t.count(liked).await == 3
    })
    .await?;

    // Bad input names the flag.
    let error = courier(
        &t,
        &[
            "offsets",
            "reset",
            "--group",
            "catalog_projector",
            "--subscription",
            "engagement.video.events.catalog-projector",
            "--to-time",
            "yesterday",
            "--reason",
            "x",
        ],
    )
    .await
    .expect_err("bad time");
    assert!(format!("{error:#}").contains("--to-time"), "{error:#}");
    let error = courier(&t, &["offsets", "show", "--group", "nobody"])
        .await
        .expect_err("unknown group");
    assert!(format!("{error:#}").contains("--group"), "{error:#}");
    Ok(())
}

#[actix_rt::test]
async fn a_rebuild_clears_the_projection_and_replays_it_while_the_service_runs(
) -> anyhow::Result<()> {
    let (t, before_writes) = liked_video(2).await?;
    let liked = LIKED;

    let report = courier::service::runtime::rebuild(
        &courier_catalog::service(),
        &t.catalog_config,
        "projector",
        before_writes,
        "tester",
        "rebuild test",
    )
    .await?;
    assert_eq!(
        report.cleared,
        vec![("video_user_engagements_projection".to_owned(), 2)]
    );
    assert_eq!(report.group, "catalog_projector");
    wait_until(FLOW, "the projection rebuilt", || async {
        t.count(liked).await == 2
    })
    .await?;
    let audited = "SELECT count(*) FROM catalog.consumer_offset_resets
                   WHERE reset_by = 'tester' AND reason = 'rebuild test'";
    assert_eq!(t.count(audited).await, 1);

    let unknown = courier::service::runtime::rebuild(
        &courier_catalog::service(),
        &t.catalog_config,
        "nope",
        before_writes,
        "tester",
        "x",
    )
    .await
    .expect_err("unknown projection");
    assert!(unknown.to_string().contains("projector"), "{unknown}");
    Ok(())
}
