//! `[[routes]]`: matching, limits, timeouts, failure mode; overlaps and costs checked across routes and plans.

use super::checks::*;
use super::header_rules::{header_rules, Direction};
use super::plans::{limit_policy, LimitShape};
use super::route_auth::*;
use super::server::*;
use super::store::*;
use crate::chain::auth::Auth;
use crate::chain::headers::HeadersMode;
use crate::chain::partition::{KeyPart, Missing};
use crate::control::config::defaults;
use crate::control::config::file::{
    HeadersModeFile, IpLimitSetting, MissingFile, RouteFile, RouteLimitFile,
};
use crate::control::config::model::{
    IpLimitChoice, IssuerConfig, RouteConfig, RouteLimitConfig, ServerConfig, UpstreamConfig,
};
use std::collections::BTreeMap;

pub(super) fn route_config(
    index: usize,
    file: RouteFile,
    upstreams: &BTreeMap<String, UpstreamConfig>,
    server: &ServerConfig,
    issuers: &BTreeMap<String, IssuerConfig>,
    problems: &mut Problems,
) -> RouteConfig {
    let RouteFile {
        name,
        path_prefix,
        host,
        methods,
        upstream,
        connect_timeout,
        read_timeout,
        write_timeout,
        upgrade_idle_timeout,
        upgrades,
        strip_prefix,
        add_prefix,
        forwarded,
        retry,
        ip_limit,
        auth,
        cost,
        rate_limit_headers,
        legacy_rate_limit_headers,
        forward_api_key,
        on_store_error,
        max_body_bytes,
        shadow,
        max_concurrent,
        limits,
        body_key_bytes,
        priority,
        issuers: route_issuers,
        token_from,
        forward_token,
        forward_claims,
        exempt,
        cost_from_request,
        max_cost,
        reserve_from,
        allow_ips,
        deny_ips,
        allow_clients,
        allow_plans,
        deny_clients,
        deny_plans,
        allow_groups,
        deny_groups,
        request_headers,
        response_headers,
        cors,
        redirect,
        respond,
    } = file;
    // What a route that answers itself never reaches.
    let unused_if_answered = [
        ("limits", limits.as_ref().is_some_and(|l| !l.is_empty())),
        ("max_concurrent", max_concurrent.is_some()),
        ("cost", cost.is_some()),
        ("request_headers", request_headers.is_some()),
        ("retry", retry.is_some()),
    ];
    let callers = super::callers::CallerFiles {
        allow_clients,
        deny_clients,
        allow_plans,
        deny_plans,
        allow_groups,
        deny_groups,
    };
    let base = format!("routes[{index}]");
    let priority = route_priority(
        &base,
        priority,
        upstream.as_ref().and_then(|u| upstreams.get(u)),
        problems,
    );
    let shadow = shadow.unwrap_or(false);
    let ip_limit = match ip_limit {
        None => IpLimitChoice::ServerDefault,
        Some(IpLimitSetting::Off) => IpLimitChoice::Off,
        Some(IpLimitSetting::Limit(l)) => {
            IpLimitChoice::Own(ip_limit_config(&format!("{base}.ip_limit"), l, problems))
        }
    };
    let auth = route_auth(&base, auth, server, problems);
    match max_concurrent {
        Some(0) => refuse_zero(format!("{base}.max_concurrent"), 0, problems),
        Some(_) if !auth.identifies() => problems.push(
            format!("{base}.max_concurrent"),
            "a concurrency limit is per client: it needs auth (api_key, jwt or client_cert)",
        ),
        _ => {}
    }
    let tokens = route_tokens(
        &base,
        auth,
        RouteTokenFiles {
            issuers: route_issuers,
            token_from,
            forward_token,
            forward_claims,
        },
        issuers,
        problems,
    );
    let cost = at_least_one(format!("{base}.cost"), cost, 1, problems);
    let limits = route_limits(
        &base,
        limits.unwrap_or_default(),
        auth,
        server,
        shadow,
        problems,
    );
    if cost > 1 && !auth.identifies() && limits.is_empty() {
        problems.push(
            format!("{base}.cost"),
            "cost applies to plan limits (routes with auth) and the route's own limits: this route has neither",
        );
    }
    let body_key_bytes = match body_key_bytes.map(|b| b.0) {
        Some(n) if n == 0 || n > defaults::MAX_BODY_KEY_BYTES => {
            problems.push(
                format!("{base}.body_key_bytes"),
                format!("{n}: expected 1 to {}", defaults::MAX_BODY_KEY_BYTES),
            );
            defaults::BODY_KEY_BYTES
        }
        Some(n) => n,
        None => defaults::BODY_KEY_BYTES,
    };
    let rate_limit_headers = match rate_limit_headers {
        None | Some(HeadersModeFile::On) => HeadersMode::On,
        Some(HeadersModeFile::Off) => HeadersMode::Off,
        Some(HeadersModeFile::NearLimit) => HeadersMode::NearLimit,
    };
    check_name(&format!("{base}.name"), &name, problems);
    if let Err(msg) = crate::chain::path::check_path_prefix(&path_prefix) {
        problems.push(format!("{base}.path_prefix"), msg);
    }
    let host = host.map(|h| {
        let lower = h.to_ascii_lowercase();
        let valid = !lower.is_empty()
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'));
        if !valid {
            problems.push(
                format!("{base}.host"),
                format!(
                    "{h:?}: expected a host name without scheme or port, like \"api.example.com\""
                ),
            );
        }
        lower
    });
    let methods = methods.map(|list| {
        if list.is_empty() {
            problems.push(
                format!("{base}.methods"),
                "an empty list would match nothing: leave `methods` out to allow every method",
            );
        }
        let mut parsed: Vec<http::Method> = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(method) if !parsed.contains(&method) => parsed.push(method),
                Ok(_) => problems.push(
                    format!("{base}.methods[{i}]"),
                    format!("{m:?} is listed twice"),
                ),
                Err(_) => problems.push(
                    format!("{base}.methods[{i}]"),
                    format!("{m:?} is not an HTTP method"),
                ),
            }
        }
        parsed
    });
    let answer = super::answers::answer(
        &base,
        (redirect, respond),
        upstream.as_deref(),
        auth.identifies(),
        problems,
    );
    if answer.is_some() {
        super::answers::warn_unused(&base, &unused_if_answered, problems);
    }
    if let Some(upstream) = upstream.as_ref().filter(|u| !upstreams.contains_key(*u)) {
        let known: Vec<&str> = upstreams.keys().map(String::as_str).collect();
        problems.push(
            format!("{base}.upstream"),
            format!(
                "unknown upstream {upstream:?}: define [upstreams.{upstream}] or use one of [{}]",
                known.join(", ")
            ),
        );
    }
    let identifies = auth.identifies();
    let mut own: Vec<&str> = tokens
        .forward_claims
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    if let crate::chain::credential::TokenFrom::Header(name) = &tokens.token_from {
        own.push(name.as_str());
    }
    let request_headers = header_rules(
        &format!("{base}.request_headers"),
        request_headers,
        Direction::Request(own),
        identifies,
        problems,
    );
    let response_headers = header_rules(
        &format!("{base}.response_headers"),
        response_headers,
        Direction::Response,
        identifies,
        problems,
    );
    let cors = super::cors::route_cors(
        &format!("{base}.cors"),
        cors,
        server.cors.as_ref(),
        response_headers.as_deref(),
        problems,
    );
    RouteConfig {
        name,
        path_prefix,
        host,
        methods,
        upstream,
        connect_timeout: positive(
            format!("{base}.connect_timeout"),
            connect_timeout,
            defaults::CONNECT_TIMEOUT,
            problems,
        ),
        read_timeout: positive(
            format!("{base}.read_timeout"),
            read_timeout,
            defaults::READ_TIMEOUT,
            problems,
        ),
        write_timeout: positive(
            format!("{base}.write_timeout"),
            write_timeout,
            defaults::WRITE_TIMEOUT,
            problems,
        ),
        upgrade_idle_timeout: positive(
            format!("{base}.upgrade_idle_timeout"),
            upgrade_idle_timeout,
            defaults::UPGRADE_IDLE_TIMEOUT,
            problems,
        ),
        upgrades: route_upgrades(&base, upgrades, problems),
        strip_prefix: strip_prefix.unwrap_or(false),
        add_prefix: add_prefix.filter(|add| {
            let checked = crate::chain::rewrite::check_add_prefix(add);
            if let Err(why) = &checked {
                problems.push(format!("{base}.add_prefix"), why.clone());
            }
            checked.is_ok()
        }),
        forwarded: forwarded.unwrap_or(false),
        retry: retry.map(|r| super::retry::policy(&base, r, problems)),
        ip_limit,
        auth,
        cost,
        rate_limit_headers,
        legacy_rate_limit_headers: legacy_rate_limit_headers.unwrap_or(false),
        forward_api_key: forward_api_key.unwrap_or(false),
        on_store_error: on_store_error.map_or(server.on_store_error, failure_mode),
        max_body_bytes: max_body_bytes.map_or(server.limits.max_body_bytes, |b| b.0),
        shadow,
        max_concurrent: max_concurrent.filter(|n| *n > 0),
        limits,
        body_key_bytes,
        priority,
        issuers: tokens.issuers,
        token_from: tokens.token_from,
        forward_token: tokens.forward_token,
        forward_claims: tokens.forward_claims,
        exempt: exempt_rules(&base, exempt.unwrap_or_default(), problems),
        cost_from_request: request_cost(&base, cost_from_request, max_cost, problems),
        addresses: super::addresses::address_rules(&base, allow_ips, deny_ips, problems),
        callers: super::callers::caller_rules(&base, auth, callers, problems),
        request_headers,
        response_headers,
        cors,
        answer,
        reserve_from: reserve_from.and_then(|text| {
            use crate::chain::partition::KeyPart;
            match KeyPart::parse(&text) {
                Ok(part @ (KeyPart::Header(_) | KeyPart::Body(_))) => Some(part),
                _ => {
                    problems.push(
                        format!("{base}.reserve_from"),
                        format!("{text:?}: expected \"header:NAME\" or \"body:FIELD\""),
                    );
                    None
                }
            }
        }),
    }
}

