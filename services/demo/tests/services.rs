//! The catalog and engagement services together, against real PostgreSQL and the emulator:
//! events flow both ways, reads can wait for one's own write, bad input and missing tokens
//! write nothing, each role sees only its schema, and a service restart loses nothing.

use crate::support;

use courier::relay::BeforeMark;
use courier::service::RunningService;
use courier_demo::client::Api;
use courier_testkit::wait_until;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use support::{create_video, run_options, TestStack, FLOW, TOKEN};
use uuid::Uuid;

/// Waits until the engagement service accepts a view of `video` (its replica has it).
async fn view_when_replicated(engagement: &Api, video: Uuid, user: Uuid) -> anyhow::Result<i64> {
    let path = format!("/videos/{video}/views");
    let body = json!({ "user_id": user });
    let deadline = tokio::time::Instant::now() + FLOW;
    loop {
        let reply = engagement.post(&path, &body).await?;
        if reply.status == 200 {
            return Ok(reply.int("version").unwrap_or_default());
        }
        anyhow::ensure!(
            reply.status == 404 && tokio::time::Instant::now() < deadline,
            "view: {} {}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn events_flow_between_the_services_and_reads_can_wait_for_a_write() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let (catalog, engagement) = (t.catalog(), t.engagement());

    // Create → the engagement service's replica has it.
    let video = create_video(&catalog, "Cats at work").await?;
    let replicated = format!(
        "SELECT count(*) FROM engagement.videos_replica
         WHERE video_id = '{video}' AND title = 'Cats at work' AND version = 1"
    );
    wait_until(FLOW, "the replica has the video", || async {
        t.count(&replicated).await == 1
    })
    .await?;

    // Like → the catalog's projection shows it; a read with min_version right after the write
    // sees it (it waits for the projection instead of answering stale data).
    let user = Uuid::new_v4();
    let like = engagement
        .put(&format!("/videos/{video}/likes/{user}"), None)
        .await?;
    assert_eq!(like.status, 200, "{}", like.body);
    assert_eq!(like.text("aggregate_id"), format!("{video}:{user}"));
    let version = like.int("version").expect("version");
    let read = catalog
        .get(&format!(
            "/videos/{video}/engagement/{user}?min_version={version}"
        ))
        .await?;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.body["liked"], json!(true));
    assert!(read.int("version").expect("version") >= version);
    let summary = catalog.get(&format!("/videos/{video}/engagement")).await?;
    assert_eq!(summary.int("likes"), Some(1), "{}", summary.body);

    // A version the projection cannot reach: 202 saying how far it got, after the bounded wait.
    let pending = catalog
        .get(&format!(
            "/videos/{video}/engagement/{user}?min_version={}",
            version + 5
        ))
        .await?;
    assert_eq!(pending.status, 202, "{}", pending.body);
    assert_eq!(pending.body["projected_version"], json!(version));

    // Update the title → the replica follows.
    let update = catalog
        .patch(
            &format!("/videos/{video}"),
            &json!({ "title": "Cats at rest" }),
        )
        .await?;
    assert_eq!(
        (update.status, update.int("version")),
        (200, Some(2)),
        "{}",
        update.body
    );
    let renamed = format!(
        "SELECT count(*) FROM engagement.videos_replica
         WHERE video_id = '{video}' AND title = 'Cats at rest' AND version = 2"
    );
    wait_until(FLOW, "the replica has the new title", || async {
        t.count(&renamed).await == 1
    })
    .await?;

    // Delete → a new like is refused with a reason, and writes nothing.
    let delete = catalog
        .delete(&format!("/videos/{video}?reason=test"))
        .await?;
    assert_eq!(
        (delete.status, delete.int("version")),
        (200, Some(3)),
        "{}",
        delete.body
    );
    let deleted = format!(
        "SELECT count(*) FROM engagement.videos_replica WHERE video_id = '{video}' AND status = 'deleted'"
    );
    wait_until(FLOW, "the replica knows the delete", || async {
        t.count(&deleted).await == 1
    })
    .await?;
    let before = t.outbox_rows().await;
    let refused = engagement
        .put(&format!("/videos/{video}/likes/{}", Uuid::new_v4()), None)
        .await?;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused.text("error").contains("deleted"),
        "{}",
        refused.body
    );
    assert_eq!(
        t.outbox_rows().await,
        before,
        "a refused like wrote an event"
    );

    // Unknown video → 404 with a reason.
    let unknown = engagement
        .post(
            &format!("/videos/{}/views", Uuid::new_v4()),
            &json!({ "user_id": user }),
        )
        .await?;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(
        unknown.text("error").contains("unknown"),
        "{}",
        unknown.body
    );
    Ok(())
}

