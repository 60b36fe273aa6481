//! `docs/configuration.md` against the schema this crate parses. Each section of the
//! reference titled with a table (`` ## `[server]` ``) lists that table's keys; the schema's
//! own list of them is serde's answer to an unknown key (`__probe__`) in that table, so a key
//! added to [`super::file`] and not documented, or documented and gone, fails here. Tables
//! that keys lead to must have sections, and the reload column must agree with
//! [`super::restart::RESTART_ONLY`].

use super::file::FileConfig;
use super::restart::RESTART_ONLY;
use std::collections::{BTreeMap, BTreeSet};

const REFERENCE: &str = include_str!("../../../docs/configuration.md");

/// The whole `tracing` table needs a restart; `server.tls` is the listener's presence.
const RESTART_TABLES: &[&str] = &["tracing"];

struct Row {
    key: String,
    ty: String,
    reload: String,
}

/// Schema sections by path (`""` for the top level, `server.tls`, `upstreams.NAME`,
/// `ip_limit`), each with its rows and whether it is an array of tables.
fn sections() -> BTreeMap<String, (bool, Vec<Row>)> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in REFERENCE.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            current = if title == "Top level" {
                Some(String::new())
            } else {
                title
                    .strip_prefix('`')
                    .and_then(|t| t.strip_suffix('`'))
                    .map(str::to_owned)
            };
            if let Some(title) = &current {
                let array = title.starts_with("[[");
                let path = title.trim_matches(|c| c == '[' || c == ']').to_owned();
                out.insert(path.clone(), (array, Vec::new()));
                current = Some(path);
            }
            continue;
        }
        let Some(path) = &current else { continue };
        if !line.starts_with("| `") {
            continue;
        }
        let cells = cells(line);
        assert!(cells.len() == 5, "a row of {path:?} has five cells: {line}");
        out.get_mut(path).unwrap().1.push(Row {
            key: cells[0].trim_matches('`').to_owned(),
            ty: cells[1].clone(),
            reload: cells[3].clone(),
        });
    }
    out
}

/// The cells of a table row, `\|` being a `|` inside one.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push(chars.next().unwrap())
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// A file whose only content is an unknown key in the table at `path`.
fn probe(path: &str, arrays: &BTreeSet<String>) -> String {
    match path {
        "" => return "__probe__ = 1".to_owned(),
        "ip_limit" => return "[server]\nip_limit = { __probe__ = 1 }".to_owned(),
        "retry" => return "[[routes]]\nretry = { __probe__ = 1 }".to_owned(),
        "request_headers" | "response_headers" | "cors" | "redirect" | "respond" => {
            return format!("[[routes]]\n{path} = {{ __probe__ = 1 }}")
        }
        "retry_budget" => return "[upstreams.x]\nretry_budget = { __probe__ = 1 }".to_owned(),
        _ => {}
    }
    let concrete = path.replace(".NAME", ".x");
    let mut text = String::new();
    // Enclosing arrays of tables get an element first (`[[routes]]` before `[[routes.limits]]`).
    let parts: Vec<&str> = path.split('.').collect();
    for i in 1..parts.len() {
        let enclosing = parts[..i].join(".");
        if arrays.contains(&enclosing) {
            text.push_str(&format!("[[{}]]\n", enclosing.replace(".NAME", ".x")));
        }
    }
    if arrays.contains(path) {
        text.push_str(&format!("[[{concrete}]]\n__probe__ = 1\n"));
    } else {
        text.push_str(&format!("[{concrete}]\n__probe__ = 1\n"));
    }
    text
}

/// The keys serde names in its "unknown field `__probe__`, expected one of …" error.
fn schema_keys(file: &str) -> BTreeSet<String> {
    let error = toml::from_str::<FileConfig>(file)
        .err()
        .unwrap_or_else(|| panic!("the probe was accepted:\n{file}"))
        .to_string();
    let expected = error
        .split_once("unknown field `__probe__`, expected ")
        .unwrap_or_else(|| panic!("not an unknown-field error for\n{file}\n{error}"))
        .1;
    let expected = expected.lines().next().unwrap_or_default();
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn is_table(ty: &str) -> bool {
    ty == "table" || ty == "array of tables" || ty.starts_with("inline table")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[test]
fn every_table_lists_exactly_the_keys_of_the_schema() {
    let sections = sections();
    let arrays: BTreeSet<String> = sections
        .iter()
        .filter(|(_, (array, _))| *array)
        .map(|(path, _)| path.clone())
        .collect();
    assert!(
        sections.len() >= 15,
        "sections found: {:?}",
        sections.keys()
    );
    for (path, (_, rows)) in &sections {
        let documented: BTreeSet<String> = rows.iter().map(|r| r.key.clone()).collect();
        assert_eq!(
            documented.len(),
            rows.len(),
            "a key of {path:?} is listed twice"
        );
        let schema = schema_keys(&probe(path, &arrays));
        let undocumented: Vec<_> = schema.difference(&documented).collect();
        let gone: Vec<_> = documented.difference(&schema).collect();
        assert!(
            undocumented.is_empty() && gone.is_empty(),
            "docs/configuration.md, table {path:?}: not documented {undocumented:?}, not in the schema {gone:?}"
        );
    }
}

#[test]
fn every_table_a_key_leads_to_has_a_section_and_every_section_is_reached() {
    let sections = sections();
    let mut reached = BTreeSet::from([String::new()]);
    for (path, (_, rows)) in &sections {
        for row in rows.iter().filter(|r| is_table(&r.ty)) {
            let child = join(path, &row.key);
            let found = [child.clone(), format!("{child}.NAME"), row.key.clone()]
                .into_iter()
                .find(|candidate| sections.contains_key(candidate))
                .unwrap_or_else(|| panic!("{child} is a table but has no section"));
            reached.insert(found);
        }
    }
    let orphans: Vec<_> = sections.keys().filter(|s| !reached.contains(*s)).collect();
    assert!(orphans.is_empty(), "sections no key leads to: {orphans:?}");
}

#[test]
fn the_reload_column_agrees_with_the_settings_a_reload_keeps() {
    let sections = sections();
    let mut documented_restart = BTreeSet::new();
    for (path, (_, rows)) in &sections {
        for row in rows {
            let full = join(path, &row.key);
            let restart = RESTART_ONLY.contains(&full.as_str())
                || RESTART_TABLES
                    .iter()
                    .any(|t| path == t || path.starts_with(&format!("{t}.")));
            match row.reload.as_str() {
                "restart" => {
                    assert!(restart, "{full} is documented as restart-only, but reloads");
                    documented_restart.insert(full);
                }
                "yes" => assert!(!restart, "{full} needs a restart, documented as reloading"),
                "" => assert!(
                    is_table(&row.ty) && !restart,
                    "{full}: the reload column may be empty only for a table whose keys say it"
                ),
                other => panic!("{full}: reload is \"yes\" or \"restart\", not {other:?}"),
            }
        }
    }
    for path in RESTART_ONLY {
        assert!(
            documented_restart.contains(*path),
            "{path} needs a restart: docs/configuration.md must say so"
        );
    }
}
