//! The production manifests in deploy/ name what the binaries really are: the image the
//! Dockerfile builds, binaries and subcommands that exist, the port the config listens on,
//! probe paths the framework serves, environment variables that are real config keys — and
//! the alert rules pass promtool.

use courier::service::http::{HEALTH_PATH, READY_PATH};
use courier::CourierConfig;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

const SUBCOMMANDS: &[&str] = &["serve", "migrate", "provision"];
/// Every service binary: each is deployed (served and migrated) on both platforms.
const SERVICES: &[&str] = &[
    courier_catalog::NAME,
    courier_engagement::NAME,
    courier_search::NAME,
];
const PLATFORMS: &[&str] = &["cloudrun", "k8s"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("deploy dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
}

/// Every container spec in a document, wherever the resource kind nests it.
fn containers<'a>(node: &'a Yaml, found: &mut Vec<&'a Yaml>) {
    match node {
        Yaml::Hash(hash) => {
            for (key, value) in hash {
                if matches!(key.as_str(), Some("containers" | "initContainers")) {
                    found.extend(value.as_vec().into_iter().flatten());
                } else {
                    containers(value, found);
                }
            }
        }
        Yaml::Array(items) => items.iter().for_each(|item| containers(item, found)),
        _ => {}
    }
}

/// A stand-in for a value that comes from a secret, valid for its key.
fn placeholder(name: &str) -> String {
    match name {
        n if n.ends_with("URL") => "postgres://role@db.internal:5432/courier".into(),
        n if n.ends_with("AUTH_TOKEN") => "a-secret-token-0123456789".into(),
        _ => "placeholder".into(),
    }
}

fn check_container(
    file: &Path,
    container: &Yaml,
    dockerfile: &str,
    secret_dir: &Path,
) -> Result<(), String> {
    let image = container["image"].as_str().ok_or("no image")?;
    // Pinned by digest; the release step fills the placeholder (deploy/README.md).
    if !image.ends_with("/courier/courier@sha256:IMAGE_DIGEST") {
        return Err(format!(
            "image {image} is not the courier image deploy/Dockerfile builds, pinned by digest"
        ));
    }
    let command = container["command"][0].as_str().ok_or("no command")?;
    let binary = command
        .strip_prefix("/usr/local/bin/")
        .ok_or_else(|| format!("command {command} is not in /usr/local/bin"))?;
    if !SERVICES.contains(&binary) || !dockerfile.contains(&format!("target/release/{binary}")) {
        return Err(format!(
            "binary {binary} is not a service the Dockerfile installs"
        ));
    }
    let subcommand = container["args"][0].as_str().ok_or("no args")?;
    if !SUBCOMMANDS.contains(&subcommand) {
        return Err(format!("{binary} has no subcommand {subcommand}"));
    }

    // Environment: COURIER_CONFIG names a shipped config (and the image holds it); every
    // other variable is an override the config loader accepts. No secret is an environment
    // variable: a `*_FILE` variable names a file in a mounted volume, which stands in here
    // as a file holding a valid value.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_vec()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    let mut config_path = None;
    let mut overrides = Vec::new();
    for var in container["env"].as_vec().into_iter().flatten() {
        let name = var["name"].as_str().ok_or("env entry without name")?;
        if !var["valueFrom"]["secretKeyRef"].is_badvalue() {
            return Err(format!(
                "{name} takes a secret into the environment: mount it as a file instead"
            ));
        }
        let value = var["value"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| placeholder(name));
        if name == courier::config::CONFIG_PATH_ENV {
            config_path = Some(value);
        } else if let Some(secret) = name.strip_suffix("_FILE") {
            let in_volume = mounts
                .iter()
                .any(|m| value.starts_with(&format!("{}/", m.trim_end_matches('/'))));
            if !in_volume {
                return Err(format!("{name}={value} is in no mounted volume"));
            }
            let stand_in = secret_dir.join(name);
            std::fs::write(&stand_in, format!("{}\n", placeholder(secret)))
                .map_err(|e| format!("write {}: {e}", stand_in.display()))?;
            overrides.push((name.to_owned(), stand_in.display().to_string()));
        } else {
            overrides.push((name.to_owned(), value));
        }
    }
    let config_path = config_path.ok_or("no COURIER_CONFIG")?;
    let shipped = config_path
        .strip_prefix("/etc/courier/")
        .map(|rest| {
            let rest = rest
                .strip_prefix("cloudrun/")
                .or(rest.strip_prefix("k8s/"))
                .unwrap_or(rest);
            let platform = if file.to_string_lossy().contains("cloudrun") {
                "cloudrun"
            } else {
                "k8s"
            };
            repo().join("deploy").join(platform).join(rest)
        })
        .ok_or_else(|| format!("COURIER_CONFIG {config_path} is not under /etc/courier"))?;
    let text = std::fs::read_to_string(&shipped)
        .map_err(|e| format!("COURIER_CONFIG {config_path} ({}): {e}", shipped.display()))?;
    if !text.contains(&format!("schema = \"{binary}\"")) {
        return Err(format!("{config_path} is not {binary}'s config"));
    }
    let config = CourierConfig::from_toml_and_env(&text, overrides)
        .map_err(|e| format!("{config_path} with the manifest's env: {e}"))?;
    let config_dir = shipped
        .parent()
        .and_then(Path::file_name)
        .and_then(|d| d.to_str())
        .unwrap_or_default();
    if !dockerfile.contains(&format!("deploy/{config_dir}/{binary}.toml")) {
        return Err(format!(
            "the image does not hold deploy/{config_dir}/{binary}.toml"
        ));
    }

    if subcommand != "serve" {
        return Ok(());
    }
    let port = config
        .http
        .listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<i64>().ok())
        .ok_or("http.listen has no port")?;
    let ports: Vec<&Yaml> = container["ports"].as_vec().into_iter().flatten().collect();
    let declared = ports
        .iter()
        .any(|p| p["containerPort"].as_i64() == Some(port));
    if !declared {
        return Err(format!(
            "no containerPort {port} (http.listen of {config_path})"
        ));
    }
    let port_names: Vec<&str> = ports.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut probes = 0;
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        if get.is_badvalue() {
            continue;
        }
        probes += 1;
        let path = get["path"]
            .as_str()
            .ok_or(format!("{probe} without path"))?;
        if ![HEALTH_PATH, READY_PATH].contains(&path) {
            return Err(format!("{probe} path {path} is not served"));
        }
        let hits = get["port"].as_i64() == Some(port)
            || get["port"]
                .as_str()
                .is_some_and(|n| port_names.contains(&n));
        if !hits {
            return Err(format!("{probe} does not probe port {port}"));
        }
    }
    if probes < 2 {
        return Err("a served container needs readiness/startup and liveness probes".into());
    }
    Ok(())
}

