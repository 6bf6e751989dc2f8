//! The framework crate's modules, and the load harness's, import each other without cycles, so each can be read (and
//! changed) after the ones it depends on. A module is a file; it imports another when it names
//! it: `crate::a::b::…` (in `use` lines or inline) or `super::…`. A path resolves to the
//! deepest module file it names, so importing a re-exported item through a parent
//! (`crate::outbox::Outbox`) counts as importing the parent. A folder's own file naming its
//! descendants is structure, not an import: it assembles and re-exports them, and they may
//! use what it defines (a registry and the actors it holds).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `src`, as its module path (`relay::publisher` for
/// `relay/publisher/mod.rs`, `` for `lib.rs`).
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, found: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("source directory").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, src, found);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("readable source");
            found.insert(parts.join("::"), text);
        }
    }
    let mut found = BTreeMap::new();
    walk(src, src, &mut found);
    found
}

/// The deepest module `parts` names.
fn resolve(parts: &[&str], modules: &BTreeMap<String, String>) -> Option<String> {
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| modules.contains_key(m))
}

/// The paths a `crate::` or `super::` reference names: `a::b` or, for `a::{b, c::d}`, each
/// `a::b` and `a::c::d` (one level of braces; deeper ones resolve to their prefix).
fn named_paths(after: &str) -> Vec<String> {
    let path: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let base = path.trim_end_matches(':').to_owned();
    let rest = &after[path.len()..];
    if path.ends_with("::") && rest.starts_with('{') {
        let group = rest[1..].split('}').next().unwrap_or_default();
        group
            .split(',')
            .map(|item| item.trim().split([' ', '{']).next().unwrap_or_default())
            .filter(|item| !item.is_empty() && *item != "self")
            .map(|item| format!("{base}::{item}"))
            .collect()
    } else {
        vec![base]
    }
}

/// Module → the modules it imports.
fn import_graph(src: &Path) -> Graph {
    let modules = modules(src);
    let mut graph = Graph::new();
    for (module, text) in &modules {
        // Test modules may import anything; comments name paths without importing them.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let own: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
        let parent = &own[..own.len().saturating_sub(1)];
        let mut imports = BTreeSet::new();
        for (marker, base) in [("crate::", Vec::new()), ("super::", parent.to_vec())] {
            for after in code.split(marker).skip(1) {
                for path in named_paths(after) {
                    let mut parts = base.clone();
                    parts.extend(path.split("::").filter(|p| !p.is_empty()));
                    imports.extend(resolve(&parts, &modules));
                }
            }
        }
        let descendants = format!("{module}::");
        imports.retain(|m| module.is_empty() || !m.starts_with(&descendants));
        if module.is_empty() {
            imports.clear(); // lib.rs: declarations and re-exports only
        }
        imports.remove(module);
        graph.insert(module.clone(), imports);
    }
    graph
}

/// A cycle through `graph`, if any, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_framework_crate_has_no_import_cycle() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() >= 70, "read the modules: {graph:?}");
    assert!(
        graph["inbound::projector"].contains("inbound::parts"),
        "{graph:?}"
    );
    assert!(
        graph["relay::publish_limit"].contains("config"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_load_harness_has_no_import_cycle() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../load-tests/src"));
    assert!(graph.len() >= 30, "read the modules: {graph:?}");
    assert!(
        graph["harness::pipeline"].contains("harness::pin"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in load-tests: {}", cycle.join(" → "));
    }
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph).map(|c| c.join(" → ")),
        Some("a → b → c → a".to_string())
    );
}