#[actix_rt::test]
async fn bad_requests_get_400_with_a_reason_and_write_nothing() -> anyhow::Result<()> {
    use awc::http::Method;
    let t = TestStack::start(None).await?;
    let (catalog, engagement) = (t.catalog(), t.engagement());
    let video = create_video(&catalog, "Good video").await?;
    let user = Uuid::new_v4();
    view_when_replicated(&engagement, video, user).await?;
    let before = t.outbox_rows().await;

    let uploader = Uuid::new_v4();
    let long_title = "x".repeat(201);
    let cases: Vec<(&Api, Method, String, &str, String)> = vec![
        (&catalog, Method::POST, "/videos".into(), "application/json", "{\"title\": ".into()),
        (&catalog, Method::POST, "/videos".into(), "application/json",
            json!({ "title": "No uploader", "duration_secs": 1 }).to_string()),
        (&catalog, Method::POST, "/videos".into(), "application/json",
            json!({ "uploader_id": uploader, "title": long_title, "duration_secs": 1 }).to_string()),
        (&catalog, Method::POST, "/videos".into(), "application/json",
            json!({ "uploader_id": uploader, "title": "Negative", "duration_secs": -5 }).to_string()),
        (&catalog, Method::POST, "/videos".into(), "application/json",
            json!({ "uploader_id": uploader, "title": "Extra", "duration_secs": 5, "colour": "red" }).to_string()),
        (&catalog, Method::POST, "/videos".into(), "application/json",
            json!({ "uploader_id": "not-a-uuid", "title": "Bad id", "duration_secs": 5 }).to_string()),
        (&catalog, Method::POST, "/videos".into(), "text/plain", "title=x".into()),
        (&catalog, Method::PATCH, "/videos/not-a-uuid".into(), "application/json",
            json!({ "title": "x" }).to_string()),
        (&catalog, Method::PATCH, format!("/videos/{video}"), "application/json", "{}".into()),
        (&catalog, Method::PATCH, format!("/videos/{video}"), "application/json",
            json!({ "title": "   " }).to_string()),
        (&catalog, Method::DELETE, format!("/videos/{video}?colour=red"), "", String::new()),
        (&catalog, Method::GET, format!("/videos/{video}?min_version=soon"), "", String::new()),
        (&engagement, Method::POST, format!("/videos/{video}/views"), "application/json",
            json!({ "user_id": 42 }).to_string()),
        (&engagement, Method::POST, format!("/videos/{video}/views"), "application/json", "[]".into()),
        (&engagement, Method::PUT, format!("/videos/{video}/likes/not-a-uuid"), "", String::new()),
        (&engagement, Method::PUT, format!("/videos/{video}/progress/{user}"), "application/json",
            json!({ "position_secs": -1 }).to_string()),
        (&engagement, Method::PUT, format!("/videos/{video}/progress/{user}"), "application/json",
            json!({ "completed": true }).to_string()),
    ];
    for (api, method, path, content_type, body) in cases {
        let reply = api
            .send_raw(method.clone(), &path, content_type, &body)
            .await?;
        assert_eq!(reply.status, 400, "{method} {path} {body}: {}", reply.body);
        assert!(
            !reply.text("error").is_empty(),
            "{method} {path}: no reason in {}",
            reply.body
        );
    }
    assert_eq!(
        t.outbox_rows().await,
        before,
        "a bad request wrote an event"
    );
    let still = catalog.get(&format!("/videos/{video}")).await?;
    assert_eq!(
        (still.int("version"), still.text("title")),
        (Some(1), "Good video".into())
    );
    Ok(())
}

