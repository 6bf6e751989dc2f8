//! The demo's injected dead letter (courier_demo::injected): until it is republished the
//! projections lack the change; `courier dlq republish` (what the console's Republish calls)
//! sends it back to the catalog topic and both search and engagement apply it.

use crate::support;

use courier::pubsub::PubSub;
use courier_demo::injected;
use courier_testkit::wait_until;
use support::{courier, create_video, TestStack, FLOW};

#[actix_rt::test]
async fn the_injected_dead_letter_republished_makes_the_projections_right() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let (catalog, search) = (t.catalog(), t.search());
    let video = create_video(&catalog, "Cats at work").await?;
    let searched = |q: &'static str| {
        let search = search.clone();
        async move {
            let reply = search.get(&format!("/search?q={q}")).await.expect("search");
            reply.body["hits"].as_array().map_or(0, Vec::len)
        }
    };
    wait_until(FLOW, "the video indexed", || async {
        searched("cats").await == 1
    })
    .await?;
    let replica = format!(
        "SELECT count(*) FROM engagement.videos_replica WHERE video_id = '{video}' AND version = 1"
    );
    wait_until(FLOW, "the video replicated", || async {
        t.count(&replica).await == 1
    })
    .await?;

    let mut admin = t.db.client().await?;
    let pubsub = PubSub::new(t.catalog_config.pubsub.clone());
    let injected = injected::inject(&mut admin, &pubsub, video, "Cats at night").await?;
    assert_eq!(injected.version, 2);
    // The catalog has the change; no projection has it, for nothing was published.
    let at_v2 = format!("SELECT version FROM catalog.videos WHERE video_id = '{video}'");
    assert_eq!(t.count(&at_v2).await, 2);
    let indexed = format!("SELECT version FROM search.search_documents WHERE video_id = '{video}'");
    assert_eq!(t.count(&indexed).await, 1);

    courier(
        &t,
        &["dlq", "republish", "--subscription", injected::SUBSCRIPTION],
    )
    .await?;
    wait_until(FLOW, "search finds the new title", || async {
        searched("night").await == 1
    })
    .await?;
    let retitled = format!(
        "SELECT count(*) FROM engagement.videos_replica
         WHERE video_id = '{video}' AND version = 2 AND title = 'Cats at night'"
    );
    wait_until(FLOW, "engagement's replica has the new title", || async {
        t.count(&retitled).await == 1
    })
    .await?;
    Ok(())
}
