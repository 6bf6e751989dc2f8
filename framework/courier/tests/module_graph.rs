//! The modules of the read and write sides import each other without cycles, so each can be
//! read (and changed) after the ones it depends on. Checked from the `use crate::…` lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the sibling modules it imports, for the `.rs` files of `src/<dir>`.
fn sibling_imports(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let prefix = format!("crate::{}::", dir.replace('/', "::"));
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(&root)
        .expect("source directory")
        .flatten()
    {
        let path = entry.path();
        let module = match path.extension().and_then(|e| e.to_str()) {
            Some("rs") => path.file_stem().and_then(|s| s.to_str()).map(String::from),
            _ => None,
        };
        let Some(module) = module.filter(|m| m != "mod") else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable source");
        // Test modules may import anything.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let imports = code
            .lines()
            .filter_map(|line| line.trim().split(&prefix).nth(1))
            .filter_map(|rest| rest.split([':', ';', ' ', '{']).next())
            .map(String::from)
            .filter(|m| *m != module)
            .collect();
        graph.insert(module, imports);
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
fn the_read_side_modules_import_each_other_without_cycles() {
    let graph = sibling_imports("inbound");
    assert!(graph.len() >= 10, "read the modules: {graph:?}");
    assert!(graph["projector"].contains("parts"), "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in inbound/: {}", cycle.join(" → "));
    }
}

#[test]
fn the_write_side_modules_import_each_other_without_cycles() {
    for dir in ["outbox", "outbox/publisher"] {
        let graph = sibling_imports(dir);
        if let Some(cycle) = find_cycle(&graph) {
            panic!("import cycle in {dir}/: {}", cycle.join(" → "));
        }
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
