//! What each stage of the pipeline costs this machine in CPU per event when it runs alone, and
//! the bound that sets: a pipeline on one machine does every stage's work on the same cores,
//! so it can carry at most `cores ÷ Σ CPU per event` events per second, however fast each
//! stage is alone. A ratio against a ceiling measured with the machine to itself says how
//! far the pipeline is from that ceiling; this bound says how much of the gap the machine
//! itself explains.
//!
//! The stages, each measured with the client libraries and SQL directly (no framework):
//! - the write transaction: the workload's business row, write log and outbox row;
//! - raw publish and raw receive+ack on the emulator (measured with the ceilings);
//! - a minimal projection transaction: inbox row, versioned upsert, commit.

use crate::harness::cpu::{cores, shared_machine_bound, CpuMeter, CpuUse};
use crate::harness::drive::{self, Load, Origin, Pace};
use crate::harness::workload::{AppRows, Shape};
use crate::report::measures::{Rate, Ratio};
use anyhow::Context as _;
use courier_testkit::{test_config, TestPubSub};
use std::time::{Duration, Instant};

/// One stage measured alone: what it did and what that cost.
pub struct Stage {
    pub name: String,
    pub events: u64,
    pub cpu: CpuUse,
    pub works_on: WorksOn,
}

/// Whose CPU a stage's work is, besides this process's: the machine-wide count also holds
/// what the other side does meanwhile (the emulator's JVM collecting garbage during a write
/// stage), which is not the stage's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorksOn {
    /// PostgreSQL (and the rest of the machine), not the emulator.
    Database,
    /// The emulator, not PostgreSQL.
    Broker,
}

impl Stage {
    /// CPU-seconds per event of this process and the side the stage works on.
    pub fn per_event(&self) -> f64 {
        let other = match self.works_on {
            WorksOn::Database => self.cpu.rest(),
            WorksOn::Broker => self.cpu.emulator,
        };
        (self.cpu.own + other) / self.events.max(1) as f64
    }
}

/// The write transaction, as the run's writers commit it: `writers` sessions in a closed loop
/// for `seconds`, on a scratch database.
pub async fn write_transaction(
    pubsub: &TestPubSub,
    writers: u32,
    shape: Shape,
    seconds: u64,
) -> anyhow::Result<Stage> {
    let db = crate::harness::workload::database(None, shape.rows).await?;
    let config = test_config(&db, pubsub);
    let meter = CpuMeter::start(&pubsub.host);
    let load = Load {
        writers,
        shape,
        pace: Pace::ClosedLoop,
        duration: Duration::from_secs(seconds),
    };
    let outcome = drive::write_for(&config, "stages.write", Origin::now(), load).await?;
    Ok(Stage {
        name: format!("write transaction ({writers} sessions)"),
        events: outcome.committed,
        cpu: meter.stop(),
        works_on: WorksOn::Database,
    })
}

/// Inbox row, versioned upsert and commit per event, `sessions` sessions for `seconds`, over
/// 1,000 aggregates.
pub async fn projection_transaction(
    pubsub: &TestPubSub,
    sessions: u32,
    seconds: u64,
) -> anyhow::Result<Stage> {
    const INBOX: &str = "INSERT INTO courier.inbox (consumer_group, event_id, publish_time)
                         VALUES ('stages', $1, now()) ON CONFLICT DO NOTHING";
    let db = crate::harness::workload::database(None, AppRows::InPlace).await?;
    let upsert = courier::inbound::VersionedUpsert::new(
        "load.projection",
        &["aggregate_id"],
        &["a", "b", "c"],
    )
    .map_err(anyhow::Error::msg)?;
    let meter = CpuMeter::start(&pubsub.host);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for session in 0..sessions {
        let pool = db.pool.clone();
        let upsert = upsert.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get().await.context("a projection session")?;
            let mut done = 0u64;
            while Instant::now() < deadline {
                let aggregate = crate::harness::workload::aggregate_id(
                    (u64::from(session) + done * u64::from(sessions)) % 1_000,
                );
                let version = i64::try_from(done).unwrap_or(i64::MAX) + 1;
                let tx = conn.transaction().await.context("begin")?;
                let inbox = tx.prepared(INBOX).await?;
                tx.execute(&inbox, &[&uuid::Uuid::now_v7()]).await?;
                let value = format!("v{version}");
                upsert
                    .execute(&tx, &[&aggregate, &value, &value, &value], version)
                    .await?;
                tx.commit().await.context("commit")?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut events = 0;
    for task in tasks {
        events += task.await.context("a projection session panicked")??;
    }
    Ok(Stage {
        name: format!("projection transaction ({sessions} sessions)"),
        events,
        cpu: meter.stop(),
        works_on: WorksOn::Database,
    })
}

/// `cores ÷ Σ stage CPU per event` as a rate, and the run's rate against it (no goal: it says
/// how much of a gap the machine explains).
pub fn machine_bound(stages: &[Stage], measured: &Rate) -> (Rate, Ratio) {
    let per_event: Vec<f64> = stages.iter().map(Stage::per_event).collect();
    let bound = shared_machine_bound(cores(), &per_event);
    let rate = Rate::new(
        &format!(
            "bound on this machine: {} cores ÷ Σ stage CPU/event",
            cores()
        ),
        measured.events,
        measured.events as f64 / bound,
    );
    let ratio = Ratio::to_lowest(
        &format!("{} / machine bound", measured.name),
        measured,
        &[&rate],
        0.0,
    );
    (rate, ratio)
}

/// The report notes: each stage's CPU, and what the bound counts of it.
pub fn describe(stages: &[Stage]) -> Vec<String> {
    let counted: Vec<String> = stages
        .iter()
        .map(|s| format!("{} {:.0} µs", s.name, s.per_event() * 1e6))
        .collect();
    let mut notes = vec![format!(
        "machine bound: stage CPU per event counted (this process + {}): {}",
        "PostgreSQL for database stages, the emulator for broker stages",
        counted.join(" + ")
    )];
    notes.extend(
        stages
            .iter()
            .map(|s| s.cpu.describe(&format!("alone: {}", s.name), s.events)),
    );
    notes
}
