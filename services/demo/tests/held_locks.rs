//! The read side under routine lock contention, through both services (issue 21's scenario):
//! with `lock_timeout` at 300 ms and engagement's replica rows held locked for 3 s while the
//! catalog changes each video's title (v2) and then its duration (v3), nothing is
//! dead-lettered and the replica ends equal to the catalog: the delta updates were retried in
//! place, in order, with the shipped retry settings.

use crate::support;

use courier_testkit::wait_until;
use serde_json::json;
use std::time::Duration;
use support::*;

#[actix_rt::test]
async fn a_replica_locked_for_three_seconds_dead_letters_nothing_and_ends_equal_to_the_catalog(
) -> anyhow::Result<()> {
    let mut t = TestStack::prepared(None).await?;
    t.db.client()
        .await?
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET lock_timeout = '300ms'",
            t.db.name
        ))
        .await?;
    t.stack = Some(courier_demo::stack::Stack::start(&t.configs(), run_options()).await?);
    let catalog = t.catalog();
    let mut videos = Vec::new();
    for i in 0..10 {
        videos.push(create_video(&catalog, &format!("video {i}")).await?);
    }
    wait_until(FLOW, "the replica holds every video", || async {
        t.count("SELECT count(*) FROM engagement.videos_replica")
            .await
            == 10
    })
    .await?;

    let mut locker = t.db.client().await?;
    let lock = locker.transaction().await?;
    let locked = lock
        .query("SELECT 1 FROM engagement.videos_replica FOR UPDATE", &[])
        .await?
        .len();
    assert_eq!(locked, 10);
    for (i, video) in videos.iter().enumerate() {
        let path = format!("/videos/{video}");
        let title = catalog
            .patch(&path, &json!({ "title": format!("title {i}") }))
            .await?;
        assert_eq!(title.status, 200, "{}", title.body);
        let duration = catalog
            .patch(&path, &json!({ "duration_secs": 600 + i }))
            .await?;
        assert_eq!(duration.status, 200, "{}", duration.body);
    }
    // The scenario's lock lasts 3 s from the last change.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        t.count("SELECT count(*) FROM engagement.videos_replica WHERE version > 1")
            .await,
        0,
        "applied through a held lock"
    );
    lock.commit().await?;

    let equal = "SELECT count(*) FROM catalog.videos c
                 JOIN engagement.videos_replica r USING (video_id)
                 WHERE r.version = 3 AND r.title = c.title AND r.duration_secs = c.duration_secs";
    wait_until(FLOW, "the replica equal to the catalog", || async {
        t.count(equal).await == 10
    })
    .await?;
    assert_eq!(
        t.count("SELECT count(*) FROM engagement.dead_letter_log")
            .await,
        0,
        "dead letters"
    );
    assert_eq!(
        t.count("SELECT count(*) FROM engagement.parked_keys").await,
        0
    );
    Ok(())
}
