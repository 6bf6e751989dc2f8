//! `[database]`: the service's PostgreSQL, its schema and role, TLS.

use super::error::{invalid, is_identifier, ConfigError};
use super::value_from_file;
use crate::conninfo::{resolve_tls, SslMode, TlsSettings};
use serde::Deserialize;
use std::path::PathBuf;

/// `Debug` shows the URLs with their passwords redacted ([`redact_url`]).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// libpq-style URL or key=value string of the service's database.
    pub url: String,
    /// A file whose contents (surrounding whitespace trimmed) is `url`: a mounted secret (a
    /// Kubernetes Secret volume, a Cloud Run Secret Manager volume), so that the password is
    /// in no environment variable. Read once, at load. One source per URL: setting `url` too
    /// (in the file or the environment) is refused, as is a file that cannot be read or is
    /// empty; the error names the file.
    pub url_file: Option<PathBuf>,
    /// Schema holding outbox, inbox and offsets; every connection uses it as search_path.
    pub schema: String,
    /// The role that owns the schema. When set, `migrate` creates it (if missing) and the
    /// schema, and applies the migrations as that role, so the service connecting as it can
    /// touch its own schema and nothing else.
    pub role: Option<String>,
    /// Connection used only by `migrate` (a role allowed to create roles and schemas); the
    /// service itself never uses it. Defaults to `url`.
    pub admin_url: Option<String>,
    /// A file whose contents (surrounding whitespace trimmed) is `admin_url`, read at load as
    /// `url_file` is; setting `admin_url` too is refused.
    pub admin_url_file: Option<PathBuf>,
    /// Pooled connections for writes, claims and marks (dedicated LISTEN and lock
    /// connections come on top of these).
    pub pool_size: u32,
    /// How long to wait for a pooled connection before failing (transiently).
    pub connect_timeout_secs: u64,
    /// TLS to the database, as libpq's `sslmode`: `disable`, `prefer` (the default: encrypted
    /// when the server offers it, certificate not checked), `require` (encrypted, certificate
    /// not checked), `verify-ca` (certificate signed by a trusted root), `verify-full` (and
    /// naming the host). May instead be given in the URLs as `sslmode=`.
    pub sslmode: Option<SslMode>,
    /// PEM file of the CA certificates `verify-ca`/`verify-full` trust (with `require` it
    /// upgrades to `verify-ca`, as in libpq); the system's roots when absent. May instead be
    /// given in the URLs as `sslrootcert=`.
    pub ssl_root_cert: Option<PathBuf>,
}

impl DatabaseConfig {
    /// `url` (this section's `url` or `admin_url`) without its TLS parameters, for
    /// tokio-postgres, and the TLS this section asks for on it.
    pub fn connection(&self, url: &str) -> Result<(String, TlsSettings), String> {
        resolve_tls(url, self.sslmode, self.ssl_root_cert.as_ref())
    }

    /// Reads `url_file` into `url` and `admin_url_file` into `admin_url`. `is_set` says
    /// whether the config file or the environment set a dotted key: a URL given both inline
    /// and as a file is refused. Errors name the `*_file` key and the file, never its contents.
    pub(crate) fn read_url_files(
        &mut self,
        is_set: impl Fn(&str) -> bool,
    ) -> Result<(), ConfigError> {
        if let Some(url) = value_from_file("database.url", self.url_file.as_deref(), &is_set)? {
            self.url = url;
        }
        let admin_url_file = self.admin_url_file.as_deref();
        if let Some(url) = value_from_file("database.admin_url", admin_url_file, &is_set)? {
            self.admin_url = Some(url);
        }
        Ok(())
    }

    /// This section's rules; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !is_identifier(&self.schema) {
            return invalid(
                "database.schema",
                "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)",
            );
        }
        if let Some(role) = &self.role {
            if !is_identifier(role) {
                return invalid(
                    "database.role",
                    "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)",
                );
            }
        }
        if self.pool_size < 2 {
            return invalid("database.pool_size", "must be at least 2");
        }
        // A URL read from a file is blamed on the file's key (its origin is that key's).
        let url_key = match self.url_file {
            Some(_) => "database.url_file",
            None => "database.url",
        };
        let admin_url_key = match self.admin_url_file {
            Some(_) => "database.admin_url_file",
            None => "database.admin_url",
        };
        let urls = [
            (url_key, Some(&self.url)),
            (admin_url_key, self.admin_url.as_ref()),
        ];
        for (key, url) in urls {
            let Some(url) = url else { continue };
            let (rest, tls) = self
                .connection(url)
                .or_else(|reason| invalid(key, &reason))?;
            if rest.parse::<tokio_postgres::Config>().is_err() {
                return invalid(key, "is not a PostgreSQL connection string");
            }
            if let Some(path) = tls.root_cert.as_ref().filter(|p| !p.is_file()) {
                return invalid(
                    "database.ssl_root_cert",
                    &format!("{} is not a readable file", path.display()),
                );
            }
        }
        Ok(())
    }
}

/// A PostgreSQL connection string with any password replaced by `***`: the URL form
/// (`postgres://user:secret@host/db`, `?password=secret`) and the key=value form
/// (`password=secret`, quoted or not).
pub fn redact_url(url: &str) -> String {
    let mut redacted = url.to_string();
    if let Some(scheme_end) = redacted.find("://") {
        let rest = scheme_end + 3;
        let authority_end = redacted[rest..]
            .find(['/', '?'])
            .map_or(redacted.len(), |i| rest + i);
        if let Some(at) = redacted[rest..authority_end].rfind('@').map(|i| rest + i) {
            if let Some(colon) = redacted[rest..at].find(':').map(|i| rest + i) {
                redacted.replace_range(colon + 1..at, "***");
            }
        }
    }
    let mut out = String::with_capacity(redacted.len());
    let mut rest = redacted.as_str();
    while let Some(i) = rest.find("password=") {
        let value_start = i + "password=".len();
        out.push_str(&rest[..value_start]);
        out.push_str("***");
        let value = &rest[value_start..];
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            quoted.find('\'').map_or(value.len(), |j| j + 2)
        } else {
            value.find([' ', '&']).unwrap_or(value.len())
        };
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &redact_url(&self.url))
            .field("url_file", &self.url_file)
            .field("schema", &self.schema)
            .field("role", &self.role)
            .field("admin_url", &self.admin_url.as_deref().map(redact_url))
            .field("admin_url_file", &self.admin_url_file)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("sslmode", &self.sslmode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .finish()
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            schema: "courier".into(),
            url_file: None,
            role: None,
            admin_url: None,
            admin_url_file: None,
            pool_size: 16,
            connect_timeout_secs: 10,
            sslmode: None,
            ssl_root_cert: None,
        }
    }
}
