//! docs/configuration.md is generated from the configuration structs: every key of
//! `src/config/` (and the restart policy of `src/supervision.rs`) with its doc comment, its
//! default, its unit and its environment variable. This test fails when the page and the code
//! differ, or when a key has no doc comment. After changing a key:
//! `COURIER_BLESS=1 cargo test -p courier --test integration config_reference`, then commit the page.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn page_path() -> PathBuf {
    crate_dir().join("../../docs/configuration.md")
}

/// The files of `src/config/`, one after another (each section in a file of its own).
fn config_sources() -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(crate_dir().join("src/config"))
        .expect("src/config/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("readable"))
        .collect::<Vec<_>>()
        .join("\n")
}

struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// The `///` lines of a block, joined into one paragraph.
fn join_doc(lines: &[&str]) -> String {
    lines
        .iter()
        .map(|l| l.trim_start_matches("///").trim())
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .to_owned()
}

/// The lines of the item that starts with `header`, up to its closing brace at column 0.
fn block<'a>(source: &'a str, header: &str) -> Option<Vec<&'a str>> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines.iter().position(|l| l.starts_with(header))?;
    let end = start + lines[start..].iter().position(|l| *l == "}")?;
    Some(lines[start + 1..end].to_vec())
}

/// The struct's public fields, each with its doc comment.
fn struct_fields(source: &str, name: &str) -> Vec<Field> {
    let header = format!("pub struct {name} {{");
    let body = block(source, &header).unwrap_or_else(|| panic!("{header} not found"));
    let mut fields = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in body.iter().map(|l| l.trim()) {
        if line.starts_with("///") {
            doc.push(line);
        } else if let Some(rest) = line.strip_prefix("pub ") {
            let (field, ty) = rest.split_once(':').expect("a field has a type");
            fields.push(Field {
                name: field.trim().to_owned(),
                ty: ty.trim().trim_end_matches(',').to_owned(),
                doc: join_doc(&doc),
            });
            doc.clear();
        } else if !line.starts_with("#[") {
            doc.clear();
        }
    }
    fields
}

/// `field: expression` of the struct's `impl Default`, if it has one.
fn default_of(source: &str, name: &str, field: &str) -> Option<String> {
    let body = block(source, &format!("impl Default for {name} {{"))?;
    let prefix = format!("{field}:");
    body.iter()
        .map(|l| l.trim())
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|e| e.trim().trim_end_matches(',').to_owned())
}

/// A default as a reader writes it in TOML.
fn shown(expression: &str, ty: &str) -> String {
    let product: Option<u64> = expression
        .split('*')
        .map(|factor| factor.trim().replace('_', "").parse::<u64>().ok())
        .product();
    if let Some(n) = product {
        return format!("`{n}`");
    }
    match expression {
        "None" => "none".into(),
        "true" | "false" => format!("`{expression}`"),
        _ if ty == "String" || expression.starts_with('"') => format!(
            "`{}`",
            expression
                .trim_end_matches(".into()")
                .trim_end_matches(".to_string()")
        ),
        _ => format!("`{expression}`"),
    }
}

/// A derived `Default`: what the type's own default is.
fn derived_default(ty: &str) -> &'static str {
    if ty.starts_with("Option<") {
        "none"
    } else if ty == "bool" {
        "`false`"
    } else {
        "`0`"
    }
}

fn unit(key: &str) -> &'static str {
    for (suffix, unit) in [
        ("_secs", "seconds"),
        ("_millis", "milliseconds"),
        ("_hours", "hours"),
        ("_bytes", "bytes"),
    ] {
        if key.ends_with(suffix) {
            return unit;
        }
    }
    ""
}

struct Row {
    key: String,
    default: String,
    doc: String,
}

/// `field`'s default as the page shows it: from the type's `impl Default`, or what a derived
/// one gives.
fn default_shown(source: &str, ty: &str, field: &Field) -> String {
    default_of(source, ty, &field.name)
        .map(|e| shown(&e, &field.ty))
        .unwrap_or_else(|| derived_default(&field.ty).to_owned())
}

fn rows_of(
    source: &str,
    section: &str,
    ty: &str,
    into: &mut Vec<Row>,
    undocumented: &mut Vec<String>,
) {
    let fields = struct_fields(source, ty);
    for field in fields {
        let key = format!("{section}.{}", field.name);
        if field.doc.is_empty() {
            undocumented.push(key.clone());
        }
        into.push(Row {
            key,
            default: default_shown(source, ty, &field),
            doc: field.doc,
        });
    }
}

fn env_name(key: &str) -> String {
    format!("COURIER_{}", key.to_ascii_uppercase().replace('.', "__"))
}

