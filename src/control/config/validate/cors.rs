//! A route's `cors`: origins parsed and normalised, `"*"` never with credentials, methods
//! and header names checked, and no `response_headers` rule on an `Access-Control-*` header
//! the gateway answers with.

use super::checks::Problems;
use crate::chain::cors::{AllowedHeaders, Cors, OriginPattern, DEFAULT_METHODS};
use crate::chain::header_rules::HeaderRules;
use crate::control::config::file::{CorsFile, CorsSetting};
use http::{HeaderName, Method};
use std::sync::Arc;
use std::time::Duration;

/// The longest `max_age` browsers honour (Firefox: 24 h; Chromium caps at 2 h).
const MAX_AGE: Duration = Duration::from_secs(86_400);

/// A route's `cors`: its own, none (`"off"`), or the server's (`server`, unset).
pub(super) fn route_cors(
    path: &str,
    setting: Option<CorsSetting>,
    server: Option<&Arc<Cors>>,
    response_rules: Option<&HeaderRules>,
    problems: &mut Problems,
) -> Option<Arc<Cors>> {
    let cors = match setting {
        Some(CorsSetting::Off) => None,
        Some(CorsSetting::Rules(file)) => cors(path, Some(file), problems),
        None => server.cloned(),
    }?;
    if let Some(rules) = response_rules {
        let names = rules
            .set
            .iter()
            .chain(&rules.add)
            .map(|(n, _)| n)
            .chain(&rules.remove);
        for name in names {
            if name.as_str().starts_with("access-control-") {
                problems.push(
                    path.to_owned(),
                    format!("response_headers names {name}, which cors answers: keep one of them"),
                );
            }
        }
    }
    Some(cors)
}

pub(super) fn cors(
    path: &str,
    file: Option<CorsFile>,
    problems: &mut Problems,
) -> Option<Arc<Cors>> {
    let file = file?;
    let credentials = file.credentials.unwrap_or(false);
    if file.origins.is_empty() {
        problems.push(
            format!("{path}.origins"),
            "is empty: name the origins a browser may call this route from (or remove cors)",
        );
    }
    let mut origins = Vec::new();
    for (i, text) in file.origins.iter().enumerate() {
        let at = format!("{path}.origins[{i}]");
        match crate::chain::cors::parse_pattern(text) {
            Ok(OriginPattern::Any) if credentials => problems.push(
                at,
                "\"*\" with credentials = true would let every site act as the signed-in user: name the origins",
            ),
            Ok(pattern) if origins.contains(&pattern) => {
                problems.warn(at, format!("{text:?} is listed twice"))
            }
            Ok(pattern) => origins.push(pattern),
            Err(e) => problems.push(at, e),
        }
    }
    let mut methods = Vec::new();
    let names = file
        .methods
        .unwrap_or_else(|| DEFAULT_METHODS.iter().map(|m| m.to_string()).collect());
    for (i, text) in names.iter().enumerate() {
        match Method::from_bytes(text.to_ascii_uppercase().as_bytes()) {
            Ok(m) if m == Method::OPTIONS || m == Method::CONNECT || m == Method::TRACE => problems
                .push(
                    format!("{path}.methods[{i}]"),
                    format!("{m} cannot be sent from a browser's fetch()"),
                ),
            Ok(m) if !methods.contains(&m) => methods.push(m),
            Ok(_) => {}
            Err(_) => problems.push(
                format!("{path}.methods[{i}]"),
                format!("{text:?} is not a method"),
            ),
        }
    }
    let header_list = |key: &str, list: Option<Vec<String>>, problems: &mut Problems| {
        let mut out = Vec::new();
        for (i, text) in list.unwrap_or_default().iter().enumerate() {
            match HeaderName::from_bytes(text.as_bytes()) {
                Ok(name) => out.push(name),
                Err(_) => problems.push(
                    format!("{path}.{key}[{i}]"),
                    format!("{text:?} is not a header name"),
                ),
            }
        }
        out
    };
    let headers = match file.headers {
        None => AllowedHeaders::Any,
        Some(list) if list.iter().any(|h| h == "*") => AllowedHeaders::Any,
        Some(list) => AllowedHeaders::Only(header_list("headers", Some(list), problems)),
    };
    if file
        .expose
        .as_ref()
        .is_some_and(|l| l.iter().any(|h| h == "*"))
    {
        problems.push(
            format!("{path}.expose"),
            "\"*\" is not read as a wildcard by every browser: name the headers",
        );
    }
    let expose = header_list("expose", file.expose, problems);
    let max_age = file.max_age.map(|d| d.0);
    if max_age.is_some_and(|d| d > MAX_AGE) {
        problems.push(
            format!("{path}.max_age"),
            "at most 1d (browsers cap it lower still)",
        );
    }
    let keep_upstream = match file.upstream.as_deref() {
        None | Some("replace") => false,
        Some("keep") => true,
        Some(other) => {
            problems.push(
                format!("{path}.upstream"),
                format!("{other:?}: \"replace\" (the gateway answers) or \"keep\" (the upstream's headers, when it sends them)"),
            );
            false
        }
    };
    Some(Arc::new(Cors::new(
        origins,
        methods,
        headers,
        &expose,
        credentials,
        max_age.map(|d| d.as_secs()),
        keep_upstream,
    )))
}