#[test]
fn every_manifest_names_real_images_binaries_ports_probes_and_config_keys() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).expect("Dockerfile");
    let mut files = Vec::new();
    for dir in ["deploy/cloudrun", "deploy/k8s"] {
        yaml_files(&repo().join(dir), &mut files);
    }
    // Stand-ins for the mounted secret files, one directory per test process.
    let secret_dir = std::env::temp_dir().join(format!("courier-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&secret_dir).expect("temp dir for secret stand-ins");
    let mut checked = 0;
    let mut served = std::collections::BTreeSet::new();
    let mut migrated = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        let docs = YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()));
        for doc in &docs {
            let mut found = Vec::new();
            containers(doc, &mut found);
            for container in found {
                check_container(file, container, &dockerfile, &secret_dir)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                let platform = if file.to_string_lossy().contains("cloudrun") {
                    "cloudrun"
                } else {
                    "k8s"
                };
                let binary = container["command"][0]
                    .as_str()
                    .and_then(|c| c.strip_prefix("/usr/local/bin/"))
                    .unwrap_or_default();
                let deployed = format!("{platform}/{binary}");
                match container["args"][0].as_str() {
                    Some("serve") => served.insert(deployed),
                    Some("migrate") => migrated.insert(deployed),
                    _ => false,
                };
                checked += 1;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&secret_dir);
    // Every service is served and migrated on both platforms.
    let expected: std::collections::BTreeSet<String> = PLATFORMS
        .iter()
        .flat_map(|p| SERVICES.iter().map(move |s| format!("{p}/{s}")))
        .collect();
    assert_eq!(served, expected, "served containers");
    assert_eq!(migrated, expected, "migrate containers");
    assert!(
        checked >= 2 * expected.len(),
        "only {checked} containers found"
    );
}

