//! `[http]`: a service's HTTP API.

use super::error::{invalid, ConfigError};
use super::value_from_file;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// `Debug` shows whether a bearer token is set, never the token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `host:port` the service's HTTP server binds (port 0 picks a free one).
    pub listen: String,
    /// When set, write endpoints require `Authorization: Bearer <token>`. Unset on Cloud Run,
    /// where the IAM invoker role authenticates callers before they reach the service.
    pub auth_token: Option<String>,
    /// A file whose contents (surrounding whitespace trimmed) is `auth_token`: a mounted
    /// Secret, so that the token is in no environment variable. Read once, at load. Setting
    /// `auth_token` too is refused, as is a file that cannot be read or is empty; the error
    /// names the file.
    pub auth_token_file: Option<PathBuf>,
    /// Longest a read with `?min_version=` waits for its projection before answering 202.
    pub read_wait_millis: u64,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("listen", &self.listen)
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("auth_token_file", &self.auth_token_file)
            .field("read_wait_millis", &self.read_wait_millis)
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            auth_token: None,
            auth_token_file: None,
            read_wait_millis: 2000,
        }
    }
}

impl HttpConfig {
    pub fn read_wait(&self) -> Duration {
        Duration::from_millis(self.read_wait_millis)
    }

    /// Reads `auth_token_file` into `auth_token`. `is_set` says whether the config file or the
    /// environment set a dotted key: a token given both inline and as a file is refused.
    pub(crate) fn read_token_file(
        &mut self,
        is_set: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        let file = self.auth_token_file.as_deref();
        if let Some(token) = value_from_file("http.auth_token", file, is_set)? {
            self.auth_token = Some(token);
        }
        Ok(())
    }

    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid("http.listen", "must be ip:port, for example 0.0.0.0:8080");
        }
        if matches!(&self.auth_token, Some(token) if token.trim().len() < 16) {
            let key = match self.auth_token_file {
                Some(_) => "http.auth_token_file",
                None => "http.auth_token",
            };
            return invalid(key, "must be at least 16 characters when set");
        }
        if self.read_wait_millis > 60_000 {
            return invalid("http.read_wait_millis", "must be at most 60000");
        }
        Ok(())
    }
}
