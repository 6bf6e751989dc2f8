//! Deployment configuration: one TOML file per deployment (`deploy/*/courier.toml`) plus
//! environment overrides, validated once at load with errors that name the offending key.
//!
//! Overrides: `COURIER_<SECTION>__<KEY>=value` sets `<section>.<key>` (for example
//! `COURIER_RELAY__SHARD_COUNT=16`); `PUBSUB_EMULATOR_HOST` sets `pubsub.emulator_host` as
//! Google's own tools do.

mod consumer;
mod database;
mod error;
mod http;
mod metrics;
mod pubsub;
mod relay;
mod retention;
mod supervision;
mod telemetry;

pub use crate::conninfo::SslMode;
pub use consumer::{ConsumerConfig, StartFrom};
pub use database::{redact_url, DatabaseConfig};
pub use error::{is_identifier, ConfigError};
pub use http::HttpConfig;
pub use metrics::MetricsConfig;
pub use pubsub::PubSubConfig;
pub use relay::RelayConfig;
pub use retention::RetentionConfig;
pub use supervision::SupervisionConfig;
pub use telemetry::TelemetryConfig;

use error::invalid;
use serde::Deserialize;
use std::path::Path;

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "COURIER_";
/// Names the config file for the binaries; carries the prefix but is not an override.
pub const CONFIG_PATH_ENV: &str = "COURIER_CONFIG";

/// The whole configuration of one Courier process.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CourierConfig {
    /// Where the service's PostgreSQL is and which schema holds the framework's tables.
    pub database: DatabaseConfig,
    /// Which Pub/Sub project and endpoint to use.
    pub pubsub: PubSubConfig,
    /// Outbox relay tuning.
    pub relay: RelayConfig,
    /// Read-side tuning: receiving, projecting, dead-lettering.
    pub consumer: ConsumerConfig,
    /// Restart policies per actor kind.
    pub supervision: SupervisionConfig,
    /// Prometheus exporter of a process without an HTTP API (the bare relay); services serve
    /// `/metrics` on their HTTP port instead.
    pub metrics: MetricsConfig,
    /// A service's HTTP API, health and metrics endpoints.
    pub http: HttpConfig,
    /// How long published outbox rows and processed inbox rows are kept.
    pub retention: RetentionConfig,
    /// Where spans are exported (OpenTelemetry).
    pub telemetry: TelemetryConfig,
}

impl CourierConfig {
    /// Reads `path`, applies the process environment, validates.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_source(&text, Some(path), std::env::vars())
    }

    /// Defaults, then the process environment, validated.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_toml_and_env("", std::env::vars())
    }

    /// Parses `text`, applies `env` overrides, validates.
    pub fn from_toml_and_env(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::from_source(text, None, env)
    }

    /// [`Self::from_toml_and_env`] for the text of `file`. A bad value's error says where it
    /// came from: the environment variable that set it, the file, or the default.
    fn from_source(
        text: &str,
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let in_file = table.clone();
        let mut set_by_env = std::collections::HashMap::new();
        for (name, value) in env {
            if let Some(key) = apply_env_override(&mut table, &name, &value)? {
                set_by_env.insert(key, name);
            }
        }
        let mut config: CourierConfig = toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        // Secrets given as files are read before validation, so their values are checked too.
        let is_set = |key: &str| has_key(&table, key);
        let read = config
            .database
            .read_url_files(is_set)
            .and_then(|()| config.http.read_token_file(is_set));
        read.and_then(|()| config.validate())
            .map_err(|error| match error {
                ConfigError::Invalid { key, reason } => {
                    let origin = match (set_by_env.get(&key), file) {
                        (Some(variable), _) => format!("environment variable {variable}"),
                        (None, Some(file)) if has_key(&in_file, &key) => {
                            format!("config file {}", file.display())
                        }
                        (None, _) if has_key(&in_file, &key) => "the config text".into(),
                        (None, _) => "the default".into(),
                    };
                    ConfigError::Invalid {
                        reason: format!("{reason} (value from {origin})"),
                        key,
                    }
                }
                other => other,
            })?;
        Ok(config)
    }

    /// Checks ranges and formats, naming the key of the first bad value. Each section's
    /// rules sit beside its fields, in its own `validate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.pubsub.validate()?;
        self.relay.validate()?;
        self.consumer.validate()?;
        self.http.validate()?;
        self.retention.validate()?;
        self.supervision.validate()?;
        self.telemetry.validate()
    }
}

