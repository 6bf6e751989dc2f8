//! The search service with the catalog, both running in this process on a database and an
//! emulator project of their own (courier-testkit's `ServiceStack`): videos written through
//! the catalog's API are found, changed and gone as the catalog says; each catalog event emits
//! one `search.video.events` event in the index's transaction; a redelivered or replayed
//! (rebuild) catalog event changes nothing and emits nothing again.

use courier_search::contract::v1::{event::Payload, Event};
use courier_testkit::{wait_until, Api, Collector, ServiceStack};
use prost::Message as _;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use uuid::Uuid;

/// How long a test waits for the search service to see a catalog write.
const FLOW: Duration = Duration::from_secs(30);

async fn stack() -> anyhow::Result<ServiceStack> {
    ServiceStack::start(&[courier_catalog::service, courier_search::service]).await
}

/// The video ids a search for `q` finds, best first.
async fn found(search: &Api, q: &str) -> Vec<Uuid> {
    let reply = search
        .get(&format!("/search?q={}", q.replace(' ', "+")))
        .await
        .expect("search answers");
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|hit| {
            hit["video_id"]
                .as_str()
                .expect("video_id")
                .parse()
                .expect("uuid")
        })
        .collect()
}

async fn create(catalog: &Api, title: &str, description: &str, status: &str) -> Uuid {
    let body = json!({
        "uploader_id": Uuid::new_v4(), "title": title, "description": description,
        "duration_secs": 300, "status": status,
    });
    let reply = catalog.post("/videos", &body).await.expect("create");
    assert_eq!(reply.status, 201, "{}", reply.body);
    reply.text("aggregate_id").parse().expect("uuid")
}

async fn patch(catalog: &Api, video: Uuid, body: Value) {
    let reply = catalog
        .patch(&format!("/videos/{video}"), &body)
        .await
        .expect("update");
    assert_eq!(reply.status, 200, "{}", reply.body);
}

