//! Both services, migrated, provisioned and running in this process.

use crate::client::Api;
use anyhow::Context as _;
use courier::service::runtime::{self, RunOptions, RunningService};
use courier::CourierConfig;
use std::time::Duration;

pub struct Stack {
    pub catalog: RunningService,
    pub engagement: RunningService,
    catalog_token: Option<String>,
    engagement_token: Option<String>,
}

/// Migrates both services, then provisions both: every subscription exists before either
/// service publishes (Pub/Sub keeps nothing a topic receives while it has no subscription).
/// Returns what was done, one line each.
pub async fn prepare(
    catalog: &CourierConfig,
    engagement: &CourierConfig,
) -> anyhow::Result<Vec<String>> {
    let services = [
        (courier_catalog::service(), catalog),
        (courier_engagement::service(), engagement),
    ];
    let mut lines = Vec::new();
    for (service, config) in &services {
        let report = runtime::migrate(service, config)
            .await
            .with_context(|| format!("migrate {}", service.name))?;
        lines.push(format!(
            "{}: {} migration(s) applied, {} already applied",
            service.name,
            report.applied.len(),
            report.already_applied
        ));
    }
    for (service, config) in &services {
        let created = runtime::provision(service, config)
            .await
            .with_context(|| format!("provision {}", service.name))?;
        lines.extend(
            created
                .into_iter()
                .map(|line| format!("{}: created {line}", service.name)),
        );
    }
    Ok(lines)
}

impl Stack {
    /// Starts both services (already prepared).
    pub async fn start(
        catalog: &CourierConfig,
        engagement: &CourierConfig,
        options: RunOptions,
    ) -> anyhow::Result<Self> {
        let catalog_service =
            RunningService::start(courier_catalog::service(), catalog, options.clone())
                .await
                .context("start catalog")?;
        let engagement_service =
            match RunningService::start(courier_engagement::service(), engagement, options).await {
                Ok(running) => running,
                Err(e) => {
                    catalog_service.kill();
                    return Err(anyhow::Error::new(e).context("start engagement"));
                }
            };
        Ok(Self {
            catalog: catalog_service,
            engagement: engagement_service,
            catalog_token: catalog.http.auth_token.clone(),
            engagement_token: engagement.http.auth_token.clone(),
        })
    }

    pub fn catalog_api(&self) -> Api {
        Api::new(self.catalog.addr, self.catalog_token.clone())
    }

    pub fn engagement_api(&self) -> Api {
        Api::new(self.engagement.addr, self.engagement_token.clone())
    }

    pub async fn shutdown(self, grace: Duration) {
        self.engagement.shutdown(grace).await;
        self.catalog.shutdown(grace).await;
    }
}
