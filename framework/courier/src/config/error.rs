//! Why a configuration was refused, always naming the key, file or variable.

/// Why a configuration could not be loaded; always names the file, variable or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config is not valid: {0}")]
    Parse(String),
    #[error("config key {key} is invalid: {reason}")]
    Invalid { key: String, reason: String },
}

pub(crate) fn invalid<T>(key: &str, reason: &str) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    })
}

/// `[a-z_][a-z0-9_]*`, at most 63 bytes: safe to splice into SQL as an identifier.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 63
}
