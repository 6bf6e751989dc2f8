//! The three services, migrated, provisioned and running in this process.

use crate::client::Api;
use anyhow::Context as _;
use courier::service::runtime::{self, RunOptions, RunningService};
use courier::service::Service;
use courier::CourierConfig;
use std::time::Duration;

pub struct Stack {
    pub catalog: RunningService,
    pub engagement: RunningService,
    /// Absent when the stack was started without it.
    pub search: Option<RunningService>,
    catalog_token: Option<String>,
    engagement_token: Option<String>,
}

/// Each service's config; without one for search, the stack runs catalog and engagement only
/// (the load harness's HTTP path measures them alone).
pub struct Configs {
    pub catalog: CourierConfig,
    pub engagement: CourierConfig,
    pub search: Option<CourierConfig>,
}

impl Configs {
    /// The services of the stack with their configs.
    fn services(&self) -> Vec<(Service, &CourierConfig)> {
        let mut services = vec![
            (courier_catalog::service(), &self.catalog),
            (courier_engagement::service(), &self.engagement),
        ];
        if let Some(search) = &self.search {
            services.push((courier_search::service(), search));
        }
        services
    }
}

/// Migrates the services, then provisions them: every subscription exists before any service
/// publishes (Pub/Sub keeps nothing a topic receives while it has no subscription). Returns
/// what was done, one line each.
pub async fn prepare(configs: &Configs) -> anyhow::Result<Vec<String>> {
    let services = configs.services();
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
    /// Starts the services (already prepared); if one fails to start, those started stop.
    pub async fn start(configs: &Configs, options: RunOptions) -> anyhow::Result<Self> {
        let catalog = RunningService::start(
            courier_catalog::service(),
            &configs.catalog,
            options.clone(),
        )
        .await
        .context("start catalog")?;
        let engagement = match RunningService::start(
            courier_engagement::service(),
            &configs.engagement,
            options.clone(),
        )
        .await
        {
            Ok(running) => running,
            Err(e) => {
                catalog.kill();
                return Err(anyhow::Error::new(e).context("start engagement"));
            }
        };
        let search = match &configs.search {
            None => None,
            Some(config) => {
                match RunningService::start(courier_search::service(), config, options).await {
                    Ok(running) => Some(running),
                    Err(e) => {
                        catalog.kill();
                        engagement.kill();
                        return Err(anyhow::Error::new(e).context("start search"));
                    }
                }
            }
        };
        Ok(Self {
            catalog,
            engagement,
            search,
            catalog_token: configs.catalog.http.auth_token.clone(),
            engagement_token: configs.engagement.http.auth_token.clone(),
        })
    }

    pub fn catalog_api(&self) -> Api {
        Api::new(self.catalog.addr, self.catalog_token.clone())
    }

    pub fn engagement_api(&self) -> Api {
        Api::new(self.engagement.addr, self.engagement_token.clone())
    }

    /// The search service's API (read-only: no token), when it runs.
    pub fn search_api(&self) -> Option<Api> {
        self.search
            .as_ref()
            .map(|search| Api::new(search.addr, None))
    }

    pub async fn shutdown(self, grace: Duration) {
        if let Some(search) = self.search {
            search.shutdown(grace).await;
        }
        self.engagement.shutdown(grace).await;
        self.catalog.shutdown(grace).await;
    }
}