async fn delete(catalog: &Api, video: Uuid) {
    let reply = catalog
        .delete(&format!("/videos/{video}?reason=test"))
        .await
        .expect("delete");
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// The search events received, decoded: (video id, version) → (event type, causation id).
fn emitted(collector: &Collector) -> BTreeMap<(String, i64), (String, String)> {
    collector
        .all()
        .into_iter()
        .map(|received| {
            let event = Event::decode(received.data.as_slice()).expect("a search.v1.Event");
            let kind = match event.payload {
                Some(Payload::VideoIndexed(_)) => "video.indexed",
                Some(Payload::VideoUnindexed(_)) => "video.unindexed",
                None => "none",
            };
            assert_eq!(received.attribute("event_type"), Some(kind));
            (
                (event.aggregate_id, event.version),
                (
                    kind.to_owned(),
                    received
                        .attribute("causation_id")
                        .unwrap_or_default()
                        .to_owned(),
                ),
            )
        })
        .collect()
}

async fn count(stack: &ServiceStack, sql: &str) -> i64 {
    stack.db.scalar(sql).await.unwrap_or(-1)
}

#[actix_rt::test]
async fn videos_are_found_after_create_and_update_and_gone_after_delete() -> anyhow::Result<()> {
    let stack = stack().await?;
    let indexed = stack.collect(courier_search::contract::TOPIC).await?;
    let (catalog, search) = (stack.api("catalog"), stack.api("search"));

    let kayak = create(
        &catalog,
        "Kayaking the fjords",
        "Paddling north",
        "published",
    )
    .await;
    let draft = create(&catalog, "Kayaking draft", "unfinished", "draft").await;
    wait_until(FLOW, "the published video found", || async {
        found(&search, "kayaking").await == [kayak]
    })
    .await?;
    // A partial update: the new title is found, the old words are not, the description stays.
    patch(&catalog, kayak, json!({ "title": "Sailing the fjords" })).await;
    wait_until(FLOW, "the new title found", || async {
        found(&search, "sailing").await == [kayak]
    })
    .await?;
    assert!(found(&search, "kayaking").await.is_empty());
    assert_eq!(found(&search, "paddling").await, [kayak]);
    // Publishing the draft makes it found.
    patch(&catalog, draft, json!({ "status": "published" })).await;
    wait_until(FLOW, "the published draft found", || async {
        found(&search, "unfinished").await == [draft]
    })
    .await?;
    delete(&catalog, kayak).await;
    wait_until(FLOW, "the deleted video gone", || async {
        found(&search, "fjords").await.is_empty()
    })
    .await?;

    // One event per catalog event, at its version, caused by it, in the index's transaction.
    let catalog_events: BTreeMap<(String, i64), String> = stack
        .db
        .client()
        .await?
        .query(
            "SELECT aggregate_id, version, id::text FROM catalog.outbox",
            &[],
        )
        .await?
        .iter()
        .map(|row| ((row.get(0), row.get(1)), row.get(2)))
        .collect();
    assert_eq!(catalog_events.len(), 5);
    wait_until(FLOW, "every search event received", || async {
        emitted(&indexed).len() == catalog_events.len()
    })
    .await?;
    let emitted = emitted(&indexed);
    for (key, cause) in &catalog_events {
        let (_, caused_by) = &emitted[key];
        assert_eq!(caused_by, cause, "{key:?}");
    }
    let kinds: Vec<&str> = [(kayak, 1), (kayak, 2), (kayak, 3), (draft, 1), (draft, 2)]
        .iter()
        .map(|(video, version)| emitted[&(video.to_string(), *version)].0.as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "video.indexed",
            "video.indexed",
            "video.unindexed",
            "video.unindexed",
            "video.indexed"
        ]
    );

    // Bad queries are the request's fault.
    for bad in ["/search?q=", "/search?q=x&limit=0", "/search"] {
        let reply = search.get(bad).await?;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
    }
    stack.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// A catalog event delivered a second time (as after a lost ack) changes nothing and emits
/// nothing: the inbox stops it before the index.
#[actix_rt::test]
async fn a_redelivered_catalog_event_changes_nothing_and_emits_nothing() -> anyhow::Result<()> {
    let stack = stack().await?;
    let (catalog, search) = (stack.api("catalog"), stack.api("search"));
    let video = create(&catalog, "Bread baking", "sourdough", "published").await;
    patch(&catalog, video, json!({ "title": "Rye baking" })).await;
    wait_until(FLOW, "the update indexed", || async {
        found(&search, "rye").await == [video]
    })
    .await?;
    let first: Uuid = stack
        .db
        .client()
        .await?
        .query_one("SELECT id FROM catalog.outbox WHERE version = 1", &[])
        .await?
        .get(0);
    stack.redeliver("catalog", first).await?;
    // The redelivery is on the video's ordering key, ahead of this update: once the update is
    // indexed, the redelivery has been handled.
    patch(&catalog, video, json!({ "description": "pumpernickel" })).await;
    wait_until(FLOW, "the next update indexed", || async {
        found(&search, "pumpernickel").await == [video]
    })
    .await?;
    let (_, metrics) = search.get_text("/metrics").await?;
    let duplicates: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("courier_projection_duplicates_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(
        duplicates >= 1.0,
        "the redelivery never arrived: {duplicates}"
    );
    assert_eq!(found(&search, "rye").await, [video], "v1 came back");
    assert!(found(&search, "bread").await.is_empty(), "v1 came back");
    assert_eq!(count(&stack, "SELECT count(*) FROM search.outbox").await, 3);
    stack.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

const VIDEOS: usize = 250;

/// 1,000 catalog events (250 videos: created, retitled, described, a third deleted or
/// unpublished), then a rebuild by Seek: every event is applied again, the index ends as it
/// was, 0 events are emitted again and 0 dead-lettered.
#[actix_rt::test]
async fn a_rebuild_after_a_thousand_events_re_emits_nothing() -> anyhow::Result<()> {
    // Unordered: the emulator cannot seek an ordered subscription (docs/emulator.md); the
    // index applies each video's versions in order all the same (contiguous_versions).
    let stack = ServiceStack::start_with(
        &[courier_catalog::service, courier_search::service],
        |_, _| {},
        |subscription| subscription.ordering = false,
    )
    .await?;
    let catalog = stack.api("catalog");
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let mut videos = Vec::new();
    for i in 0..VIDEOS {
        videos.push(create(&catalog, &format!("video {i} about birds"), "", "published").await);
    }
    for (i, &video) in videos.iter().enumerate() {
        patch(
            &catalog,
            video,
            json!({ "title": format!("video {i} about fish") }),
        )
        .await;
        patch(
            &catalog,
            video,
            json!({ "description": format!("number {i}") }),
        )
        .await;
        match i % 3 {
            0 => delete(&catalog, video).await,
            1 => patch(&catalog, video, json!({ "status": "draft" })).await,
            _ => patch(&catalog, video, json!({ "description": "the last word" })).await,
        }
    }
    let events = (VIDEOS * 4) as i64;
    assert_eq!(
        count(&stack, "SELECT count(*) FROM catalog.outbox").await,
        events
    );
    let emitted = "SELECT count(*) FROM search.outbox";
    wait_until(
        Duration::from_secs(120),
        "every catalog event indexed",
        || async { count(&stack, emitted).await == events },
    )
    .await?;
    let index = "SELECT string_agg(video_id || title || description || status || version, ','
                 ORDER BY video_id) FROM search.search_documents";
    let client = stack.db.client().await?;
    let before_rebuild: String = client.query_one(index, &[]).await?.get(0);

    let report = courier::service::runtime::rebuild(
        &courier_search::service(),
        stack.config("search"),
        "indexer",
        before,
        "tester",
        "rebuild after 1,000 events",
    )
    .await?;
    assert_eq!(
        report.cleared,
        vec![("search_documents".to_owned(), VIDEOS as u64)]
    );
    let applied = "SELECT count(*) FROM search.inbox WHERE consumer_group = 'search_indexer'";
    wait_until(
        Duration::from_secs(120),
        "every event applied again",
        || async { count(&stack, applied).await == events },
    )
    .await?;
    let after_rebuild: String = client.query_one(index, &[]).await?.get(0);
    assert_eq!(after_rebuild, before_rebuild, "the index rebuilt as it was");
    assert_eq!(count(&stack, emitted).await, events, "re-emitted");
    assert_eq!(
        count(&stack, "SELECT count(*) FROM search.dead_letter_log").await,
        0,
        "dead-lettered"
    );
    let found = found(&stack.api("search"), "fish").await;
    assert_eq!(found.len(), 20, "the default limit");
    stack.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
