//! docs/architecture.md stays a true map: every actor of the framework is named in it, and every
//! file it points at exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn map() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md")
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_actor_is_on_the_map() {
    let map = map();
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut actors = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for line in text.lines().filter(|l| l.starts_with("impl")) {
            if let Some(rest) = line.split(" Actor for ").nth(1) {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric()).collect();
                actors.push(name);
            }
        }
    }
    assert!(actors.len() >= 9, "found {actors:?}");
    let missing: Vec<&String> = actors
        .iter()
        .filter(|a| !map.contains(&format!("`{a}`")))
        .collect();
    assert!(missing.is_empty(), "actors not on the map: {missing:?}");
}

#[test]
fn every_file_on_the_map_exists() {
    let map = map();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for quoted in map.split('`').skip(1).step_by(2) {
        let path = quoted.split("::").next().unwrap_or_default();
        if !(path.ends_with(".rs") || path.ends_with(".md") || path.ends_with('/')) {
            continue;
        }
        let exists = [
            src.join(path),
            root().join(path),
            root().join("framework/courier").join(path),
            root().join("docs").join(path),
        ]
        .iter()
        .any(|p| p.exists());
        assert!(
            exists,
            "docs/architecture.md points at {path}, which does not exist"
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} paths checked");
}
