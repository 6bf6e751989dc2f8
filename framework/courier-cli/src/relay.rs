//! `courier relay`: one relay process; several of them split the shards between them.

use courier::relay::{Relay, RelayOptions};
use courier::CourierConfig;
use std::time::Duration;

#[derive(clap::Args)]
pub struct RelayArgs {
    /// Apply migrations before starting.
    #[arg(long)]
    migrate: bool,
    /// On SIGINT/SIGTERM, how long to wait for in-flight batches to be marked.
    #[arg(long, default_value_t = 10)]
    grace_secs: u64,
}

pub async fn run(config: CourierConfig, args: RelayArgs) -> anyhow::Result<()> {
    if let Some(listen) = &config.metrics.listen {
        courier::metrics::install_prometheus(listen).map_err(anyhow::Error::msg)?;
    }
    if args.migrate {
        tracing::info!(
            "{}",
            crate::describe(&config, &crate::migrate(&config).await?)
        );
    }
    let relay = Relay::spawn(&config, RelayOptions::default())?;
    tracing::info!(instance = %relay.instance_id, "relay running; SIGINT or SIGTERM stops it");
    courier::service::wait_for_signal().await;
    tracing::info!("stopping: releasing shards and draining in-flight batches");
    relay.shutdown(Duration::from_secs(args.grace_secs)).await;
    Ok(())
}