/// The page, as generated from the sources.
fn generate() -> (String, Vec<String>) {
    let config = config_sources();
    let supervision =
        std::fs::read_to_string(crate_dir().join("src/supervision.rs")).expect("supervision.rs");
    let sections = struct_fields(&config, "CourierConfig");
    let policy = struct_fields(&supervision, "RestartPolicy");
    let mut undocumented = Vec::new();
    let mut page = String::from(
        "# Configuration reference\n\n\
         One TOML file per deployment (`deploy/local/courier.toml`, `deploy/cloudrun/`,\n\
         `deploy/k8s/`), given with `--config` or `COURIER_CONFIG`. Every key is optional; an\n\
         unknown key or an invalid value is refused at start with an error naming it. Any key can\n\
         be set from the environment instead, as `COURIER_<SECTION>__<KEY>` (the column\n\
         \"environment\"); `PUBSUB_EMULATOR_HOST` sets `pubsub.emulator_host`.\n\n\
         Generated from the doc comments and defaults of `framework/courier/src/config/` by\n\
         `framework/courier/tests/config_reference.rs`, which fails when this page and the code\n\
         differ; regenerate it with\n\
         `COURIER_BLESS=1 cargo test -p courier --test integration config_reference`.\n",
    );
    for section in sections {
        page.push_str(&format!("\n## [{}]\n\n{}\n\n", section.name, section.doc));
        let mut rows = Vec::new();
        if section.ty == "SupervisionConfig" {
            let actors = struct_fields(&config, "SupervisionConfig");
            page.push_str(
                "Each actor kind has a restart policy, `[supervision.<kind>]`, with these keys:\n\n",
            );
            for actor in actors {
                for field in &policy {
                    rows.push(Row {
                        key: format!("supervision.{}.{}", actor.name, field.name),
                        default: default_shown(&supervision, "RestartPolicy", field),
                        doc: format!("{} {}", actor.doc, field.doc),
                    });
                }
            }
        } else {
            rows_of(
                &config,
                &section.name,
                &section.ty,
                &mut rows,
                &mut undocumented,
            );
        }
        page.push_str("| key | default | unit | environment | what |\n|---|---|---|---|---|\n");
        for row in rows {
            page.push_str(&format!(
                "| `{}` | {} | {} | `{}` | {} |\n",
                row.key,
                row.default,
                unit(&row.key),
                env_name(&row.key),
                row.doc.replace('|', "\\|")
            ));
        }
    }
    (page, undocumented)
}

#[test]
fn every_key_is_documented_in_the_code() {
    let (_, undocumented) = generate();
    assert!(
        undocumented.is_empty(),
        "configuration keys without a doc comment: {undocumented:?}"
    );
}

#[test]
fn the_configuration_reference_is_generated_from_the_code() {
    let (page, _) = generate();
    assert!(
        page.matches("\n| `").count() >= 60,
        "too few keys found:\n{page}"
    );
    if std::env::var_os("COURIER_BLESS").is_some() {
        std::fs::write(page_path(), &page).expect("docs/configuration.md written");
        return;
    }
    let on_disk = std::fs::read_to_string(page_path()).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/configuration.md differs from the configuration structs; regenerate it with \
         COURIER_BLESS=1 cargo test -p courier --test integration config_reference"
    );
}

#[test]
fn the_local_deployment_sets_only_keys_of_the_reference() {
    let (page, _) = generate();
    let local = std::fs::read_to_string(crate_dir().join("../../deploy/local/courier.toml"))
        .expect("deploy/local/courier.toml");
    let mut section = String::new();
    for line in local.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some((key, _)) = line.split_once('=') {
            if line.starts_with('#') {
                continue;
            }
            let full = format!("`{section}.{}`", key.trim());
            assert!(
                page.contains(&full),
                "deploy/local/courier.toml sets {full}, not in the reference"
            );
        }
    }
}

/// The guide's smallest service config loads, names no more than a service's own keys, and
/// leaves every other key at its default.
#[test]
fn the_guides_smallest_config_loads_and_keeps_every_other_default() {
    let guide = std::fs::read_to_string(crate_dir().join("../../docs/writing-a-service.md"))
        .expect("docs/writing-a-service.md");
    let after = guide
        .split_once("## Its config")
        .expect("a section \"## Its config\"")
        .1;
    let block = after
        .split_once("```toml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a toml block in \"## Its config\"")
        .0;
    let keys = block
        .lines()
        .filter(|l| l.contains('=') && !l.trim_start().starts_with('#'))
        .count();
    assert!(keys <= 8, "the smallest config sets {keys} keys");
    let config = courier::CourierConfig::from_toml_and_env(block, std::iter::empty())
        .unwrap_or_else(|e| panic!("the guide's smallest config does not load: {e}"));
    let default = courier::CourierConfig::default();
    assert_eq!(config.database.schema, "search");
    assert_eq!(config.relay.shard_count, default.relay.shard_count);
    assert_eq!(config.consumer.streams, default.consumer.streams);
    assert_eq!(
        config.retention.outbox_hours,
        default.retention.outbox_hours
    );
}
