//! The emulator's own health during a run: a canary message every 200 ms on a topic and
//! ordered subscription of its own, publish → receive timed by this process. When the
//! emulator as a whole slows (starved of CPU, its JVM collecting garbage, publishes piling
//! up), the canary slows with it, so a report can say that the emulator, not the framework,
//! was a limit. It does not see a stall confined to one subscription: with a new ordering key
//! per aggregate the emulator stops delivering on that subscription while the canary's stays
//! healthy (seen: canary p99 88 ms, 13k of 18k events never delivered); a pipeline report
//! says so when the relay published everything and the projection stalled.

use crate::report::measures::{new_histogram, Latency};
use courier::pubsub::{PubSub, SubscriptionSpec};
use google_cloud_pubsub::model::Message;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the canary publishes.
const EVERY: Duration = Duration::from_millis(200);

/// Above this p99 the emulator counts as the run's limit: its own hop then takes longer than
/// the whole pipeline does on a healthy emulator (p99 ~100 ms in the README's latency runs).
pub const DEGRADED_P99: Duration = Duration::from_secs(1);

/// A canary running until [`Canary::stop`].
pub struct Canary {
    origin: Instant,
    /// `(seconds since origin when published, publish → receive)` of each arrival.
    arrivals: Arc<Mutex<Vec<(f64, Duration)>>>,
    /// Seconds since origin of each publish.
    published: Arc<Mutex<Vec<f64>>>,
    stopped: Arc<AtomicBool>,
}

/// What the canary saw over a window.
#[derive(Debug, Clone)]
pub struct CanaryReading {
    pub latency: Latency,
    pub published: u64,
    pub received: u64,
}

impl CanaryReading {
    /// A note for the report, saying whether the emulator was the limit.
    pub fn note(&self) -> String {
        let missing = self.published.saturating_sub(self.received);
        let verdict = if self.latency.p99_ms >= DEGRADED_P99.as_secs_f64() * 1_000.0 || missing > 0
        {
            "the emulator's own hop degraded: it was a limit of this run (starved of CPU on \
             a saturated machine, or degraded by many ordering keys), which real Pub/Sub would \
             not have been"
        } else {
            "the emulator kept up"
        };
        format!(
            "emulator canary (a message every {} ms on a topic of its own): publish → receive \
             p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {} of {} arrived: {verdict}",
            EVERY.as_millis(),
            self.latency.p50_ms,
            self.latency.p99_ms,
            self.latency.max_ms,
            self.received,
            self.published
        )
    }
}

impl Canary {
    /// Provisions the canary's topic and subscription on `pubsub` and starts it.
    pub async fn start(pubsub: &PubSub, name: &str) -> anyhow::Result<Self> {
        let spec = SubscriptionSpec {
            ordering: true,
            retain_acked: false,
            ..SubscriptionSpec::plain(&format!("{name}.canary"), name)
        };
        pubsub.provision(&spec).await?;
        let subscriber = pubsub.subscriber().await?;
        let publisher = pubsub
            .publisher(name, courier::operations::CLIENT_BATCH_DELAY)
            .await?;
        let origin = Instant::now();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let published = Arc::new(Mutex::new(Vec::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let mut stream = subscriber
            .subscribe(pubsub.subscription_path(&spec.name))
            .build();
        let seen = arrivals.clone();
        // One long-lived stream, never cancelled (a cancelled stream strands messages).
        tokio::spawn(async move {
            while let Some(Ok((message, handler))) = stream.next().await {
                handler.ack();
                let sent = message
                    .attributes
                    .get("sent_micros")
                    .and_then(|v| v.parse::<u64>().ok());
                if let (Some(sent), Ok(mut seen)) = (sent, seen.lock()) {
                    let sent = Duration::from_micros(sent);
                    seen.push((sent.as_secs_f64(), origin.elapsed().saturating_sub(sent)));
                }
            }
        });
        let (count, stop) = (published.clone(), stopped.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(EVERY);
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let at = origin.elapsed();
                let sent = at.as_micros().to_string();
                let message = Message::new()
                    .set_data(b"canary".to_vec())
                    .set_ordering_key("canary")
                    .set_attributes([("sent_micros".to_string(), sent)]);
                // Not awaited: a slow emulator must not slow the canary's schedule.
                drop(publisher.publish(message));
                if let Ok(mut published) = count.lock() {
                    published.push(at.as_secs_f64());
                }
            }
        });
        Ok(Self {
            origin,
            arrivals,
            published,
            stopped,
        })
    }

    /// Stops publishing, waits up to 5 s for what is still on its way, and reads the canaries
    /// published between `from` and `to` (instants of this process).
    pub async fn stop(self, from: Instant, to: Instant) -> CanaryReading {
        self.stopped.store(true, Ordering::Relaxed);
        let window = |at: Instant| at.saturating_duration_since(self.origin).as_secs_f64();
        let (from, to) = (window(from), window(to));
        let in_window = |t: &f64| *t >= from && *t <= to;
        let published_in_window = self
            .published
            .lock()
            .map(|p| p.iter().filter(|t| in_window(t)).count() as u64)
            .unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let arrived = || {
            self.arrivals
                .lock()
                .map(|a| a.iter().filter(|(t, _)| in_window(t)).count() as u64)
                .unwrap_or(0)
        };
        while arrived() < published_in_window && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut histogram = new_histogram();
        if let Ok(arrivals) = self.arrivals.lock() {
            for (_, latency) in arrivals.iter().filter(|(t, _)| in_window(t)) {
                histogram.saturating_record(latency.as_micros() as u64);
            }
        }
        CanaryReading {
            latency: Latency::from_histogram("emulator canary publish → receive", &histogram),
            published: published_in_window,
            received: histogram.len(),
        }
    }
}
