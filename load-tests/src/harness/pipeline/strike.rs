//! Striking a run's faults on its pipeline: the plan's faults at random moments, poison
//! messages, the xmin pins due, and workers that exited restarted ([`crate::harness::faults`] says what
//! each fault is).

use super::Pipeline;
use crate::harness::faults::{Fault, Strikes, HANDLER_LOCK_TIMEOUT};
use crate::harness::processes::Role;
use anyhow::Context as _;
use courier::outbox::attributes::{self, RequiredFields};
use google_cloud_pubsub::model::Message;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use std::time::{Duration, Instant};

/// Until `until`: waits a random gap, publishes a poison message while the plan owes some,
/// strikes a random fault of the plan, restarts workers that exited on their own, and starts
/// and releases the xmin pins due (with no fault to strike, only that).
pub async fn strike(pipeline: &mut Pipeline, until: Instant) -> anyhow::Result<Strikes> {
    let plan = pipeline.plan.clone();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut strikes = Strikes::default();
    let publisher = if plan.poison > 0 {
        Some(
            pipeline
                .rig
                .pubsub()
                .publisher(&pipeline.rig.topic, courier::operations::CLIENT_BATCH_DELAY)
                .await?,
        )
    } else {
        None
    };
    loop {
        let gap = if plan.is_empty() {
            until.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(rng.gen_range(plan.min_gap_secs..=plan.max_gap_secs))
        };
        let next = Instant::now() + gap;
        while Instant::now() < next.min(until) {
            pipeline.keep_workers_up()?;
            pipeline.tend_pin().await?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if Instant::now() >= until {
            // A pin-xmin fault's pin ends with the writes.
            pipeline.tend_pin().await?;
            break;
        }
        if let Some(publisher) = &publisher {
            if strikes.poison.len() < plan.poison as usize {
                let id = uuid::Uuid::now_v7();
                publisher
                    .publish(poison_message(id, strikes.poison.len()))
                    .await
                    .context("publish a poison message")?;
                strikes.poison.push(id.to_string());
                strikes
                    .timeline
                    .push((pipeline.origin.seconds(), format!("poison {id}")));
            }
        }
        if plan.faults.is_empty() {
            continue;
        }
        let fault = plan.faults[rng.gen_range(0..plan.faults.len())];
        let at = pipeline.origin.seconds();
        if fault == Fault::PinXmin && pipeline.xmin_pinned() {
            eprintln!("{at:>7.1} s  pin-xmin drawn while the horizon is pinned already: skipped");
            continue;
        }
        let what = strike_one(pipeline, fault, &mut rng, until).await?;
        eprintln!("{at:>7.1} s  {what}");
        strikes.timeline.push((at, what));
        strikes.faults += 1;
    }
    Ok(strikes)
}

/// Strikes `fault`; `until` is the end of the writes, which a pin does not outlast.
async fn strike_one(
    pipeline: &mut Pipeline,
    fault: Fault,
    rng: &mut StdRng,
    until: Instant,
) -> anyhow::Result<String> {
    Ok(match fault {
        Fault::KillRelay | Fault::KillConsumer => {
            let role = if fault == Fault::KillRelay {
                Role::Relay
            } else {
                Role::Consumer
            };
            let candidates = pipeline.workers.indices(role);
            anyhow::ensure!(!candidates.is_empty(), "no {} to kill", role.name());
            let index = candidates[rng.gen_range(0..candidates.len())];
            pipeline.workers.kill(index).await?;
            let down = Duration::from_millis(rng.gen_range(200..2_000));
            tokio::time::sleep(down).await;
            pipeline.workers.restart(index)?;
            pipeline.refresh_watched();
            format!(
                "kill -9 {}, restarted after {} ms",
                pipeline.workers.label(index),
                down.as_millis()
            )
        }
        Fault::RestartPostgres => {
            let postgres = pipeline
                .stack
                .postgres
                .clone()
                .context("restart-postgres needs the run's own cluster")?;
            tokio::task::spawn_blocking(move || postgres.restart_immediately())
                .await
                .context("the restart task panicked")??;
            "PostgreSQL restarted (immediate stop, crash recovery)".into()
        }
        Fault::FreezeEmulator => {
            let emulator = pipeline
                .stack
                .emulator
                .as_ref()
                .context("freeze-emulator needs the run's own emulator")?;
            let pause = Duration::from_millis(rng.gen_range(1_000..5_000));
            emulator.freeze_for(pause).await;
            format!("emulator frozen for {} ms", pause.as_millis())
        }
        Fault::HandlerTransient => {
            let hold = Duration::from_millis(rng.gen_range(2_000..6_000));
            let locked = hold_rows_behind_locked(pipeline, hold).await?;
            format!(
                "{locked} projection rows with events on their way held locked for {} ms \
                 (handlers time out after {} ms)",
                hold.as_millis(),
                HANDLER_LOCK_TIMEOUT.as_millis()
            )
        }
        Fault::BrokerSlow => {
            let proxy = pipeline
                .stack
                .proxy
                .as_ref()
                .context("broker-slow needs the proxy in front of the emulator")?;
            let window = Duration::from_secs(rng.gen_range(10..=30));
            if rng.gen_bool(0.5) {
                let delay = Duration::from_millis(rng.gen_range(500..3_000));
                proxy.slow_for(delay, window).await;
                format!(
                    "Pub/Sub slow for {} s: every answer {} ms late",
                    window.as_secs(),
                    delay.as_millis()
                )
            } else {
                proxy.silent_for(window).await;
                format!("Pub/Sub silent for {} s", window.as_secs())
            }
        }
        Fault::PinXmin => {
            let now = pipeline.origin.seconds();
            let hold = rng.gen_range(crate::harness::pin::FAULT_HOLD_SECS) as f64;
            let left = until
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            let hold = hold.min(left);
            pipeline
                .pin_xmin("pin-xmin fault".into(), Some(now + hold))
                .await?;
            format!(
                "xmin pinned for {hold:.0} s (a repeatable-read transaction holds its snapshot, \
                 idle)"
            )
        }
    })
}

/// Projection rows a `handler-transient` fault holds at most.
const HELD_ROWS: i64 = 200;

/// How long a `handler-transient` fault looks for rows to hold before holding none: early in
/// a run the consumer may have no projection row yet, and a consumer that keeps up may have
/// none behind at a given instant.
const ROWS_BEHIND_WAIT: Duration = Duration::from_secs(5);

/// Locks, for `hold`, projection rows behind their source row: aggregates whose next events
/// the consumer has yet to apply, so its handlers meet the locks (the most recently written
/// aggregates may have no row yet while the consumer lags; those applied last may have
/// nothing more to come). Then rolls back; returns how many rows it held.
async fn hold_rows_behind_locked(pipeline: &Pipeline, hold: Duration) -> anyhow::Result<u64> {
    let mut client = pipeline.rig.client().await?;
    let tx = client
        .transaction()
        .await
        .context("begin the lock holder")?;
    let looking_until = Instant::now() + ROWS_BEHIND_WAIT;
    let locked = loop {
        // Read committed: each try sees the rows committed since the last.
        let locked = tx
            .execute(
                "SELECT 1 FROM load.projection p JOIN load.source s USING (aggregate_id)
                 WHERE p.version < s.version LIMIT $1 FOR UPDATE OF p",
                &[&HELD_ROWS],
            )
            .await
            .context("lock projection rows behind their source")?;
        if locked > 0 || Instant::now() >= looking_until {
            break locked;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(hold).await;
    tx.rollback().await.context("release the held rows")?;
    Ok(locked)
}

/// Garbage that cannot decode, or a valid payload of an unknown schema version: both must
/// end on the dead-letter topic with their reason.
fn poison_message(event_id: uuid::Uuid, n: usize) -> Message {
    let key = format!("poison-{n}");
    let (data, schema_version) = if n.is_multiple_of(2) {
        (vec![0xffu8; 16], 1)
    } else {
        (Vec::new(), 99)
    };
    Message::new()
        .set_data(data)
        .set_ordering_key(key.clone())
        .set_attributes(attributes::build(
            RequiredFields {
                event_id,
                event_type: crate::harness::workload::EVENT_TYPE,
                aggregate_id: &key,
                aggregate_type: crate::harness::workload::AGGREGATE_TYPE,
                version: 1,
                occurred_at: chrono::Utc::now(),
                schema_version,
            },
            [],
        ))
}