#[test]
fn alert_rules_pass_promtool() {
    let status = std::process::Command::new(repo().join("deploy/prometheus/check.sh"))
        .status()
        .expect("deploy/prometheus/check.sh runs (promtool: Debian package prometheus)");
    assert!(status.success(), "promtool check/test rules failed");
}

#[test]
fn the_dashboard_uses_only_metrics_the_framework_exports() {
    use courier::metrics as m;
    let known = [
        m::OUTBOX_PENDING_COUNT,
        m::OUTBOX_DEAD_COUNT,
        m::OUTBOX_OLDEST_PENDING_SECONDS,
        m::OUTBOX_MAX_DELIVERY_ATTEMPTS,
        m::OUTBOX_PUBLISH_SUCCESS_TOTAL,
        m::OUTBOX_PUBLISH_ERROR_TOTAL,
        m::OUTBOX_PUBLISH_LATENCY,
        m::OUTBOX_DEAD_TOTAL,
        m::OUTBOX_APPENDED_TOTAL,
        m::OUTBOX_CLAIM_BATCH_SIZE,
        m::OUTBOX_OWNED_SHARDS,
        m::LIVE_PUBLISHERS,
        m::RELAY_PUBLISH_LIMIT,
        m::RELAY_PUBLISHES_IN_FLIGHT,
        m::RELAY_CONGESTION_TOTAL,
        m::OUTBOX_BROKER_FAILURES_TOTAL,
        m::PROJECTION_PROCESS_SUCCESS_TOTAL,
        m::PROJECTION_PROCESS_ERROR_TOTAL,
        m::PROJECTION_PROCESS_LATENCY,
        m::PROJECTION_VERSION_LAG,
        m::PROJECTION_DEAD_LETTERED_TOTAL,
        m::PROJECTION_DUPLICATES_TOTAL,
        m::LIVE_PROJECTORS,
        m::PROJECTION_TRANSIENT_RETRIES_TOTAL,
        m::PROJECTION_GATED_KEYS,
        m::PROJECTION_PARKED_KEYS,
        m::PROJECTION_TRANSACTION_EVENTS,
        m::RECEIVER_OUTSTANDING_MESSAGES,
        m::ACTOR_RESTARTS_TOTAL,
        m::BACKPRESSURE_WAIT_SECONDS,
        m::DLQ_MESSAGE_COUNT,
        m::MAILBOX_DEPTH,
    ];
    let groups = [
        m::offset_lag_metric("catalog_projector"),
        m::offset_lag_metric("engagement_reader"),
    ];
    let text =
        std::fs::read_to_string(repo().join("deploy/grafana/courier.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "only {} panel queries", exprs.len());
    let mut used = std::collections::BTreeSet::new();
    for expr in &exprs {
        // Metric-like words: lowercase identifiers with an underscore, minus PromQL's own.
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let word = word.trim_end_matches("_bucket").trim_end_matches("_sum");
            let word = if word.ends_with("_count") && !known.contains(&word) {
                word.trim_end_matches("_count")
            } else {
                word
            };
            // (`_offset_lag_ms` alone is the tail of a `{__name__=~".+_offset_lag_ms"}` regex.)
            let is_metric = word.contains('_')
                && !word.starts_with('_')
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && (word.starts_with("outbox_")
                    || word.starts_with("projection_")
                    || word.starts_with("courier_")
                    || word.ends_with("_offset_lag_ms"));
            if is_metric {
                assert!(
                    known.contains(&word) || groups.iter().any(|g| g == word),
                    "dashboard query uses {word}, which the framework does not export: {expr}"
                );
                used.insert(word.to_owned());
            }
        }
    }
    for name in [
        m::OUTBOX_PENDING_COUNT,
        m::OUTBOX_PUBLISH_LATENCY,
        m::PROJECTION_PROCESS_LATENCY,
        m::RELAY_PUBLISH_LIMIT,
        m::OUTBOX_BROKER_FAILURES_TOTAL,
        m::PROJECTION_PARKED_KEYS,
        m::PROJECTION_TRANSIENT_RETRIES_TOTAL,
    ] {
        assert!(used.contains(name), "dashboard does not chart {name}");
    }
}

fn collect_exprs(node: &serde_json::Value, found: &mut Vec<String>) {
    match node {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    _ => collect_exprs(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, found)),
        _ => {}
    }
}