#[actix_rt::test]
async fn writes_need_the_configured_bearer_token_and_versions_guard_concurrent_writes(
) -> anyhow::Result<()> {
    let t = TestStack::start(Some(TOKEN)).await?;
    let catalog = t.catalog();
    let body = json!({ "uploader_id": Uuid::new_v4(), "title": "Guarded", "duration_secs": 10 });
    let missing = catalog.without_token().post("/videos", &body).await?;
    assert_eq!(missing.status, 401, "{}", missing.body);
    let wrong = courier_demo::client::Api::new(
        t.stack().catalog.addr,
        Some("wrong-token-0123456789".into()),
    )
    .post("/videos", &body)
    .await?;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(
        t.outbox_rows().await,
        (0, 0),
        "an unauthorized write wrote an event"
    );

    let video = create_video(&catalog, "Guarded").await?;
    // Reads need no token.
    assert_eq!(
        catalog
            .without_token()
            .get(&format!("/videos/{video}"))
            .await?
            .status,
        200
    );

    // Optimistic concurrency: the expected version must be the current one.
    let stale = catalog
        .patch(
            &format!("/videos/{video}"),
            &json!({ "title": "Second", "expected_version": 7 }),
        )
        .await?;
    assert_eq!(stale.status, 409, "{}", stale.body);
    let current = catalog
        .patch(
            &format!("/videos/{video}"),
            &json!({ "title": "Second", "expected_version": 1 }),
        )
        .await?;
    assert_eq!(
        (current.status, current.int("version")),
        (200, Some(2)),
        "{}",
        current.body
    );
    let stale_delete = catalog
        .delete(&format!("/videos/{video}?expected_version=1"))
        .await?;
    assert_eq!(stale_delete.status, 409, "{}", stale_delete.body);

    let engagement = t.engagement();
    let user = Uuid::new_v4();
    view_when_replicated(&engagement, video, user).await?;
    let stale_progress = engagement
        .put(
            &format!("/videos/{video}/progress/{user}"),
            Some(&json!({ "position_secs": 5, "expected_version": 3 })),
        )
        .await?;
    assert_eq!(stale_progress.status, 409, "{}", stale_progress.body);
    assert_eq!(t.outbox_rows().await, (2, 1));
    Ok(())
}

#[actix_rt::test]
async fn each_service_role_can_touch_only_its_own_schema() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    for (config, own, other) in [
        (
            &t.catalog_config,
            "catalog.videos",
            "engagement.engagements",
        ),
        (
            &t.engagement_config,
            "engagement.engagements",
            "catalog.videos",
        ),
    ] {
        let (client, connection) =
            tokio_postgres::connect(&config.database.url, tokio_postgres::NoTls).await?;
        actix_rt::spawn(async move {
            let _ = connection.await;
        });
        client
            .query(&format!("SELECT count(*) FROM {own}"), &[])
            .await?;
        for sql in [
            format!("SELECT count(*) FROM {other}"),
            format!("DELETE FROM {other}"),
            format!("CREATE TABLE {other}_copy (id int)"),
        ] {
            let error = client.batch_execute(&sql).await.expect_err(&sql);
            assert_eq!(
                error.code(),
                Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
                "{sql}: {error}"
            );
        }
    }
    Ok(())
}

