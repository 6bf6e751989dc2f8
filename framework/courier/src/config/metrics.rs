//! `[metrics]`: the Prometheus endpoint of a process without an HTTP API.

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` for the Prometheus scrape endpoint; none means no endpoint.
    pub listen: Option<String>,
}
