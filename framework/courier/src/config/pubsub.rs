//! `[pubsub]`: the Google Cloud project and, locally, the emulator.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PubSubConfig {
    /// Google Cloud project that owns the topics and subscriptions.
    pub project: String,
    /// `host:port` of the Pub/Sub emulator; when set, every client talks plaintext to it with
    /// anonymous credentials. Overridden by `PUBSUB_EMULATOR_HOST`.
    pub emulator_host: Option<String>,
}

impl Default for PubSubConfig {
    fn default() -> Self {
        Self {
            project: "courier-local".into(),
            emulator_host: None,
        }
    }
}

impl PubSubConfig {
    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.project.is_empty() {
            return invalid("pubsub.project", "must not be empty");
        }
        if let Some(host) = &self.emulator_host {
            if !host.contains(':') || host.contains('/') {
                return invalid("pubsub.emulator_host", "must be host:port");
            }
        }
        Ok(())
    }
}