#[actix_rt::test]
async fn restarting_a_service_mid_stream_loses_nothing() -> anyhow::Result<()> {
    let t = TestStack::prepared(None).await?;
    let engagement = RunningService::start(
        courier_engagement::service(),
        &t.engagement_config,
        run_options(),
    )
    .await?;

    // A catalog whose relay publishes and then "dies" before marking anything published.
    let stalled = Arc::new(AtomicU32::new(0));
    let flag = stalled.clone();
    let before_mark: BeforeMark = Arc::new(move |_| {
        flag.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::pending())
    });
    let mut options = run_options();
    options.relay.before_mark = Some(before_mark);
    let first =
        RunningService::start(courier_catalog::service(), &t.catalog_config, options).await?;
    let catalog = Api::new(first.addr, None);
    let mut videos = Vec::new();
    for i in 0..20 {
        videos.push(create_video(&catalog, &format!("Before the crash {i}")).await?);
    }
    wait_until(FLOW, "published and stuck before marking", || async {
        stalled.load(Ordering::SeqCst) >= 1
    })
    .await?;
    first.kill();
    let unmarked = "SELECT count(*) FROM catalog.outbox WHERE published_at IS NULL";
    assert!(
        t.count(unmarked).await > 0,
        "the crash came after every row was marked"
    );

    // The restarted catalog publishes its unmarked rows again and takes new writes.
    let second =
        RunningService::start(courier_catalog::service(), &t.catalog_config, run_options()).await?;
    let catalog = Api::new(second.addr, None);
    for i in 0..10 {
        videos.push(create_video(&catalog, &format!("After the restart {i}")).await?);
    }
    wait_until(FLOW, "every outbox row published", || async {
        t.count(unmarked).await == 0
    })
    .await?;
    let replica = "SELECT count(*) FROM engagement.videos_replica WHERE version = 1";
    wait_until(FLOW, "the replica has all 30 videos", || async {
        t.count(replica).await == 30
    })
    .await?;
    // Exactly once by effect: re-published events were recognised, one inbox row per event.
    // A re-published copy may still be on its way when the replica is complete.
    let duplicates = || {
        engagement
            .consumer_stats()
            .iter()
            .map(|(_, s)| s.duplicates)
            .sum::<u64>()
    };
    wait_until(FLOW, "a re-published event recognised", || async {
        duplicates() >= 1
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {:?}", engagement.consumer_stats()))?;
    assert_eq!(t.count("SELECT count(*) FROM engagement.inbox").await, 30);
    engagement.kill();
    second.kill();
    Ok(())
}

/// `name value` or `name{labels} value` lines of a Prometheus scrape: the largest value per name.
fn scrape_values(text: &str) -> std::collections::HashMap<String, f64> {
    let mut values = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or_default().to_owned();
        let value: f64 = value.parse().unwrap_or(f64::NAN);
        let entry = values.entry(name).or_insert(value);
        if value > *entry {
            *entry = value;
        }
    }
    values
}

