//! `courier-load worker …` (hidden): the relay or the consumer of a run as a process of its
//! own, so the harness can measure it, kill it with SIGKILL and start it again.

use crate::workload::LoadProjection;
use courier::inbound::{Consumer, ConsumerOptions, ConsumerSpec};
use courier::outbox::{Relay, RelayOptions};
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
    },
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
        _ = courier::service::cli::wait_for_signal() => {}
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
                LoadProjection::new()?,
                ConsumerOptions::default(),
            )?;
            stopped().await;
            consumer.kill();
        }
    }
    Ok(())
}
