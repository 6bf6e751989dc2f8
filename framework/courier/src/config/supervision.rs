//! `[supervision.<kind>]`: each actor kind's restart policy.

use super::error::ConfigError;
use crate::supervision::RestartPolicy;
use serde::Deserialize;

/// Restart policies per actor kind.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionConfig {
    /// The LISTEN connection actor.
    pub notify_listener: RestartPolicy,
    /// The actor that owns shards through advisory locks.
    pub shard_owner: RestartPolicy,
    /// One claimer per owned shard.
    pub claimer: RestartPolicy,
    /// The StreamingPull receiver of a subscription.
    pub receiver: RestartPolicy,
    /// The router that hands deliveries to per-aggregate projectors.
    pub projector_router: RestartPolicy,
    /// The retention janitor.
    pub janitor: RestartPolicy,
}

impl SupervisionConfig {
    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (kind, policy) in [
            ("notify_listener", &self.notify_listener),
            ("shard_owner", &self.shard_owner),
            ("claimer", &self.claimer),
            ("receiver", &self.receiver),
            ("projector_router", &self.projector_router),
            ("janitor", &self.janitor),
        ] {
            policy
                .validate()
                .map_err(|(field, reason)| ConfigError::Invalid {
                    key: format!("supervision.{kind}.{field}"),
                    reason: reason.into(),
                })?;
        }
        Ok(())
    }
}
