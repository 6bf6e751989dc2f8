//! Issue 23: one trace from the HTTP write to the projection in the other service. This binary
//! records every finished span in memory (`courier_testkit::record_spans`).

mod support;

use courier_testkit::wait_until;
use std::time::Duration;
use support::{create_video, TestStack};

/// A span's attribute `name` as text; empty when it has none.
fn attribute_of(span: &opentelemetry_sdk::trace::SpanData, name: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| kv.value.to_string())
        .unwrap_or_default()
}

/// A video created with a W3C `traceparent` reaches engagement's replica in the same trace:
/// catalog's `http.request` continues the caller's trace, and engagement's
/// `projection.process` of the event is its child (through the event's `traceparent`
/// attribute), carrying the event's ids, its consumer group and its delivery attempt. The
/// relay's `outbox.publish` of the event is linked to the request, with the message id the
/// projection saw.
#[actix_rt::test]
async fn a_write_its_publish_and_its_projection_share_the_callers_trace() -> anyhow::Result<()> {
    let spans = courier_testkit::record_spans();
    let t = TestStack::start(None).await?;
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let traced = t.catalog().with_header(
        "traceparent",
        &format!("00-{caller_trace}-b7ad6b7169203331-01"),
    );
    let video = create_video(&traced, "Traced across services").await?;

    let in_trace = || {
        spans
            .get_finished_spans()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.span_context.trace_id().to_string() == caller_trace)
            .collect::<Vec<_>>()
    };
    let video_id = video.to_string();
    // The relay's publish span ends at the broker's acknowledgement, which can come after the
    // subscriber has already applied the message: wait for all three spans, not the last hop.
    let is_engagement_projection = |s: &opentelemetry_sdk::trace::SpanData| {
        s.name == "projection.process"
            && attribute_of(s, "consumer_group").starts_with("engagement_")
            && attribute_of(s, "ordering_key") == video_id
    };
    let is_publish_of = |s: &opentelemetry_sdk::trace::SpanData| {
        s.name == "outbox.publish" && attribute_of(s, "ordering_key") == video_id
    };
    wait_until(
        Duration::from_secs(30),
        "the request's, the projection's and the publish's spans finished",
        || {
            let traced = in_trace();
            let found = traced.iter().any(|s| s.name == "http.request")
                && traced.iter().any(is_engagement_projection)
                && spans
                    .get_finished_spans()
                    .unwrap_or_default()
                    .iter()
                    .any(is_publish_of);
            async move { found }
        },
    )
    .await?;

    let spans_in_trace = in_trace();
    let request = spans_in_trace
        .iter()
        .find(|s| s.name == "http.request")
        .ok_or_else(|| anyhow::anyhow!("no http.request span in the trace: {spans_in_trace:?}"))?;
    assert_eq!(
        request.parent_span_id.to_string(),
        "b7ad6b7169203331",
        "the request continues the caller's span"
    );
    // Engagement's projection (the search indexer applies the same event in the same trace).
    let projection = spans_in_trace
        .iter()
        .find(|s| is_engagement_projection(s))
        .ok_or_else(|| anyhow::anyhow!("no engagement projection span"))?;
    assert_eq!(
        projection.parent_span_id,
        request.span_context.span_id(),
        "the projection is a child of the request that wrote the event"
    );
    let attribute = |name: &str| attribute_of(projection, name);
    assert_eq!(attribute("ordering_key"), video_id);
    assert!(!attribute("event_id").is_empty() && !attribute("message_id").is_empty());
    assert!(
        attribute("consumer_group").starts_with("engagement_"),
        "{}",
        attribute("consumer_group")
    );
    assert_eq!(attribute("delivery_attempt"), "1");

    // The relay's publish: a span of its own, linked to the request that wrote the event.
    let all = spans.get_finished_spans().unwrap_or_default();
    let publish = all
        .iter()
        .find(|s| {
            s.name == "outbox.publish"
                && s.links.iter().any(|link| {
                    link.span_context.trace_id() == request.span_context.trace_id()
                        && link.span_context.span_id() == request.span_context.span_id()
                })
        })
        .ok_or_else(|| {
            let publishes: Vec<_> = all.iter().filter(|s| s.name == "outbox.publish").collect();
            anyhow::anyhow!("no outbox.publish span linked to the request: {publishes:?}")
        })?;
    assert_eq!(attribute_of(publish, "ordering_key"), video_id);
    assert_eq!(attribute_of(publish, "message_id"), attribute("message_id"));
    Ok(())
}

/// Dead-lettering is an event on the message's processing span, in the writer's trace: an
/// event engagement cannot decode, written in a trace, ends in the dead-letter topic and its
/// `projection.process` span records `message dead-lettered`.
#[actix_rt::test]
async fn dead_lettering_is_an_event_on_the_writers_trace() -> anyhow::Result<()> {
    let spans = courier_testkit::record_spans();
    let t = TestStack::start(None).await?;
    let trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let poison = courier::outbox::NewEvent::new(
        "catalog.video.events",
        "video",
        uuid::Uuid::new_v4().to_string(),
        "video.created",
        1,
        b"\xff\xff not a video event".to_vec(),
    )
    .with_traceparent(format!("00-{trace}-051581bf3cb55c13-01"));
    let mut conn = t.db.pool.get().await?;
    let tx = conn.transaction().await?;
    courier::outbox::Outbox::new(&t.catalog_config)
        .append(&tx, poison)
        .await?;
    tx.commit().await?;

    wait_until(
        Duration::from_secs(30),
        "the dead-lettering recorded on the message's span",
        || {
            let found = spans
                .get_finished_spans()
                .unwrap_or_default()
                .iter()
                .any(|s| {
                    s.name == "projection.process"
                        && s.span_context.trace_id().to_string() == trace
                        && s.parent_span_id.to_string() == "051581bf3cb55c13"
                        && s.events.iter().any(|e| e.name == "message dead-lettered")
                });
            async move { found }
        },
    )
    .await?;
    Ok(())
}
