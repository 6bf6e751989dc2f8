//! `[telemetry]`: where spans are exported.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

/// Trace export. Spans carry W3C trace context whether or not they are exported.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/HTTP (protobuf) URL the services' spans are exported to, for example
    /// `http://127.0.0.1:4318/v1/traces` (an OpenTelemetry collector, which can forward to
    /// Cloud Trace); unset: nothing is exported.
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.contains(char::is_whitespace) {
                return invalid(
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL, for example http://127.0.0.1:4318/v1/traces",
                );
            }
        }
        Ok(())
    }
}
