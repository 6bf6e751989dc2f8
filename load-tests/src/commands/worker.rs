//! `courier-load worker …` (hidden): the relay or the consumer of a run as a process of its
//! own, so the harness can measure it, kill it with SIGKILL and start it again.

use crate::harness::rig::Rig;
use crate::harness::workload::{AppRows, LoadProjection, Workload};
use courier::inbound::{Consumer, ConsumerOptions, ConsumerSpec};
use courier::relay::{Relay, RelayOptions};
use courier::CourierConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[command(subcommand)]
    role: WorkerRole,
}

#[derive(clap::Subcommand)]
enum WorkerRole {
    /// The relay: claims the run's outbox shards and publishes.
    Relay {
        #[arg(long)]
        config: PathBuf,
    },
    /// The consumer: the workload's projection on the run's subscription.
    Consumer {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        subscription: String,
        #[arg(long)]
        dead_letter_topic: String,
        /// What the events carry (delta projections need contiguous versions).
        #[arg(long, value_enum)]
        workload: Workload,
        /// How the projection writes the read model.
        #[arg(long, value_enum)]
        app_rows: AppRows,
        /// Lock timeout of each projection transaction, milliseconds.
        #[arg(long)]
        lock_timeout_millis: Option<u64>,
    },
}

/// The consumer's arguments for `rig`'s run.
pub fn consumer_args(rig: &Rig) -> Vec<String> {
    let mut args = vec![
        "--subscription".to_string(),
        rig.subscription.name.clone(),
        "--dead-letter-topic".into(),
        rig.dead_letter_topic.clone(),
        "--workload".into(),
        rig.workload.name().into(),
        "--app-rows".into(),
        rig.app_rows.name().into(),
    ];
    if let Some(timeout) = rig.consumer_lock_timeout {
        args.push("--lock-timeout-millis".into());
        args.push(timeout.as_millis().to_string());
    }
    args
}

/// Resolves when the process that started this one is gone (a harness killed with SIGKILL
/// cannot stop its workers itself).
async fn orphaned() {
    let parent = std::os::unix::process::parent_id();
    while std::os::unix::process::parent_id() == parent {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Until SIGTERM, SIGINT or the harness's death.
async fn stopped() {
    tokio::select! {
        _ = courier::service::wait_for_signal() => {}
        _ = orphaned() => {}
    }
}

/// Runs until stopped. A relay hands its shards over on the way out; a consumer simply stops
/// (unacked messages are redelivered, which the inbox makes harmless).
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    match args.role {
        WorkerRole::Relay { config } => {
            let config = CourierConfig::load(&config)?;
            let relay = Relay::spawn(&config, RelayOptions::default())?;
            stopped().await;
            relay.shutdown(Duration::from_secs(5)).await;
        }
        WorkerRole::Consumer {
            config,
            subscription,
            dead_letter_topic,
            workload,
            app_rows,
            lock_timeout_millis,
        } => {
            let config = CourierConfig::load(&config)?;
            let spec = ConsumerSpec {
                group: "load".into(),
                subscription,
                dead_letter_topic,
            };
            let consumer = Consumer::spawn(
                &config,
                spec,
                LoadProjection::new(
                    workload,
                    lock_timeout_millis.map(Duration::from_millis),
                    app_rows,
                )?,
                ConsumerOptions::default(),
            )?;
            stopped().await;
            consumer.kill();
        }
    }
    Ok(())
}
