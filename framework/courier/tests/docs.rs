//! The README and `docs/` stay true and readable: the README short enough to read (at most 300
//! lines, none over 200 characters), and every file or link any of them names present in the
//! repository. A clone carries its own documents: nothing points outside it.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README and every page under `docs/`, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/ at the root");
    for entry in docs.flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            paths.push(entry.path());
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable");
            (p, text)
        })
        .collect()
}

fn name(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn the_readme_is_short_and_its_lines_are_readable() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; at most 300");
    let long: Vec<(usize, usize)> = readme
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.chars().count()))
        .filter(|(_, n)| *n > 200)
        .collect();
    assert!(
        long.is_empty(),
        "README.md lines over 200 characters (line, length): {long:?}"
    );
}

/// Link targets of `[text](target)`, without their `#anchor`.
fn link_targets(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap_or_default().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

#[test]
fn every_link_points_inside_the_repository_at_something_that_exists() {
    let mut checked = 0;
    for (path, text) in documents() {
        let dir = path.parent().expect("a file has a folder");
        for target in link_targets(&text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let resolved = dir.join(&target);
            assert!(
                resolved.exists(),
                "{} links to {target}, which does not exist",
                name(&path)
            );
            let inside = resolved
                .canonicalize()
                .expect("exists")
                .starts_with(root().canonicalize().expect("root exists"));
            assert!(
                inside,
                "{} links to {target}, outside the repository",
                name(&path)
            );
            checked += 1;
        }
        for outside in ["../shared", "DESIGN.md", "EMULATOR.md"] {
            assert!(
                !text.contains(outside),
                "{} names {outside}, which is not in the repository",
                name(&path)
            );
        }
    }
    assert!(checked >= 10, "only {checked} links checked");
}

/// Whether a quoted word names a file or folder of the repository: it has a folder in it and
/// is not a command, a key, a pattern, an output of a run or a URL's path.
fn looks_like_a_path(quoted: &str) -> bool {
    let plain = !quoted.contains([' ', '<', '>', '*', '{', '…', '$', '=', '(', '|', '#', ':']);
    let first = quoted.split('/').next().unwrap_or_default();
    plain
        && quoted.contains('/')
        && !quoted.starts_with('/')
        && !first.is_empty()
        && !first.contains('.')
        && !quoted.starts_with("load-reports")
}

/// The text outside fenced code blocks (whose quotes are code, not inline names).
fn prose(text: &str) -> String {
    let mut inside = false;
    let mut kept = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

#[test]
fn every_path_a_document_names_exists() {
    // Paths are from the root, or (in the map of the code and the guides) from the framework
    // crate or its sources.
    let bases = [
        root(),
        root().join("framework/courier"),
        root().join("framework/courier/src"),
        root().join("docs"),
    ];
    let mut checked = 0;
    let mut missing = Vec::new();
    for (path, text) in documents() {
        if path.ends_with("benchmarks-history.md") {
            continue; // a record of what was, as it was written
        }
        for quoted in prose(&text).split('`').skip(1).step_by(2) {
            let candidate = quoted.split("::").next().unwrap_or_default();
            if !looks_like_a_path(candidate) {
                continue;
            }
            if !bases.iter().any(|b| b.join(candidate).exists()) {
                missing.push(format!("{}: {candidate}", name(&path)));
            }
            checked += 1;
        }
    }
    assert!(
        missing.is_empty(),
        "paths named but not present: {missing:#?}"
    );
    assert!(checked >= 50, "only {checked} paths checked");
}
