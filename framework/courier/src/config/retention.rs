//! `[retention]`: how long published outbox rows, versions and inbox rows are kept.

use super::error::{invalid, ConfigError};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Run the janitor in this process (one per deployment is enough; more are harmless).
    pub enabled: bool,
    /// Published (or skipped) outbox rows older than this are deleted; dead and pending rows
    /// never are. 0: the relay deletes each row as it marks it published, keeping no
    /// history; its mark then writes no new row version.
    pub outbox_hours: u64,
    /// How long an appended version is remembered in the version ledger (`outbox_versions`),
    /// which refuses a second append of it as a conflict, published or not, whatever
    /// `outbox_hours` keeps.
    pub version_hours: u64,
    /// Processed inbox rows older than this are deleted. Keep it longer than Pub/Sub can
    /// redeliver or replay (7 days of retained messages by default), or a late duplicate
    /// would apply twice.
    pub inbox_hours: u64,
    /// Rows per DELETE statement: small, so no statement holds locks long.
    pub batch_size: u32,
    /// Time between sweeps.
    pub interval_secs: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            outbox_hours: 7 * 24,
            version_hours: 7 * 24,
            inbox_hours: 14 * 24,
            batch_size: 1000,
            interval_secs: 300,
        }
    }
}

impl RetentionConfig {
    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.inbox_hours < 7 * 24 {
            return invalid(
                "retention.inbox_hours",
                "must be at least 168 (7 days): Pub/Sub can redeliver or replay a message that long, and the inbox must still know it",
            );
        }
        if self.version_hours < 1 {
            return invalid(
                "retention.version_hours",
                "must be at least 1: a version is refused a second append only while the ledger remembers it",
            );
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return invalid("retention.batch_size", "must be between 1 and 100000");
        }
        if self.interval_secs < 1 {
            return invalid("retention.interval_secs", "must be at least 1");
        }
        Ok(())
    }
}
