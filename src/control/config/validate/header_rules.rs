//! A route's `request_headers` / `response_headers`: names parsed, templates checked, no
//! rule on a header the gateway decides (or one that frames the message), no name both set
//! and removed, no `${client_id}` / `${plan}` on a route that identifies nobody.

use super::checks::Problems;
use crate::chain::header_rules::{protected_request, protected_response, HeaderRules, Template};
use crate::control::config::file::HeaderRulesFile;
use http::HeaderName;
use std::sync::Arc;

/// Which head the rules are for, and the route's own protected names (its claim headers,
/// its token header) for requests.
pub(super) enum Direction<'a> {
    Request(Vec<&'a str>),
    Response,
}

pub(super) fn header_rules(
    path: &str,
    file: Option<HeaderRulesFile>,
    direction: Direction<'_>,
    identifies: bool,
    problems: &mut Problems,
) -> Option<Arc<HeaderRules>> {
    let file = file?;
    let protected = |name: &HeaderName| match &direction {
        Direction::Request(own) => protected_request(name.as_str()) || own.contains(&name.as_str()),
        Direction::Response => protected_response(name.as_str()),
    };
    let name_of = |at: String, text: &str, problems: &mut Problems| {
        let name = match HeaderName::from_bytes(text.as_bytes()) {
            Ok(name) => name,
            Err(_) => {
                problems.push(at, format!("{text:?} is not a header name"));
                return None;
            }
        };
        if protected(&name) {
            problems.push(
                at,
                format!("{name} is the gateway's to decide (or frames the message): no rule may set, add or remove it"),
            );
            return None;
        }
        Some(name)
    };
    let mut rules = HeaderRules::default();
    for (i, text) in file.remove.unwrap_or_default().iter().enumerate() {
        if let Some(name) = name_of(format!("{path}.remove[{i}]"), text, problems) {
            rules.remove.push(name);
        }
    }
    for (key, entries) in [("set", file.set), ("add", file.add)] {
        for (text, value) in entries.unwrap_or_default() {
            let at = format!("{path}.{key}.{text}");
            let Some(name) = name_of(at.clone(), &text, problems) else {
                continue;
            };
            let template = match Template::parse(&value) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(at, e);
                    continue;
                }
            };
            if template.needs_client() && !identifies {
                problems.push(
                    at.clone(),
                    "${client_id} and ${plan} need callers identified: set auth on the route",
                );
            }
            if rules.remove.contains(&name) {
                problems.push(
                    at,
                    format!("{name} is removed too: set or add it, or remove it"),
                );
            }
            let list = if key == "set" {
                &mut rules.set
            } else {
                &mut rules.add
            };
            list.push((name, template));
        }
    }
    (!rules.is_empty()).then(|| Arc::new(rules))
}