/// The value of the dotted `key` read from the file `<key>_file` names, when it names one
/// (`database.url` from `database.url_file`). `is_set` says whether the config file or the
/// environment set a key: a value given both inline and as a file is refused. Errors name
/// the `*_file` key and the file, never the contents.
pub(crate) fn value_from_file(
    key: &str,
    file: Option<&Path>,
    is_set: impl Fn(&str) -> bool,
) -> Result<Option<String>, ConfigError> {
    let Some(path) = file else {
        return Ok(None);
    };
    let file_key = format!("{key}_file");
    if is_set(key) {
        return invalid(
            &file_key,
            &format!("is set together with {key}: set only one of them"),
        );
    }
    read_secret_file(&file_key, path).map(Some)
}

/// The trimmed contents of the secret file `path`, which the config key `key` names.
fn read_secret_file(key: &str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
        key: key.into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let value = text.trim();
    if value.is_empty() {
        return Err(ConfigError::Invalid {
            key: key.into(),
            reason: format!("{} is empty", path.display()),
        });
    }
    Ok(value.to_owned())
}

/// Whether `table` sets the dotted `key` (`relay.shard_count`).
fn has_key(table: &toml::Table, key: &str) -> bool {
    let mut node = Some(table);
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(value) = node.and_then(|t| t.get(part)) else {
            return false;
        };
        if parts.peek().is_none() {
            return true;
        }
        node = value.as_table();
    }
    false
}

