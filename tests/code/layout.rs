//! The source tree keeps the shape ARCHITECTURE.md describes: imports run one way. Every
//! `crate::…`, `super::…` and `self::…` path outside test code is read from `src/`, mapped to
//! the module it names, and the resulting graph must have no cycle — between files, and
//! between the top-level folders (`proxy` → `chain` → `limit`, …) as layered below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up: each may use only those before it.
const LAYERS: &[&str] = &[
    "clock",
    "secret",
    "outbound",
    "limit",
    "upstream",
    "chain",
    "registry",
    "ops",
    "control",
    "background",
    "proxy",
    "server",
    "fuzzing",
];

/// Source files over this many lines hold more than one job: split them along the seam
/// (ARCHITECTURE.md, "Layout").
const MAX_LINES: usize = 600;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/chain/auth.rs` → `chain::auth`; `src/chain/mod.rs` → `chain`; `src/lib.rs` → ``.
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without its test module (by convention the file's tail) and without
/// comments (docs may name any module).
fn non_test_code(text: &str) -> String {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .map(|l| l.split_once("//").map_or(l, |(before, _)| before))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Module paths referenced by `code`, relative ones resolved against `module`.
fn referenced(module: &str, code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (start, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let rest = &code[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(':');
        let segments: Vec<&str> = path.split("::").collect();
        let resolved: Vec<String> = if segments[0] == "crate" {
            segments[1..].iter().map(|s| s.to_string()).collect()
        } else {
            // `super` of `a::b` is `a`, whether `b` is `b.rs` or `b/mod.rs`.
            let mut base: Vec<String> = module.split("::").map(str::to_owned).collect();
            let mut rest = &segments[..];
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
            base.extend(rest.iter().map(|s| s.to_string()));
            base
        };
        out.push(resolved.join("::"));
    }
    out
}

/// The longest known module that `path` starts with.
fn owner(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn graph() -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, usize>) {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut lines = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let text = std::fs::read_to_string(file).unwrap();
        lines.insert(file.display().to_string(), text.lines().count());
        let code = non_test_code(&text);
        let mut paths = referenced(&module, &code);
        // A parent naming its child relatively (`validate::f`, `self::validate::f`).
        for child in modules.iter().filter_map(|m| {
            let rest = if module.is_empty() {
                Some(m.as_str())
            } else {
                m.strip_prefix(&format!("{module}::"))
            }?;
            (!rest.is_empty() && !rest.contains("::")).then_some(rest)
        }) {
            let needle = format!("{child}::");
            let b = code.as_bytes();
            let named = code.match_indices(&needle).any(|(i, _)| {
                i == 0
                    || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':')
                    || code[..i].ends_with("self::")
            });
            if named {
                paths.push(if module.is_empty() {
                    child.to_owned()
                } else {
                    format!("{module}::{child}")
                });
            }
        }
        for path in paths {
            if let Some(target) = owner(&path, &modules) {
                if target != module {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    (edges, lines)
}

fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(2) => return None,
            Some(1) => {
                let from = stack.iter().position(|n| n == node).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, edges, &mut state, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let (edges, _) = graph();
    assert!(edges.len() > 20, "the scan found the modules: {edges:?}");
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle: {}", cycle.join(" → "));
    }
}

#[test]
fn top_level_folders_import_only_layers_below_them() {
    let (edges, _) = graph();
    let layer = |module: &str| {
        let top = module.split("::").next().unwrap();
        LAYERS.iter().position(|l| *l == top)
    };
    let mut upward = Vec::new();
    for (from, targets) in &edges {
        for to in targets {
            let (Some(a), Some(b)) = (layer(from), layer(to)) else {
                continue;
            };
            if b > a {
                upward.push(format!("{from} → {to}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layering: {upward:#?}"
    );
}

#[test]
fn no_source_file_holds_two_jobs() {
    let (_, lines) = graph();
    let long: Vec<String> = lines
        .iter()
        .filter(|(_, n)| **n > MAX_LINES)
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect();
    assert!(long.is_empty(), "{long:#?}");
}

/// Functions over this many lines do more than one step: the request path's and everything
/// else's, outside configuration conversion (`control/config/`, and `control/snapshot.rs`
/// turning a configuration into what requests read: one field after another).
const MAX_FN_LINES: usize = 120;

/// `(name, lines)` of every function in `code` (rustfmt's layout: a function ends at the
/// first `}` line at its own indentation).
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let head = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("async ");
        let Some(rest) = head.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((name, end + 2));
        }
    }
    out
}

#[test]
fn no_function_holds_many_steps() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let config = src().join("control").join("config");
    let snapshot = src().join("control").join("snapshot.rs");
    let mut long = Vec::new();
    for file in files
        .iter()
        .filter(|f| !f.starts_with(&config) && **f != snapshot)
    {
        let text = std::fs::read_to_string(file).unwrap();
        for (name, n) in functions(&non_test_code(&text)) {
            if n > MAX_FN_LINES {
                long.push(format!("{}::{name}: {n} lines", module_of(file)));
            }
        }
    }
    assert!(long.is_empty(), "split these along their steps: {long:#?}");
}

#[test]
fn functions_are_measured() {
    let code = "fn a() {\n    x();\n}\n\nimpl T {\n    pub async fn b(\n        y: u8,\n    ) {\n        z();\n    }\n}\n";
    assert_eq!(
        functions(code),
        vec![("a".to_string(), 3), ("b".to_string(), 5)]
    );
}
