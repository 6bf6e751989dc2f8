//! Every test file of the workspace is compiled into a test binary. A crate whose Cargo.toml
//! says `autotests = false` names its binaries itself (one for most of its files, see its
//! tests/integration.rs), so a file added beside them runs only once a binary declares it:
//! this check fails until one does, instead of the file's tests silently never running.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn members() -> Vec<PathBuf> {
    let manifest: toml::Table = toml::from_str(&read(&root().join("Cargo.toml"))).expect("toml");
    manifest["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| root().join(m.as_str().expect("a member's path")))
        .collect()
}

/// The modules a tests/ folder holds: `x.rs` and `x/mod.rs`, by name.
fn test_modules(tests: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(tests) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "rs") {
                Some(path.file_stem()?.to_str()?.to_owned())
            } else if path.join("mod.rs").is_file() {
                Some(path.file_name()?.to_str()?.to_owned())
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn every_test_file_is_compiled_into_a_test_binary() {
    let mut checked = 0;
    for member in members() {
        let manifest: toml::Table =
            toml::from_str(&read(&member.join("Cargo.toml"))).expect("toml");
        let autotests = manifest["package"]
            .get("autotests")
            .and_then(toml::Value::as_bool)
            .unwrap_or(true);
        if autotests {
            continue; // cargo builds each tests/*.rs itself (and declares mod.rs folders nowhere)
        }
        let mut compiled = BTreeSet::new();
        let binaries = manifest.get("test").and_then(toml::Value::as_array);
        for binary in binaries.into_iter().flatten() {
            let path = binary["path"].as_str().expect("a [[test]] with a path");
            let file = member.join(path);
            compiled.insert(
                file.file_stem()
                    .expect("a file")
                    .to_string_lossy()
                    .into_owned(),
            );
            for line in read(&file).lines() {
                if let Some(module) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
                    compiled.insert(module.to_owned());
                }
            }
        }
        let present = test_modules(&member.join("tests"));
        let missing: Vec<_> = present.difference(&compiled).collect();
        assert!(
            missing.is_empty(),
            "{}: tests/ holds {missing:?}, which no [[test]] of Cargo.toml compiles (autotests = \
             false): add `mod <name>;` to its tests/integration.rs",
            member.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "{checked} crates name their test binaries; courier, courier-cli and courier-demo do"
    );
}
