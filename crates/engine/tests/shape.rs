//! The engine's shape, checked: its modules never import each other in a
//! circle, no source file grows past 800 lines, and the crate's docs name
//! every module. (Tests of the modules' own code live beside it; what is
//! checked here is how the modules stand to each other.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The top-level module a file belongs to (`scan/plan.rs` → `scan`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// The file's code without comments and without its `mod tests`.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The names `lib.rs` re-exports, by the module they come from
/// (`pub use error::{EngineError, TxnRule}` → EngineError: error).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.strip_prefix("pub use ") else { continue };
        let rest = rest.trim_end_matches(';');
        let Some((module, names)) = rest.split_once("::") else { continue };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or_default().to_string();
            if !name.is_empty() {
                out.insert(name, module.to_string());
            }
        }
    }
    out
}

/// `crate::x` and `crate::{x, y::z}` paths in `code`: their first names.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(|p| p.trim().split("::").next().unwrap_or_default().to_string()));
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let aliases = reexports(&lib);
    let all = files(&src());
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).filter(|m| m != "lib").collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &all {
        let from = module_of(file);
        if from == "lib" {
            continue;
        }
        for name in crate_paths(&code(file)) {
            let to = aliases.get(&name).cloned().unwrap_or(name);
            if to != from && modules.contains(&to) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// A circle in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(u: &str, graph: &BTreeMap<String, BTreeSet<String>>, done: &mut BTreeSet<String>, path: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == u) {
            let mut c = path[i..].to_vec();
            c.push(u.to_string());
            return Some(c);
        }
        if done.contains(u) {
            return None;
        }
        path.push(u.to_string());
        for v in graph.get(u).into_iter().flatten() {
            if let Some(c) = visit(v, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(u.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|u| visit(u, graph, &mut done, &mut Vec::new()))
}

#[test]
fn no_module_imports_another_in_a_circle() {
    let graph = graph();
    // The checker sees real edges (it would miss every circle otherwise).
    assert!(graph["dispatch"].contains("parser") && graph["session"].contains("dispatch"), "{graph:?}");
    if let Some(c) = circle(&graph) {
        panic!("engine modules import each other in a circle: {}", c.join(" -> "));
    }
    let mut looped = graph.clone();
    looped.entry("parser".into()).or_default().insert("session".into());
    assert!(circle(&looped).is_some(), "a circle added on purpose is found");
}

#[test]
fn no_source_file_is_over_800_lines() {
    let long: Vec<String> = files(&src())
        .into_iter()
        .filter_map(|p| {
            let lines = std::fs::read_to_string(&p).expect("read").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by their jobs: {long:?}");
}

#[test]
fn the_crate_docs_name_every_module() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let docs: String = lib.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let missing: Vec<String> = files(&src())
        .iter()
        .map(|p| module_of(p))
        .filter(|m| m != "lib")
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|m| !docs.contains(&format!("`{m}`")) && !docs.contains(&format!("[`{m}`]")))
        .collect();
    assert!(missing.is_empty(), "lib.rs's docs do not list {missing:?}");
}
