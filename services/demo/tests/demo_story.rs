//! The demo's story (what `scripts/demo` runs) on a test's own stack: every step answers as
//! the story expects, and the flow table, read from the databases, shows every published
//! event projected exactly once.

use crate::support;

use courier_demo::scenario;
use courier_testkit::wait_until;
use std::time::Duration;
use support::{TestStack, FLOW};

#[actix_rt::test]
async fn the_demo_story_runs_and_every_event_is_projected_once() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let started = chrono::Utc::now();
    let mut lines = Vec::new();
    let apis = scenario::Apis {
        catalog: t.catalog(),
        engagement: t.engagement(),
        search: t.search(),
    };
    let story = scenario::run(&apis, FLOW, |line| lines.push(line)).await?;
    assert_eq!((story.videos.len(), story.users.len()), (3, 3));
    assert_eq!(story.refused.as_ref().map(|r| r.status), Some(409));
    assert!(lines.len() >= 15, "{lines:#?}");
    let traces = lines
        .iter()
        .filter_map(|line| line.split("(trace ").nth(1)?.strip_suffix(')'))
        .filter(|id| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()))
        .count();
    assert_eq!(
        traces, 3,
        "each created video prints its trace id: {lines:#?}"
    );

    let admin = t.db.client().await?;
    wait_until(
        FLOW,
        "every flow projected everything published",
        || async {
            let flows = scenario::flows(&admin, started).await.unwrap_or_default();
            flows.len() == 3
                && flows
                    .iter()
                    .all(|f| f.pending == 0 && f.projected == f.published)
        },
    )
    .await?;
    let flows = scenario::flows(&admin, started).await?;
    // 3 creates + 1 update + 1 delete (+ any like accepted before the delete arrived, undone).
    assert!(flows[0].published >= 5, "{flows:?}");
    // The search index applied the catalog's events too.
    assert_eq!(flows[1].published, flows[0].published, "{flows:?}");
    // 5 views, 3 likes, 1 unlike, 1 progress (+ the same undone likes).
    assert!(flows[2].published >= 10, "{flows:?}");
    assert!(
        lines.iter().any(|line| line.starts_with("search ")),
        "the story searches: {lines:#?}"
    );
    assert!(flows
        .iter()
        .all(|f| f.dead == 0 && f.lag_max_ms < Duration::from_secs(30).as_millis() as f64));
    let table = scenario::table(&flows);
    assert!(
        table.contains("engagement_reader")
            && table.contains("search_indexer")
            && table.contains("catalog_projector"),
        "{table}"
    );
    Ok(())
}