/// A route's `upgrades`: any, none, or named protocols (tokens, compared ignoring case).
fn route_upgrades(
    base: &str,
    file: Option<crate::control::config::file::UpgradesFile>,
    problems: &mut Problems,
) -> crate::chain::message::Upgrades {
    use crate::chain::message::Upgrades;
    use crate::control::config::file::UpgradesFile;
    match file {
        None | Some(UpgradesFile::Switch(true)) => Upgrades::Any,
        Some(UpgradesFile::Switch(false)) => Upgrades::Never,
        Some(UpgradesFile::Only(names)) if names.is_empty() => {
            problems.push(
                format!("{base}.upgrades"),
                "an empty list allows nothing: write upgrades = false",
            );
            Upgrades::Never
        }
        Some(UpgradesFile::Only(names)) => Upgrades::Only(
            names
                .into_iter()
                .filter(|n| {
                    let ok = !n.is_empty()
                        && n.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if !ok {
                        problems.push(
                            format!("{base}.upgrades"),
                            format!("{n:?} is not a protocol name (like \"websocket\")"),
                        );
                    }
                    ok
                })
                .map(|n| n.to_ascii_lowercase())
                .collect(),
        ),
    }
}

/// A route's `cost_from_request`: the header a trusted caller declares its cost in.
fn request_cost(
    base: &str,
    header: Option<String>,
    max: Option<u64>,
    problems: &mut Problems,
) -> Option<(http::HeaderName, u64)> {
    let Some(text) = header else {
        if max.is_some() {
            problems.push(format!("{base}.max_cost"), "only with cost_from_request");
        }
        return None;
    };
    match text
        .strip_prefix("header:")
        .map(|n| http::HeaderName::from_bytes(n.as_bytes()))
    {
        Some(Ok(name)) => Some((
            name,
            at_least_one(format!("{base}.max_cost"), max, 100, problems),
        )),
        _ => {
            problems.push(
                format!("{base}.cost_from_request"),
                format!("{text:?}: expected \"header:NAME\""),
            );
            None
        }
    }
}

