//! The demo's story, told through the services' HTTP APIs, and the table of what flowed
//! where, read from the databases themselves (not from the framework's counters).

use crate::client::{Api, Reply};
use anyhow::{bail, Context as _};
use serde_json::json;
use std::time::Duration;
use uuid::Uuid;

/// What the story produced, for the summary and the tests.
#[derive(Debug, Default)]
pub struct Story {
    pub videos: Vec<Uuid>,
    pub users: Vec<Uuid>,
    /// The like refused because its video was deleted: status and reason.
    pub refused: Option<Reply>,
}

/// Retries `call` while its answer is `retry_on` (the other service has not caught up yet),
/// up to `wait`; returns the last answer.
async fn until_not<F, Fut>(retry_on: u16, wait: Duration, mut call: F) -> anyhow::Result<Reply>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Reply>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let reply = call().await?;
        if reply.status != retry_on || tokio::time::Instant::now() >= deadline {
            return Ok(reply);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect(reply: Reply, status: u16, what: &str) -> anyhow::Result<Reply> {
    if reply.status != status {
        bail!(
            "{what}: expected HTTP {status}, got {} {}",
            reply.status,
            reply.body
        );
    }
    Ok(reply)
}

/// The services' APIs.
pub struct Apis {
    pub catalog: Api,
    pub engagement: Api,
    pub search: Api,
}

/// Runs the story: creates videos, views, likes, an unlike, watch progress, a read of one's
/// own write, a title update, searches, a delete and a like the engagement service refuses.
/// `say` receives one line per request. `wait` bounds each wait for another service to catch
/// up.
pub async fn run(
    apis: &Apis,
    wait: Duration,
    mut say: impl FnMut(String),
) -> anyhow::Result<Story> {
    let (catalog, engagement, search) = (&apis.catalog, &apis.engagement, &apis.search);
    let mut story = Story::default();
    let uploader = Uuid::new_v4();
    for title in ["Cats at work", "Dogs at play", "Birds at dawn"] {
        let body = json!({ "uploader_id": uploader, "title": title, "duration_secs": 600 });
        // A trace of the demo's own, as a caller's tracing would start one: the write, its
        // publish and its projection in engagement all belong to it.
        let trace = Uuid::new_v4().simple().to_string();
        let span = &Uuid::new_v4().simple().to_string()[..16];
        let traced = catalog.with_header("traceparent", &format!("00-{trace}-{span}-01"));
        let reply = expect(traced.post("/videos", &body).await?, 201, "create video")?;
        let id: Uuid = reply
            .text("aggregate_id")
            .parse()
            .context("create video: aggregate_id")?;
        say(format!(
            "catalog    POST /videos {title:?} -> 201 video {id} v1 (trace {trace})"
        ));
        story.videos.push(id);
    }
    story.users = (0..3).map(|_| Uuid::new_v4()).collect();
    let (v, u) = (story.videos.clone(), story.users.clone());

    // Views: the engagement service accepts them once its replica knows the video.
    for (video, user) in [
        (v[0], u[0]),
        (v[0], u[1]),
        (v[0], u[2]),
        (v[1], u[0]),
        (v[2], u[1]),
    ] {
        let path = format!("/videos/{video}/views");
        let body = json!({ "user_id": user });
        let reply = until_not(404, wait, || engagement.post(&path, &body)).await?;
        let reply = expect(reply, 200, "view")?;
        say(format!(
            "engagement POST {path} -> 200 v{}",
            reply.int("version").unwrap_or(0)
        ));
    }
    let mut last_like = None;
    for (video, user) in [(v[0], u[0]), (v[0], u[1]), (v[1], u[2])] {
        let path = format!("/videos/{video}/likes/{user}");
        let reply = expect(engagement.put(&path, None).await?, 200, "like")?;
        say(format!(
            "engagement PUT {path} -> 200 v{}",
            reply.int("version").unwrap_or(0)
        ));
        last_like = Some((video, user, reply));
    }
    let path = format!("/videos/{}/likes/{}", v[0], u[1]);
    let reply = expect(engagement.delete(&path).await?, 200, "unlike")?;
    say(format!(
        "engagement DELETE {path} -> 200 v{}",
        reply.int("version").unwrap_or(0)
    ));
    let path = format!("/videos/{}/progress/{}", v[0], u[0]);
    let body = json!({ "position_secs": 600, "completed": true });
    let reply = expect(engagement.put(&path, Some(&body)).await?, 200, "progress")?;
    say(format!(
        "engagement PUT {path} -> 200 v{}",
        reply.int("version").unwrap_or(0)
    ));

    // Read your own write: the catalog waits until its projection reached the like's version.
    if let Some((video, user, like)) = last_like {
        let version = like.int("version").unwrap_or(1);
        let path = format!("/videos/{video}/engagement/{user}?min_version={version}");
        let reply = expect(catalog.get(&path).await?, 200, "read your write")?;
        say(format!(
            "catalog    GET {path} -> 200 liked={}",
            reply.body["liked"]
        ));
    }

    let path = format!("/videos/{}", v[1]);
    let reply = expect(
        catalog
            .patch(&path, &json!({ "title": "Dogs at play (director's cut)" }))
            .await?,
        200,
        "update title",
    )?;
    say(format!(
        "catalog    PATCH {path} title -> 200 v{}",
        reply.int("version").unwrap_or(0)
    ));

    // The search service indexes the new title (its projection of the catalog's events).
    let path = "/search?q=director";
    let reply = until_found(search, path, v[1], wait).await?;
    say(format!(
        "search     GET {path} -> 200 {} hit(s), first {}",
        reply.body["hits"].as_array().map_or(0, Vec::len),
        reply.body["hits"][0]["title"]
    ));
    let path = format!("/videos/{}?reason=uploader%20request", v[2]);
    let reply = expect(catalog.delete(&path).await?, 200, "delete video")?;
    say(format!(
        "catalog    DELETE {path} -> 200 v{}",
        reply.int("version").unwrap_or(0)
    ));

    // Once the delete reached the engagement service, a like of that video is refused.
    let path = format!("/videos/{}/likes/{}", v[2], u[0]);
    let reply = until_not(200, wait, || async {
        let reply = engagement.put(&path, None).await?;
        if reply.status == 200 {
            // Accepted before the delete arrived: undo it and try again.
            engagement.delete(&path).await?;
        }
        Ok(reply)
    })
    .await?;
    let reply = expect(reply, 409, "like of a deleted video")?;
    say(format!(
        "engagement PUT {path} -> 409 {}",
        reply.text("error")
    ));
    story.refused = Some(reply);

    let path = format!("/videos/{}/engagement", v[0]);
    let reply = expect(catalog.get(&path).await?, 200, "engagement summary")?;
    say(format!("catalog    GET {path} -> 200 {}", reply.body));
    Ok(story)
}

/// Searches `path` until `video` is among the hits, up to `wait`; returns the last answer.
async fn until_found(
    search: &Api,
    path: &str,
    video: Uuid,
    wait: Duration,
) -> anyhow::Result<Reply> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let reply = expect(search.get(path).await?, 200, "search")?;
        let found = reply.body["hits"]
            .as_array()
            .is_some_and(|hits| hits.iter().any(|hit| hit["video_id"] == video.to_string()));
        if found {
            return Ok(reply);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "search {path}: video {video} not found within {wait:?}: {}",
                reply.body
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One event flow: a producer's topic into a consumer group's projection.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub topic: &'static str,
    pub consumer_group: &'static str,
    /// Outbox rows published / still pending / dead, in the producer's schema.
    pub published: i64,
    pub pending: i64,
    pub dead: i64,
    /// Events the consumer group applied (its inbox rows).
    pub projected: i64,
    /// Commit → projection commit, over the events of this flow.
    pub lag_p50_ms: f64,
    pub lag_max_ms: f64,
}

const FLOWS: [(&str, &str, &str, &str); 3] = [
    (
        "catalog",
        "catalog.video.events",
        "engagement",
        "engagement_reader",
    ),
    (
        "catalog",
        "catalog.video.events",
        "search",
        "search_indexer",
    ),
    (
        "engagement",
        "engagement.video.events",
        "catalog",
        "catalog_projector",
    ),
];

/// Reads the flows from the databases (an admin connection that sees every schema), counting
/// only events written since `since` (a database kept from earlier runs holds theirs too).
pub async fn flows(
    admin: &tokio_postgres::Client,
    since: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Vec<Flow>> {
    let mut flows = Vec::new();
    for (producer, topic, consumer, group) in FLOWS {
        let counts = admin
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
                            count(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL),
                            count(*) FILTER (WHERE dead_at IS NOT NULL)
                     FROM {producer}.outbox WHERE topic = $1 AND created_at >= $2"
                ),
                &[&topic, &since],
            )
            .await
            .with_context(|| format!("count {producer}'s outbox"))?;
        let lag = admin
            .query_one(
                &format!(
                    "SELECT count(*),
                            COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0)::float8,
                            COALESCE(max(ms), 0)::float8
                     FROM (SELECT extract(epoch FROM i.processed_at - o.created_at) * 1000 AS ms
                           FROM {producer}.outbox o
                           JOIN {consumer}.inbox i ON i.event_id = o.id AND i.consumer_group = $1
                           WHERE o.topic = $2 AND o.created_at >= $3) t"
                ),
                &[&group, &topic, &since],
            )
            .await
            .with_context(|| format!("measure {group}'s lag"))?;
        flows.push(Flow {
            topic,
            consumer_group: group,
            published: counts.get(0),
            pending: counts.get(1),
            dead: counts.get(2),
            projected: lag.get(0),
            lag_p50_ms: lag.get(1),
            lag_max_ms: lag.get(2),
        });
    }
    Ok(flows)
}

/// The flows as a small text table.
pub fn table(flows: &[Flow]) -> String {
    let mut out = format!(
        "{:<26} {:<20} {:>9} {:>7} {:>4} {:>9} {:>9} {:>9}\n",
        "topic", "consumer group", "published", "pending", "dead", "projected", "p50 ms", "max ms"
    );
    for f in flows {
        out.push_str(&format!(
            "{:<26} {:<20} {:>9} {:>7} {:>4} {:>9} {:>9.0} {:>9.0}\n",
            f.topic,
            f.consumer_group,
            f.published,
            f.pending,
            f.dead,
            f.projected,
            f.lag_p50_ms,
            f.lag_max_ms
        ));
    }
    out
}