#[actix_rt::test]
async fn health_readiness_and_metrics_endpoints_answer() -> anyhow::Result<()> {
    use courier::metrics as m;
    let t = TestStack::start(None).await?;
    let (catalog, engagement) = (t.catalog(), t.engagement());
    let video = create_video(&catalog, "Measured").await?;
    for api in [&catalog, &engagement] {
        assert_eq!(
            api.get(courier::service::http::HEALTH_PATH).await?.status,
            200
        );
        let ready = api.get(courier::service::http::READY_PATH).await?;
        assert_eq!(ready.status, 200, "{}", ready.body);
    }
    // Traffic both ways: a view, then a like of the same user (the second upsert meets a
    // stored version, which records the version lag).
    let user = Uuid::new_v4();
    view_when_replicated(&engagement, video, user).await?;
    let like = engagement
        .put(&format!("/videos/{video}/likes/{user}"), None)
        .await?;
    let version = like.int("version").expect("version");
    let read = catalog
        .get(&format!(
            "/videos/{video}/engagement/{user}?min_version={version}"
        ))
        .await?;
    assert_eq!(read.status, 200, "{}", read.body);

    let client = awc::Client::default();
    let mut response = client
        .get(format!(
            "http://{}{}",
            t.stack().catalog.addr,
            courier::service::http::METRICS_PATH
        ))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("scrape: {e}"))?;
    assert_eq!(response.status().as_u16(), 200);
    let text = String::from_utf8(
        response
            .body()
            .limit(1 << 22)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .to_vec(),
    )?;
    let values = scrape_values(&text);
    let documented = [
        m::OUTBOX_PENDING_COUNT,
        m::OUTBOX_DEAD_COUNT,
        m::OUTBOX_OLDEST_PENDING_SECONDS,
        m::OUTBOX_MAX_DELIVERY_ATTEMPTS,
        m::OUTBOX_PUBLISH_SUCCESS_TOTAL,
        m::OUTBOX_PUBLISH_ERROR_TOTAL,
        m::OUTBOX_DEAD_TOTAL,
        m::OUTBOX_APPENDED_TOTAL,
        m::OUTBOX_OWNED_SHARDS,
        m::LIVE_PUBLISHERS,
        m::PROJECTION_PROCESS_SUCCESS_TOTAL,
        m::PROJECTION_PROCESS_ERROR_TOTAL,
        m::PROJECTION_VERSION_LAG,
        m::PROJECTION_DEAD_LETTERED_TOTAL,
        m::PROJECTION_DUPLICATES_TOTAL,
        m::LIVE_PROJECTORS,
        m::RECEIVER_OUTSTANDING_MESSAGES,
        m::DLQ_MESSAGE_COUNT,
        m::MAILBOX_DEPTH,
    ];
    let histograms = [
        m::OUTBOX_PUBLISH_LATENCY,
        m::PROJECTION_PROCESS_LATENCY,
        m::OUTBOX_CLAIM_BATCH_SIZE,
        m::BACKPRESSURE_WAIT_SECONDS,
    ];
    for name in documented {
        let value = values.get(name).copied();
        assert!(
            value.is_some_and(|v| v.is_finite() && v >= 0.0),
            "{name}: {value:?}"
        );
    }
    for name in histograms {
        assert!(
            values
                .get(&format!("{name}_count"))
                .is_some_and(|v| *v >= 1.0),
            "{name} has no observations"
        );
    }
    let lag = m::offset_lag_metric("catalog_projector");
    assert!(
        values
            .get(&lag)
            .is_some_and(|v| (0.0..60_000.0).contains(v)),
        "{lag}: {:?}",
        values.get(&lag)
    );
    for (name, at_least) in [
        (m::OUTBOX_PUBLISH_SUCCESS_TOTAL, 3.0),
        (m::OUTBOX_APPENDED_TOTAL, 3.0),
        (m::PROJECTION_PROCESS_SUCCESS_TOTAL, 3.0),
        (m::OUTBOX_OWNED_SHARDS, 1.0),
    ] {
        assert!(
            values[name] >= at_least,
            "{name} = {} after traffic",
            values[name]
        );
    }
    // The like was one version ahead of what the projection held (other tests of this
    // process share the recorder, so only a lower bound is certain).
    assert!(values[m::PROJECTION_VERSION_LAG] >= 1.0);
    Ok(())
}

/// Issue 23, first part: a write continues the caller's W3C trace, and the events it appends
/// carry it (`trace_id`, `span_id` of the request's span, `traceparent`); a request without a
/// `traceparent` starts a trace of its own.
#[actix_rt::test]
async fn a_write_continues_the_callers_trace_into_its_events() -> anyhow::Result<()> {
    let t = TestStack::start(None).await?;
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traced = t.catalog().with_header(
        "traceparent",
        &format!("00-{caller_trace}-00f067aa0ba902b7-01"),
    );
    let video = create_video(&traced, "Traced").await?;
    let other = create_video(&t.catalog(), "Untraced").await?;
    let attributes = |id: Uuid| {
        format!("SELECT attributes::text FROM catalog.outbox WHERE aggregate_id = '{id}'")
    };
    let carried: serde_json::Value = serde_json::from_str(&t.text(&attributes(video)).await)?;
    assert_eq!(carried["trace_id"], caller_trace, "{carried}");
    let span_id = carried["span_id"].as_str().unwrap_or_default();
    assert!(
        span_id.len() == 16 && span_id != "00f067aa0ba902b7",
        "the request's own span: {carried}"
    );
    assert_eq!(
        carried["traceparent"],
        format!("00-{caller_trace}-{span_id}-01"),
        "{carried}"
    );
    let started: serde_json::Value = serde_json::from_str(&t.text(&attributes(other)).await)?;
    let new_trace = started["trace_id"].as_str().unwrap_or_default();
    assert!(
        new_trace.len() == 32 && new_trace != caller_trace && new_trace != "0".repeat(32),
        "{started}"
    );
    Ok(())
}