/// The route's load-shedding class; said to do nothing when its upstream does not shed.
fn route_priority(
    base: &str,
    priority: Option<crate::control::config::file::PriorityFile>,
    upstream: Option<&UpstreamConfig>,
    problems: &mut Problems,
) -> crate::upstream::shed::Priority {
    let priority = super::shedding::priority(priority);
    if let (Some(p), Some(up)) = (priority, upstream) {
        if up.shedding.is_none() && p != crate::upstream::shed::Priority::Default {
            problems.warn(
                format!("{base}.priority"),
                format!(
                    "{:?} has no effect: upstream {:?} has no [upstreams.{}.shedding]",
                    p.as_str(),
                    up.name,
                    up.name
                ),
            );
        }
    }
    priority.unwrap_or(crate::upstream::shed::Priority::Default)
}

/// `routes[i].limits`: each a limit like a plan's, with a key and a choice for requests
/// that lack part of it.
fn route_limits(
    base: &str,
    files: Vec<RouteLimitFile>,
    auth: Auth,
    server: &ServerConfig,
    route_shadow: bool,
    problems: &mut Problems,
) -> Vec<RouteLimitConfig> {
    let mut out: Vec<RouteLimitConfig> = Vec::with_capacity(files.len());
    for (i, file) in files.into_iter().enumerate() {
        let RouteLimitFile {
            name,
            algorithm,
            limit,
            window,
            time_zone,
            burst,
            delay,
            shadow,
            key,
            missing,
        } = file;
        let path = format!("{base}.limits[{i}]");
        if out.iter().any(|l| *l.policy.name == *name) {
            problems.push(
                format!("{path}.name"),
                format!("{name:?} is used twice on this route"),
            );
        }
        let shape = LimitShape {
            algorithm,
            limit,
            window,
            time_zone,
            burst,
            delay,
        };
        let policy = limit_policy(&path, &name, shape, problems);
        if key.is_empty() {
            problems.push(
                format!("{path}.key"),
                format!(
                    "at least one part: {}",
                    crate::chain::partition::PART_SHAPES
                ),
            );
        }
        let mut parts: Vec<KeyPart> = Vec::with_capacity(key.len());
        for (j, text) in key.iter().enumerate() {
            match KeyPart::parse(text) {
                Ok(part) if parts.contains(&part) => problems.push(
                    format!("{path}.key[{j}]"),
                    format!("{text:?} is listed twice"),
                ),
                Ok(KeyPart::Client) if !auth.identifies() => problems.push(
                    format!("{path}.key[{j}]"),
                    "\"client\" needs auth (api_key, jwt or client_cert) on the route",
                ),
                Ok(KeyPart::Claim(_)) if !auth.jwt => problems.push(
                    format!("{path}.key[{j}]"),
                    format!("{text:?} needs auth including \"jwt\" on the route"),
                ),
                Ok(KeyPart::Cert(_))
                    if server.tls.as_ref().is_none_or(|t| t.client_auth.is_none()) =>
                {
                    problems.push(
                        format!("{path}.key[{j}]"),
                        format!("{text:?} needs [server.tls] client_certificates"),
                    )
                }
                Ok(part) => parts.push(part),
                Err(msg) => problems.push(format!("{path}.key[{j}]"), msg),
            }
        }
        let missing = match missing {
            None | Some(MissingFile::Reject) => Missing::Reject,
            Some(MissingFile::Skip) => Missing::Skip,
            Some(MissingFile::Shared) => Missing::Shared,
        };
        if let Some(policy) = policy {
            out.push(RouteLimitConfig {
                policy,
                shadow: route_shadow || shadow.unwrap_or(false),
                key: parts,
                missing,
            });
        }
    }
    out
}

/// Route names must be unique, and two routes must not claim the same host, prefix and method
/// (the second could never match).
pub(super) fn check_route_overlaps(routes: &[RouteConfig], problems: &mut Problems) {
    for (i, route) in routes.iter().enumerate() {
        for (j, earlier) in routes[..i].iter().enumerate() {
            if route.name == earlier.name {
                problems.push(
                    format!("routes[{i}].name"),
                    format!("{:?} is already the name of routes[{j}]", route.name),
                );
            }
            let methods_overlap = match (&route.methods, &earlier.methods) {
                (Some(a), Some(b)) => a.iter().any(|m| b.contains(m)),
                _ => true,
            };
            if route.host == earlier.host
                && route.path_prefix == earlier.path_prefix
                && methods_overlap
            {
                problems.push(
                    format!("routes[{i}]"),
                    format!(
                        "same host, path_prefix and method(s) as routes[{j}] ({:?}): it could never match",
                        earlier.name
                    ),
                );
            }
        }
    }
}
