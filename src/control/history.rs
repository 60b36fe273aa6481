//! The latest configuration loads and reloads, for `GET /reloads` and the console: when, what
//! asked for it, the outcome, and what changed — read from the configuration as `/config`
//! shows it (secrets only ever "set"), so no value a secret holds can appear here. Fixed
//! memory: the last [`KEPT`] attempts, each with at most [`MAX_ITEMS`] changes and problems
//! of at most [`MAX_TEXT`] bytes.

use serde::Serialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Reload attempts kept.
pub const KEPT: usize = 32;
/// Changes (and problems) listed per attempt; more are counted, not listed.
pub const MAX_ITEMS: usize = 20;
/// Longest problem text kept.
pub const MAX_TEXT: usize = 300;

/// One load or reload attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// Unix seconds.
    pub at: u64,
    /// What asked for it: "start", "file changed", "SIGHUP", "POST /reload", "admin API".
    pub trigger: String,
    /// "loaded" (the start), "applied", "unchanged" or "rejected".
    pub result: &'static str,
    /// The version and hash running afterwards.
    pub version: u64,
    pub hash: String,
    /// What an applied reload changed: `routes.orders`, `plans.small` (added / removed / changed),
    /// `store`, `server`…
    pub changed: Vec<String>,
    /// Why a rejected one was rejected (the TOML paths and their problems).
    pub problems: Vec<String>,
    /// Changes or problems left out of the lists above.
    pub more: usize,
}

#[derive(Default)]
pub struct History {
    attempts: Mutex<VecDeque<Attempt>>,
}

impl History {
    pub fn record(&self, mut attempt: Attempt) {
        let total = attempt.changed.len() + attempt.problems.len();
        attempt.changed.truncate(MAX_ITEMS);
        attempt.problems.truncate(MAX_ITEMS);
        for p in &mut attempt.problems {
            if p.len() > MAX_TEXT {
                let mut end = MAX_TEXT;
                while !p.is_char_boundary(end) {
                    end -= 1;
                }
                p.truncate(end);
                p.push('…');
            }
        }
        attempt.more = total - attempt.changed.len() - attempt.problems.len();
        let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        if attempts.len() == KEPT {
            attempts.pop_front();
        }
        attempts.push_back(attempt);
    }

    /// Newest first.
    pub fn latest(&self) -> Vec<Attempt> {
        let attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        attempts.iter().rev().cloned().collect()
    }
}

/// Sections whose entries have names: a change names the entry.
const NAMED: [(&str, &str); 5] = [
    ("routes", "name"),
    ("upstreams", "name"),
    ("plans", "name"),
    ("clients", "id"),
    ("issuers", "name"),
];

/// What differs between two renderings of the configuration (`config::view::render`): a named
/// entry added, removed or changed (`routes.orders changed`), any other top-level section
/// changed (`store changed`).
pub fn changes(old: &Value, new: &Value) -> Vec<String> {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object()) else {
        return vec!["everything changed".to_owned()];
    };
    let mut out = Vec::new();
    let mut sections: Vec<&String> = old.keys().chain(new.keys()).collect();
    sections.sort();
    sections.dedup();
    for section in sections {
        let (a, b) = (old.get(section), new.get(section));
        if a == b {
            continue;
        }
        match NAMED.iter().find(|(s, _)| s == section) {
            Some((_, id)) => entries(section, id, a, b, &mut out),
            None => out.push(format!("{section} changed")),
        }
    }
    out
}

fn entries(section: &str, id: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    let list = |v: Option<&Value>| -> Vec<(String, Value)> {
        let items = match v {
            Some(Value::Array(items)) => items.clone(),
            Some(Value::Object(map)) => map.values().cloned().collect(),
            _ => Vec::new(),
        };
        items
            .into_iter()
            .map(|item| (item[id].as_str().unwrap_or("?").to_owned(), item))
            .collect()
    };
    let (before, after) = (list(a), list(b));
    for (name, item) in &before {
        match after.iter().find(|(n, _)| n == name) {
            None => out.push(format!("{section}.{name} removed")),
            Some((_, now)) if now != item => out.push(format!("{section}.{name} changed")),
            Some(_) => {}
        }
    }
    for (name, _) in after
        .iter()
        .filter(|(n, _)| !before.iter().any(|(b, _)| b == n))
    {
        out.push(format!("{section}.{name} added"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn named_entries_are_told_apart_and_other_sections_named() {
        let old = json!({
            "routes": [{"name": "a", "limit": 1}, {"name": "b"}],
            "plans": [{"name": "p", "limits": [1]}],
            "store": {"kind": "memory"},
            "server": {"threads": 2},
        });
        let new = json!({
            "routes": [{"name": "a", "limit": 2}, {"name": "c"}],
            "plans": [{"name": "p", "limits": [1]}],
            "store": {"kind": "redis"},
            "server": {"threads": 2},
        });
        assert_eq!(
            changes(&old, &new),
            [
                "routes.a changed",
                "routes.b removed",
                "routes.c added",
                "store changed"
            ]
        );
        assert!(changes(&old, &old).is_empty());
    }

    #[test]
    fn memory_is_bounded() {
        let history = History::default();
        for i in 0..(KEPT as u64 + 5) {
            history.record(Attempt {
                at: i,
                trigger: "test".into(),
                result: "rejected",
                version: 1,
                hash: String::new(),
                changed: Vec::new(),
                problems: (0..MAX_ITEMS + 3)
                    .map(|_| "x".repeat(MAX_TEXT * 2))
                    .collect(),
                more: 0,
            });
        }
        let latest = history.latest();
        assert_eq!(latest.len(), KEPT);
        assert_eq!(latest[0].at, KEPT as u64 + 4, "newest first");
        assert_eq!(latest[0].problems.len(), MAX_ITEMS);
        assert_eq!(latest[0].more, 3);
        assert!(latest[0].problems[0].len() <= MAX_TEXT + '…'.len_utf8());
    }
}
