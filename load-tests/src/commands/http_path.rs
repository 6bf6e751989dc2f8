//! `throughput --via http`: the same measurement through the services' HTTP APIs. Writers
//! create videos with `POST /videos` on catalog (a video row and its `VideoCreated` event in
//! one transaction); catalog's relay publishes them; engagement's consumer projects them into
//! its `videos_replica`. End to end is first request → last video in the replica.

use crate::commands::throughput::{measure_ceilings, ThroughputArgs};
use crate::harness::drive::Origin;
use crate::harness::fixtures::poll_until_done;
use crate::report::chart::Panel;
use crate::report::measures::Rate;
use crate::report::Report;
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
    anyhow::ensure!(
        args.pin.pin_xmin_at.is_none(),
        "--pin-xmin-at applies to --via outbox only (the services' databases are their own)"
    );
    // Installed before the services start, so it counts what their relays record.
    let metrics = courier::metrics::prometheus_handle();
    let pubsub = TestPubSub::get().await?;
    let p = &args.pipeline;
    let ceilings = measure_ceilings(&pubsub, p, args.probe_seconds).await?;
    let db = TestDb::new().await?;
    let project = pubsub.isolated_config();
    let catalog = service_config(&db, &project, "catalog", p.streams);
    let engagement = service_config(&db, &project, "engagement", p.streams);
    // Catalog and engagement only: the path measured is theirs.
    let configs = stack::Configs {
        catalog,
        engagement,
        search: None,
    };
    stack::prepare(&configs).await?;
    let services = Stack::start(&configs, RunOptions::default()).await?;
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
    let failures = {
        let metrics = metrics.clone();
        move || {
            metrics
                .as_ref()
                .map(|m| broker_failure_records(&m.render()))
        }
    };
    let sampler = DrainSampler::start(db.client().await?, failures, origin.instant);
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
    let samples = sampler.stop().await;
    // Read before shutdown, which removes the relay's row.
    let relay = catalog_relay(admin).await?;
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
        .extend(crate::report::measures::Goal::not_converged(&drained));
    let broker_failures = metrics
        .as_ref()
        .map(|m| broker_failure_records(&m.render()));
    report.goals.push(crate::report::measures::Goal {
        name: "publishes failed on the broker's side".into(),
        value: match broker_failures {
            Some(n) => format!(
                "{n} ({:.2} % of {total} events)",
                n as f64 * 100.0 / total.max(1) as f64
            ),
            None => "unknown: no metrics recorder in this process".into(),
        },
        goal: "< 1 % of events".into(),
        met: broker_failures.is_some_and(|n| (n as f64) < 0.01 * total as f64),
    });
    if let (Err(_), Some(relay)) = (&drained, relay) {
        report.notes.push(relay.verdict(&configs.catalog.relay));
    }
    report.panels = samples.panels();
    report.timeline = vec![(write_seconds, "writers stop".into())];
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

/// One look at catalog's relay and engagement's replica while the replica fills.
struct DrainSample {
    seconds: f64,
    relay: Option<RelayReading>,
    broker_failures: Option<u64>,
    /// Rows waiting for a retry after a publish the broker did not acknowledge in time, and
    /// after any other failure.
    waiting_after_timeout: i64,
    waiting_after_error: i64,
    replica: i64,
}

/// Samples the pipeline every few seconds during the drain, for the report's chart: how the
/// relay's limit, its acknowledgements and the broker's failures moved while the emulator
/// slowed, which the end-of-run numbers alone do not show.
struct DrainSampler {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<Vec<DrainSample>>,
}

const SAMPLE_EVERY: Duration = Duration::from_secs(5);

impl DrainSampler {
    /// `broker_failures`: the relays' broker-failure records so far, if this process counts them.
    fn start(
        client: tokio_postgres::Client,
        broker_failures: impl Fn() -> Option<u64> + Send + 'static,
        origin: Instant,
    ) -> Self {
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                match sample(&client, origin, broker_failures()).await {
                    Ok(sample) => samples.push(sample),
                    Err(e) => eprintln!("warning: drain sample skipped: {e:#}"),
                }
                tokio::select! {
                    _ = stopped.notified() => return samples,
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) -> DrainSamples {
        self.stop.notify_one();
        DrainSamples(self.task.await.unwrap_or_default())
    }
}

async fn sample(
    client: &tokio_postgres::Client,
    origin: Instant,
    broker_failures: Option<u64>,
) -> anyhow::Result<DrainSample> {
    let relay = catalog_relay(client).await?;
    let rows = client
        .query_one(
            "SELECT count(*) FILTER (WHERE last_error LIKE '%not acknowledged within%'),
                    count(*) FILTER (WHERE last_error NOT LIKE '%not acknowledged within%'),
                    (SELECT count(*) FROM engagement.videos_replica)
             FROM catalog.outbox
             WHERE published_at IS NULL AND last_error IS NOT NULL",
            &[],
        )
        .await
        .context("count rows waiting for retry")?;
    Ok(DrainSample {
        seconds: origin.elapsed().as_secs_f64(),
        relay,
        broker_failures,
        waiting_after_timeout: rows.get(0),
        waiting_after_error: rows.get(1),
        replica: rows.get(2),
    })
}

struct DrainSamples(Vec<DrainSample>);

impl DrainSamples {
    fn series<F: Fn(&DrainSample) -> Option<f64>>(&self, value: F) -> Vec<(f64, f64)> {
        self.0
            .iter()
            .filter_map(|s| Some((s.seconds, value(s)?)))
            .collect()
    }