/// Applies one environment variable if it is an override; returns the dotted key it set.
fn apply_env_override(
    table: &mut toml::Table,
    name: &str,
    value: &str,
) -> Result<Option<String>, ConfigError> {
    let path: Vec<String> = if name == "PUBSUB_EMULATOR_HOST" {
        if value.is_empty() {
            return Ok(None);
        }
        vec!["pubsub".into(), "emulator_host".into()]
    } else if name == CONFIG_PATH_ENV {
        return Ok(None);
    } else if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
        rest.split("__").map(str::to_ascii_lowercase).collect()
    } else {
        return Ok(None);
    };
    if path.len() < 2 || path.iter().any(String::is_empty) {
        return Err(ConfigError::Invalid {
            key: name.into(),
            reason: "environment overrides look like COURIER_<SECTION>__<KEY>".into(),
        });
    }
    let mut node = table;
    for section in &path[..path.len() - 1] {
        let entry = node
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            key: name.into(),
            reason: format!("{section} is not a section"),
        })?;
    }
    // A value that parses as a TOML scalar (number, boolean) is taken as such, else as a string.
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_table())
        .unwrap_or_else(|| toml::Value::String(value.into()));
    node.insert(path[path.len() - 1].clone(), parsed);
    Ok(Some(path.join(".")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(config.relay.claim_batch_size, 200);
        assert_eq!(config.database.schema, "courier");
    }

    #[test]
    fn passwords_and_the_bearer_token_never_show_in_debug_output() {
        let secrets = [
            "s3cret-pass",
            "other-secret",
            "qs-secret",
            "token-0123456789-secret",
        ];
        let config = CourierConfig::from_toml_and_env(
            "[database]\nurl = \"postgres://catalog:s3cret-pass@db.internal:5432/app?sslmode=require\"\n\
             admin_url = \"host=db user=postgres password='other-secret' dbname=app\"\n\
             [http]\nauth_token = \"token-0123456789-secret\"\n",
            env(&[]),
        )
        .expect("valid");
        for rendered in [format!("{config:?}"), format!("{config:#?}")] {
            for secret in secrets {
                assert!(!rendered.contains(secret), "{secret} in {rendered}");
            }
            assert!(rendered.contains("catalog:***@db.internal"), "{rendered}");
            assert!(rendered.contains("<redacted>"), "{rendered}");
        }
        assert_eq!(
            redact_url("postgres://u@h/db?password=qs-secret&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("host=h password=p user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        // A URL that does not parse is refused naming the key, not echoing the value.
        let err = CourierConfig::from_toml_and_env(
            "[database]\nurl = \"postgres://u:s3cret-pass@h:notaport/db\"\n",
            env(&[]),
        )
        .expect_err("bad url");
        assert!(!err.to_string().contains("s3cret-pass"), "{err}");
        // An environment override is redacted the same way.
        let config = CourierConfig::from_toml_and_env(
            "",
            env(&[("COURIER_DATABASE__URL", "postgres://a:s3cret-pass@h/db")]),
        )
        .expect("valid");
        assert!(!format!("{config:?}").contains("s3cret-pass"));
    }

    #[test]
    fn default_transient_retries_outlast_a_thirty_second_lock() {
        let c = ConsumerConfig::default();
        let one_delivery = c.transient_backoff().least_total(c.transient_retries);
        assert!(one_delivery >= Duration::from_secs(20), "{one_delivery:?}");
        // Before a dead letter: every delivery's retries, not counting lock waits or
        // Pub/Sub's own redelivery backoff.
        assert!(one_delivery * c.max_delivery_attempts >= Duration::from_secs(60));
    }

    #[test]
    fn env_overrides_file_and_emulator_host_is_honoured() {
        let config = CourierConfig::from_toml_and_env(
            "[relay]\nshard_count = 4\n",
            env(&[
                ("COURIER_RELAY__SHARD_COUNT", "16"),
                ("COURIER_DATABASE__SCHEMA", "catalog"),
                ("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085"),
                ("UNRELATED", "x"),
            ]),
        )
        .expect("valid");
        assert_eq!(config.relay.shard_count, 16);
        assert_eq!(config.database.schema, "catalog");
        assert_eq!(
            config.pubsub.emulator_host.as_deref(),
            Some("127.0.0.1:8085")
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = CourierConfig::from_toml_and_env("[relay]\nshard_cuont = 4\n", env(&[]))
            .expect_err("unknown key");
        assert!(err.to_string().contains("shard_cuont"), "{err}");
        let err = CourierConfig::from_toml_and_env("", env(&[("COURIER_RELAY__BATCH", "4")]))
            .expect_err("unknown env key");
        assert!(err.to_string().contains("batch"), "{err}");
    }

    #[test]
    fn the_version_ledger_must_remember_versions_for_at_least_an_hour() {
        let err = CourierConfig::from_toml_and_env("[retention]\nversion_hours = 0\n", env(&[]))
            .expect_err("version_hours = 0");
        assert!(err.to_string().contains("retention.version_hours"), "{err}");
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(config.retention.version_hours, 168);
    }

    #[test]
    fn no_outbox_retention_means_published_rows_are_deleted_by_the_relay() {
        use crate::relay::store::PublishedRows;
        let config = CourierConfig::from_toml_and_env("[retention]\noutbox_hours = 0\n", env(&[]))
            .expect("outbox_hours = 0 is valid");
        assert_eq!(
            PublishedRows::from_config(&config.retention),
            PublishedRows::Deleted
        );
        let config = CourierConfig::from_toml_and_env("", env(&[])).expect("defaults");
        assert_eq!(
            PublishedRows::from_config(&config.retention),
            PublishedRows::Kept
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (toml, key) in [
            ("[relay]\nshard_count = 0\n", "relay.shard_count"),
            (
                "[relay]\nclaim_batch_size = 5000\n",
                "relay.claim_batch_size",
            ),
            ("[database]\nschema = \"Bad-Name\"\n", "database.schema"),
            (
                "[supervision.claimer]\nmax_restarts = 0\n",
                "supervision.claimer.max_restarts",
            ),
            ("[consumer]\nstreams = 0\n", "consumer.streams"),
            (
                "[consumer]\nlease_extension_secs = 5\n",
                "consumer.lease_extension_secs",
            ),
            ("[database]\nrole = \"Catalog\"\n", "database.role"),
            ("[http]\nlisten = \"localhost\"\n", "http.listen"),
            ("[http]\nauth_token = \"short\"\n", "http.auth_token"),
            ("[retention]\ninbox_hours = 24\n", "retention.inbox_hours"),
            ("[retention]\nbatch_size = 0\n", "retention.batch_size"),
            (
                "[consumer]\nstart_from = \"yesterday\"\n",
                "consumer.start_from",
            ),
            (
                "[consumer]\ntransient_backoff_first_millis = 500\ntransient_backoff_cap_millis = 100\n",
                "consumer.transient_backoff_cap_millis",
            ),
            ("[consumer]\ngate_timeout_secs = 0\n", "consumer.gate_timeout_secs"),
            (
                "[telemetry]\notlp_endpoint = \"collector:4318\"\n",
                "telemetry.otlp_endpoint",
            ),
            (
                "[database]\nurl = \"postgres://h/db?sslmode=verify\"\n",
                "database.url",
            ),
            (
                "[database]\nsslmode = \"require\"\nadmin_url = \"host=h sslmode=disable\"\n",
                "database.admin_url",
            ),
            (
                "[database]\nssl_root_cert = \"/nonexistent/ca.pem\"\n",
                "database.ssl_root_cert",
            ),
        ] {
            let err = CourierConfig::from_toml_and_env(toml, env(&[])).expect_err(toml);
            assert!(
                matches!(&err, ConfigError::Invalid { key: k, .. } if k == key),
                "{toml}: {err}"
            );
        }
        let err = CourierConfig::from_toml_and_env("[relay]\nshard_count = \"many\"\n", env(&[]))
            .expect_err("type");
        assert!(err.to_string().contains("shard_count"), "{err}");
        let err = CourierConfig::from_toml_and_env("[database]\nsslmode = \"verify\"\n", env(&[]))
            .expect_err("sslmode");
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn a_bad_value_says_where_it_came_from() {
        let from_env = CourierConfig::from_toml_and_env(
            "[relay]\nshard_count = 8\n",
            env(&[("COURIER_RELAY__SHARD_COUNT", "0")]),
        )
        .expect_err("shard_count 0");
        assert!(
            from_env
                .to_string()
                .contains("environment variable COURIER_RELAY__SHARD_COUNT"),
            "{from_env}"
        );
        let dir = std::env::temp_dir().join(format!("courier-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[relay]\nclaim_batch_size = 5000\n").expect("write");
        let from_file = CourierConfig::from_source(
            &std::fs::read_to_string(&file).expect("read"),
            Some(&file),
            env(&[]),
        )
        .expect_err("claim_batch_size 5000");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            from_file
                .to_string()
                .contains(&format!("config file {}", file.display())),
            "{from_file}"
        );
        let cross_field =
            CourierConfig::from_toml_and_env("[relay]\nclaim_lease_secs = 5\n", env(&[]))
                .expect_err("publish timeout 20 s with a 5 s lease");
        assert!(
            cross_field
                .to_string()
                .contains("relay.publish_timeout_secs"),
            "{cross_field}"
        );
        assert!(
            cross_field.to_string().contains("the default"),
            "{cross_field}"
        );
    }

    #[test]
    fn every_shipped_config_loads_and_the_config_path_variable_is_not_an_override() {
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
        let mut checked = 0;
        for dir in ["local", "cloudrun", "k8s"] {
            let Ok(entries) = std::fs::read_dir(format!("{deploy}/{dir}")) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    let text = std::fs::read_to_string(&path).expect("readable");
                    CourierConfig::from_toml_and_env(
                        &text,
                        env(&[("COURIER_CONFIG", "/etc/courier/catalog.toml")]),
                    )
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    checked += 1;
                }
            }
        }
        assert!(checked >= 3, "only {checked} shipped configs found");
    }

    /// A directory of this test's own, removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("courier-config-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }

        fn file(&self, name: &str, contents: &str) -> std::path::PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).expect("write");
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn url_files_are_read_trimmed_at_load() {
        let dir = TempDir::new("url-file");
        let url = dir.file(
            "url",
            "postgres://catalog:s3cret-pass@db.internal/courier\n",
        );
        let admin = dir.file(
            "admin-url",
            "  host=/cloudsql/p:r:i user=postgres password=x \n",
        );
        let config = CourierConfig::from_toml_and_env(
            &format!("[database]\nurl_file = {:?}\n", url.display().to_string()),
            env(&[(
                "COURIER_DATABASE__ADMIN_URL_FILE",
                &admin.display().to_string(),
            )]),
        )
        .expect("url files");
        assert_eq!(
            config.database.url,
            "postgres://catalog:s3cret-pass@db.internal/courier"
        );
        assert_eq!(
            config.database.admin_url.as_deref(),
            Some("host=/cloudsql/p:r:i user=postgres password=x")
        );
        assert_eq!(config.database.url_file.as_deref(), Some(url.as_path()));
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret-pass"), "{debug}");
    }

    #[test]
    fn the_bearer_token_may_come_from_a_file_but_not_from_both() {
        let dir = TempDir::new("token-file");
        let token = dir.file("auth-token", "0123456789abcdef0123\n");
        let path = token.display().to_string();
        let config = CourierConfig::from_toml_and_env(
            "",
            env(&[("COURIER_HTTP__AUTH_TOKEN_FILE", path.as_str())]),
        )
        .expect("token file");
        assert_eq!(
            config.http.auth_token.as_deref(),
            Some("0123456789abcdef0123")
        );
        let err = CourierConfig::from_toml_and_env(
            &format!("[http]\nauth_token_file = {path:?}\n"),
            env(&[("COURIER_HTTP__AUTH_TOKEN", "another-token-0123456789")]),
        )
        .expect_err("both");
        assert!(err.to_string().contains("http.auth_token_file"), "{err}");
        let short = dir.file("short", "abc\n");
        let err = CourierConfig::from_toml_and_env(
            &format!(
                "[http]\nauth_token_file = {:?}\n",
                short.display().to_string()
            ),
            env(&[]),
        )
        .expect_err("short token");
        assert!(err.to_string().contains("http.auth_token_file"), "{err}");
        assert!(err.to_string().contains("at least 16"), "{err}");
    }

    #[test]
    fn a_url_given_inline_and_as_a_file_is_refused() {
        let dir = TempDir::new("url-both");
        let url = dir.file("url", "postgres://catalog@db.internal/courier");
        let path = url.display().to_string();
        // Both in the file, the URL from the environment and the file in the config, and the
        // admin URL both ways: each is refused, naming both keys.
        let cases = [
            (
                format!("[database]\nurl = \"postgres://a@h/db\"\nurl_file = {path:?}\n"),
                vec![],
                "database.url_file",
            ),
            (
                format!("[database]\nurl_file = {path:?}\n"),
                vec![("COURIER_DATABASE__URL", "postgres://a@h/db")],
                "database.url_file",
            ),
            (
                String::new(),
                vec![
                    ("COURIER_DATABASE__ADMIN_URL", "postgres://a@h/db"),
                    ("COURIER_DATABASE__ADMIN_URL_FILE", path.as_str()),
                ],
                "database.admin_url_file",
            ),
        ];
        for (toml, vars, key) in cases {
            let err = CourierConfig::from_toml_and_env(&toml, env(&vars))
                .expect_err("url and url_file both set");
            let text = err.to_string();
            assert!(text.contains(key), "{text}");
            assert!(text.contains("set only one of them"), "{text}");
        }
    }

    #[test]
    fn an_unreadable_or_empty_url_file_is_named() {
        let dir = TempDir::new("url-bad");
        let missing = dir.0.join("missing");
        let err = CourierConfig::from_toml_and_env(
            "",
            env(&[("COURIER_DATABASE__URL_FILE", &missing.display().to_string())]),
        )
        .expect_err("missing file");
        let text = err.to_string();
        assert!(text.contains("database.url_file"), "{text}");
        assert!(text.contains(&missing.display().to_string()), "{text}");
        assert!(
            text.contains("environment variable COURIER_DATABASE__URL_FILE"),
            "{text}"
        );

        let empty = dir.file("empty", " \n");
        let err = CourierConfig::from_toml_and_env(
            &format!(
                "[database]\nadmin_url_file = {:?}\n",
                empty.display().to_string()
            ),
            env(&[]),
        )
        .expect_err("empty file");
        let text = err.to_string();
        assert!(text.contains("database.admin_url_file"), "{text}");
        assert!(text.contains("is empty"), "{text}");

        // Contents that are no connection string are blamed on the file's key, and not shown.
        let garbage = dir.file("garbage", "host=db password=s3cret-pass port=notaport");
        let err = CourierConfig::from_toml_and_env(
            "",
            env(&[("COURIER_DATABASE__URL_FILE", &garbage.display().to_string())]),
        )
        .expect_err("not a connection string");
        let text = err.to_string();
        assert!(text.contains("database.url_file"), "{text}");
        assert!(!text.contains("s3cret-pass"), "{text}");
    }
}
