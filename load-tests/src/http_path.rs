//! `throughput --via http`: the same measurement through the services' HTTP APIs. Writers
//! create videos with `POST /videos` on catalog (a video row and its `VideoCreated` event in
//! one transaction); catalog's relay publishes them; engagement's consumer projects them into
//! its `videos_replica`. End to end is first request → last video in the replica.

use crate::drive::Origin;
use crate::fixtures::poll_until_done;
use crate::report::{Rate, Report};
use crate::throughput::{measure_ceilings, ThroughputArgs};
use anyhow::Context as _;
use courier::service::runtime::RunOptions;
use courier::CourierConfig;
use courier_demo::stack::{self, Stack};
use courier_testkit::{TestDb, TestPubSub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A service's config on the run's database: its own schema and role, an isolated Pub/Sub
/// project (the services' topic names are fixed), an HTTP port of its own.
fn service_config(
    db: &TestDb,
    project: &courier::config::PubSubConfig,
    schema: &str,
    streams: u32,
) -> CourierConfig {
    // The deployment defaults (not the test kit's short timeouts): a load run must not turn
    // a slow publish into a dead row.
    let mut config = CourierConfig {
        database: db.service_database(schema),
        pubsub: project.clone(),
        ..CourierConfig::default()
    };
    config.database.pool_size = 16;
    config.http.listen = "127.0.0.1:0".into();
    config.consumer.streams = streams;
    config
}

pub async fn run(args: ThroughputArgs) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    let p = &args.pipeline;
    let ceilings = measure_ceilings(&pubsub, p, args.probe_seconds).await?;
    let db = TestDb::new().await?;
    let project = pubsub.isolated_config();
    let catalog = service_config(&db, &project, "catalog", p.streams);
    let engagement = service_config(&db, &project, "engagement", p.streams);
    stack::prepare(&catalog, &engagement).await?;
    let services = Stack::start(&catalog, &engagement, RunOptions::default()).await?;
    let url = format!("http://{}/videos", services.catalog.addr);

    eprintln!(
        "creating videos over HTTP for {} s with {} writers",
        args.seconds, p.writers
    );
    let origin = Origin::now();
    let created = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let client = reqwest::Client::new();
    let mut writers = Vec::new();
    for _ in 0..p.writers {
        let (client, url) = (client.clone(), url.clone());
        let (created, refused) = (created.clone(), refused.clone());
        writers.push(tokio::spawn(async move {
            let uploader = uuid::Uuid::new_v4();
            while Instant::now() < until {
                let body = serde_json::json!({
                    "uploader_id": uploader,
                    "title": "load test video",
                    "duration_secs": 60,
                });
                let answer = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await;
                match answer {
                    Ok(response) if response.status().as_u16() == 201 => {
                        created.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for writer in writers {
        writer.await.context("an HTTP writer panicked")?;
    }
    let write_seconds = origin.seconds();
    let total = created.load(Ordering::Relaxed);
    let admin = db.client().await?;
    let admin = &admin;
    let drained = poll_until_done(
        origin.instant,
        total,
        "videos in engagement's replica",
        Duration::from_secs(args.drain_timeout_secs),
        Duration::from_millis(200),
        || async move {
            let n: i64 = admin
                .query_one("SELECT count(*) FROM engagement.videos_replica", &[])
                .await
                .context("count the replica")?
                .get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        },
    )
    .await;
    services.shutdown(Duration::from_secs(5)).await;
    // How the catalog's relay fared: rows that needed more than one publish attempt, and dead.
    let outbox = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE publish_attempts > 1), count(*) FILTER (WHERE dead_at IS NOT NULL)
             FROM catalog.outbox",
            &[],
        )
        .await
        .context("read catalog's outbox")?;
    let (retried, dead): (i64, i64) = (outbox.get(0), outbox.get(1));
    let writes = Rate::new(
        "videos created (POST /videos, closed loop)",
        total,
        write_seconds,
    );
    let end_to_end = Rate::new(
        "end to end (first request → last replica row)",
        total,
        *drained.as_ref().unwrap_or(&f64::INFINITY),
    );
    let mut report = ceilings.report(
        "throughput via HTTP: catalog POST /videos → relay → emulator → engagement's replica",
        writes,
        end_to_end,
    );
    report
        .goals
        .extend(crate::report::Goal::not_converged(&drained));
    report.parameters = vec![
        ("outbox_rows_retried".into(), retried.to_string()),
        ("outbox_rows_dead".into(), dead.to_string()),
        ("seconds".into(), args.seconds.to_string()),
        ("writers".into(), p.writers.to_string()),
        ("streams".into(), p.streams.to_string()),
        (
            "refused_or_failed_requests".into(),
            refused.load(Ordering::Relaxed).to_string(),
        ),
    ];
    Ok(report)
}
