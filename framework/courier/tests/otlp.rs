//! Issue 23: spans go to `telemetry.otlp_endpoint` over OTLP/HTTP when it is set, and nowhere
//! when it is not. A stand-in collector on 127.0.0.1:0 records what it receives.

use courier::config::TelemetryConfig;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// Listens for OTLP/HTTP trace exports; returns its URL and the bodies it received.
async fn collector() -> anyhow::Result<(String, Arc<Mutex<Vec<Vec<u8>>>>)> {
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/v1/traces", listener.local_addr()?);
    let server = actix_web::HttpServer::new(move || {
        let sink = sink.clone();
        actix_web::App::new().route(
            "/v1/traces",
            actix_web::web::post().to(move |body: actix_web::web::Bytes| {
                let sink = sink.clone();
                async move {
                    if let Ok(mut bodies) = sink.lock() {
                        bodies.push(body.to_vec());
                    }
                    actix_web::HttpResponse::Ok()
                        .content_type("application/x-protobuf")
                        .finish()
                }
            }),
        )
    })
    .listen(listener)?
    .workers(1)
    .run();
    tokio::spawn(server);
    Ok((url, received))
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[actix_rt::test]
async fn spans_are_exported_to_the_configured_endpoint_and_nowhere_without_one(
) -> anyhow::Result<()> {
    let (url, received) = collector().await?;
    let config = TelemetryConfig {
        otlp_endpoint: Some(url),
    };
    let provider = courier::telemetry::tracer_provider(&config, "otlp-test-service")?;
    let subscriber = tracing_subscriber::registry().with(
        courier::telemetry::trace_context_layer_with(provider.clone()),
    );
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("outbox.publish", ordering_key = "video-1").in_scope(|| {});
    });
    // The batch exporter sends from its own thread, with a blocking HTTP client.
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await?;
    assert!(flushed.is_ok(), "flush: {flushed:?}");
    courier_testkit::wait_until(Duration::from_secs(10), "an export", || {
        let got = received.lock().map(|b| !b.is_empty()).unwrap_or(false);
        async move { got }
    })
    .await?;
    let bodies = received.lock().map(|b| b.clone()).unwrap_or_default();
    assert!(
        bodies
            .iter()
            .any(|b| contains(b, "outbox.publish") && contains(b, "otlp-test-service")),
        "the export carries the span and the service name"
    );

    let unset = courier::telemetry::tracer_provider(&TelemetryConfig::default(), "quiet")?;
    let subscriber = tracing_subscriber::registry()
        .with(courier::telemetry::trace_context_layer_with(unset.clone()));
    let before = received.lock().map(|b| b.len()).unwrap_or(0);
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("not.exported").in_scope(|| {});
    });
    let _ = tokio::task::spawn_blocking(move || unset.force_flush()).await?;
    assert_eq!(received.lock().map(|b| b.len()).unwrap_or(0), before);
    Ok(())
}