    fn panels(&self) -> Vec<Panel> {
        vec![
            Panel::new("videos in engagement's replica", "videos")
                .with("replica", self.series(|s| Some(s.replica as f64))),
            Panel::new("catalog's relay: publishes", "publishes")
                .with(
                    "limit",
                    self.series(|s| Some(s.relay.as_ref()?.limit as f64)),
                )
                .with(
                    "in flight",
                    self.series(|s| Some(s.relay.as_ref()?.in_flight as f64)),
                ),
            Panel::new(
                "catalog's relay: acknowledgement latency (moving average)",
                "s",
            )
            .with(
                "latency",
                self.series(|s| Some(s.relay.as_ref()?.latency_ms / 1_000.0)),
            ),
            Panel::new("publishes failed on the broker's side", "rows")
                .with(
                    "records so far",
                    self.series(|s| Some(s.broker_failures? as f64)),
                )
                .with(
                    "waiting for retry after a timeout",
                    self.series(|s| Some(s.waiting_after_timeout as f64)),
                )
                .with(
                    "waiting for retry after an error",
                    self.series(|s| Some(s.waiting_after_error as f64)),
                ),
        ]
    }
}

/// What catalog's relay last wrote about its publish limit (its heartbeat).
struct RelayReading {
    limit: i32,
    in_flight: i32,
    latency_ms: f64,
}

impl RelayReading {
    /// Whether the broker was what held the pipeline back, in the relay's own numbers: a
    /// limit held near its minimum with acknowledgements slower than the target means Pub/Sub
    /// answered slowly while few publishes were asked of it. Otherwise the reading, for who
    /// looks further.
    fn verdict(&self, relay: &courier::config::RelayConfig) -> String {
        let target = relay.publish_latency_target_millis as f64;
        // A limit of 1 under a higher floor is probe mode: the broker failed publishes and has
        // not acknowledged one since (its recent latency may still read low).
        let probing = self.limit == 1 && relay.publish_limit_min > 1;
        let slow =
            self.latency_ms >= target && self.limit as f64 <= 2.0 * relay.publish_limit_min as f64;
        if probing || slow {
            let mode = if probing {
                " (probe mode: one publish at a time after the broker's failures)"
            } else {
                ""
            };
            format!(
                "the broker was the limit: catalog's relay had {} publishes in flight under a \
                 limit of {}{mode} (its minimum is {}), acknowledged after {:.0} ms on average \
                 against a target of {target:.0} ms. Every video is a new ordering key on a \
                 subscription being read, on which the emulator degrades within a minute \
                 (docs/emulator.md); real Pub/Sub is built for that",
                self.in_flight, self.limit, relay.publish_limit_min, self.latency_ms
            )
        } else {
            format!(
                "catalog's relay at the end: publish limit {}, {} in flight, acknowledgements \
                 after {:.0} ms on average: not the broker's limit by the relay's numbers",
                self.limit, self.in_flight, self.latency_ms
            )
        }
    }
}

async fn catalog_relay(admin: &tokio_postgres::Client) -> anyhow::Result<Option<RelayReading>> {
    let row = admin
        .query_opt(
            "SELECT publish_limit, publishes_in_flight, publish_latency_ms
             FROM catalog.relay_instances
             WHERE publish_limit IS NOT NULL
             ORDER BY heartbeat_at DESC LIMIT 1",
            &[],
        )
        .await
        .context("read catalog's relay heartbeat")?;
    Ok(row.map(|r| RelayReading {
        limit: r.get(0),
        in_flight: r.get(1),
        latency_ms: r.get(2),
    }))
}

/// Publishes that failed on the broker's side (timeouts, `UNAVAILABLE`, …), each a retry
/// record on its row, counted by the services' relays in this process.
///
/// `rendered`: the Prometheus exposition of this process's metrics.
fn broker_failure_records(rendered: &str) -> u64 {
    rendered
        .lines()
        .filter(|line| line.starts_with(courier::metrics::OUTBOX_BROKER_FAILURES_TOTAL))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_failures_are_summed_over_every_series_of_the_counter() {
        let rendered = "\
# TYPE courier_outbox_broker_failures_total counter
courier_outbox_broker_failures_total{service=\"catalog\"} 600
courier_outbox_broker_failures_total 49
courier_outbox_publish_success_total 1000
";
        assert_eq!(broker_failure_records(rendered), 649);
    }

    #[test]
    fn the_broker_is_named_when_acknowledgements_are_slow_at_the_floor_or_the_relay_probes() {
        let relay = courier::config::RelayConfig {
            publish_limit_min: 10,
            publish_latency_target_millis: 2_000,
            ..Default::default()
        };
        let reading = |limit, latency_ms| RelayReading {
            limit,
            in_flight: limit,
            latency_ms,
        };
        let named = |r: RelayReading| r.verdict(&relay).starts_with("the broker was the limit");
        assert!(named(reading(10, 11_000.0)), "slow at the floor");
        assert!(
            named(reading(1, 400.0)),
            "probing, however fast the last acks"
        );
        assert!(!named(reading(10, 400.0)), "fast at the floor");
        assert!(!named(reading(500, 11_000.0)), "slow, far above the floor");
    }
}
