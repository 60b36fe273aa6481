//! The running configuration as JSON for `GET /config`, with every secret removed: API keys
//! (plaintext or digests) appear only as a count, the admin token only as "set", and
//! passwords in Redis URLs as `***`.

use super::model::{Config, IpLimitChoice, IpLimitConfig, StoreConfig};
use super::units::format_duration;
use crate::chain::headers::HeadersMode;
use crate::limit::store::redis::Topology;
use crate::limit::store::FailureMode;
use serde_json::{json, Value};

pub fn render(config: &Config) -> Value {
    let s = &config.server;
    json!({
        "server": {
            "listen": s.listen.to_string(),
            "threads": s.threads,
            "pid_file": s.pid_file,
            "upgrade_sock": s.upgrade_sock,
            "grace_period": format_duration(s.grace_period),
            "graceful_shutdown_timeout": format_duration(s.graceful_shutdown_timeout),
            "upstream_keepalive_pool_size": s.upstream_keepalive_pool_size,
            "work_stealing": s.work_stealing,
            "watch_config": s.watch_config,
            "log_format": s.log_format.as_str(),
            "h2c": s.h2c,
            "tls": s.tls.as_ref().map(|t| json!({
                "listen": t.listen.to_string(),
                "h2": t.h2,
                "certificates": t.certificates.iter().map(|c| json!({
                    "cert": c.cert.display().to_string(),
                    "key": "set",
                    "names": c.names,
                })).collect::<Vec<_>>(),
                "client_certificates": t.client_auth.as_ref().map(|c| json!({
                    "required": c.required,
                    "client_ca_file": c.ca_file.display().to_string(),
                    "client_identity": match c.identity {
                        crate::chain::cert::ClientIdentity::San => "san",
                        crate::chain::cert::ClientIdentity::Subject => "subject",
                    },
                    "client_plan": c.plan,
                })),
            })),
            "key_hash_secret": if s.key_hash_secret.is_some() { "set" } else { "not set" },
            "trusted_proxies": s.trusted_proxies.nets().iter().map(ToString::to_string).collect::<Vec<_>>(),
            "allow_ips": address_list(s.addresses.as_deref(), true),
            "deny_ips": address_list(s.addresses.as_deref(), false),
            "ipv4_prefix": s.grouping.ipv4_prefix,
            "ipv6_prefix": s.grouping.ipv6_prefix,
            "ip_limit": s.ip_limit.as_ref().map(ip_limit),
            "max_tracked_ips": s.max_tracked_ips,
            "max_tracked_keys": s.max_tracked_keys,
            "max_cached_tokens": s.max_cached_tokens,
            "on_store_error": s.on_store_error.as_str(),
        },
        "admin": {
            "listen": config.admin.listen.to_string(),
            "token": if config.admin.tokens.iter().any(|(n, _)| n == "admin") { "set" } else { "not set" },
            // Names only: the values are secrets.
            "tokens": config.admin.tokens.iter().map(|(n, _)| n.as_str()).filter(|n| config.admin.may_write(n)).collect::<Vec<_>>(),
            "read_tokens": config.admin.readers,
            "hosts": config.admin.hosts,
        },
        "store": store(&config.store),
        "tracing": config.tracing.as_ref().map(|t| json!({
            "endpoint": redact_url(&t.export.endpoint),
            "protocol": t.export.protocol.as_str(),
            "compression": t.export.compression.as_str(),
            // Names only: the values are secrets.
            "headers": t.export.headers.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(),
            "ca_file": if t.export.ca_pem.is_some() { "set" } else { "not set" },
            "service_name": t.export.service_name,
            "sample_ratio": t.sample_ratio,
            "parent_based": t.parent_based.as_str(),
            "max_sampled_per_second": t.max_sampled_per_second.unwrap_or(0),
            "queue": t.export.queue,
            "batch": t.export.batch,
            "export_interval": format_duration(t.export.interval),
            "export_timeout": format_duration(t.export.timeout),
        })),
        "upstreams": config.upstreams.values().map(|u| json!({
            "name": u.name,
            "servers": u.servers,
            "balance": match u.balance {
                crate::upstream::balance::Balance::RoundRobin => "round_robin",
                crate::upstream::balance::Balance::LeastRequest => "least_request",
            },
            "keepalive_timeout": format_duration(u.keepalive_timeout),
            "health_check": u.health_check.as_ref().map(|h| json!({
                "path": h.path,
                "host": h.host,
                "interval": format_duration(h.interval),
                "timeout": format_duration(h.timeout),
                "unhealthy_threshold": h.unhealthy_threshold,
                "healthy_threshold": h.healthy_threshold,
            })),
            "shedding": u.shedding.as_ref().map(shedding),
            "outlier_detection": u.outlier_detection.as_ref().map(|o| json!({
                "consecutive_failures": o.consecutive_failures,
                "base_ejection_time": format_duration(o.base_ejection_time),
                "max_ejection_time": format_duration(o.max_ejection_time),
                "max_ejected_percent": o.max_ejected_percent,
                "on": failures(&o.on),
            })),
        })).collect::<Vec<_>>(),
        "routes": config.routes.iter().map(|r| json!({
            "name": r.name,
            "path_prefix": r.path_prefix,
            "host": r.host,
            "methods": r.methods.as_ref().map(|ms| ms.iter().map(|m| m.as_str()).collect::<Vec<_>>()),
            "upstream": r.upstream,
            "answers": r.answer.as_deref().map(|a| a.describe()),
            "connect_timeout": format_duration(r.connect_timeout),
            "read_timeout": format_duration(r.read_timeout),
            "write_timeout": format_duration(r.write_timeout),
            "upgrade_idle_timeout": format_duration(r.upgrade_idle_timeout),
            "upgrades": match &r.upgrades {
                crate::chain::message::Upgrades::Any => json!(true),
                crate::chain::message::Upgrades::Never => json!(false),
                crate::chain::message::Upgrades::Only(names) => json!(names),
            },
            "reserve_from": r.reserve_from.as_ref().map(|p| p.describe()),
            "allow_ips": address_list(r.addresses.as_deref(), true),
            "deny_ips": address_list(r.addresses.as_deref(), false),
            // Names only: a value may carry a credential for the upstream.
            "request_headers": r.request_headers.as_deref().map(rule_names),
            "response_headers": r.response_headers.as_deref().map(rule_names),
            "cors": r.cors.as_deref().map(|c| json!({
                "origins": c.origins.iter().map(|o| o.describe()).collect::<Vec<_>>(),
                "methods": c.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "headers": match &c.headers {
                    crate::chain::cors::AllowedHeaders::Any => json!("*"),
                    crate::chain::cors::AllowedHeaders::Only(l) =>
                        json!(l.iter().map(|h| h.as_str()).collect::<Vec<_>>()),
                },
                "credentials": c.credentials,
                "upstream": if c.keep_upstream { "keep" } else { "replace" },
            })),
            "callers": r.callers.as_deref().map(|c| json!({
                "allow_clients": c.allow_clients.iter().collect::<Vec<_>>(),
                "allow_plans": c.allow_plans.iter().collect::<Vec<_>>(),
                "deny_clients": c.deny_clients.iter().collect::<Vec<_>>(),
                "deny_plans": c.deny_plans.iter().collect::<Vec<_>>(),
            })),
            "strip_prefix": r.strip_prefix,
            "add_prefix": r.add_prefix,
            "forwarded": r.forwarded,
            "ip_limit": match r.ip_limit {
                IpLimitChoice::ServerDefault => json!("server default"),
                IpLimitChoice::Off => json!("off"),
                IpLimitChoice::Own(l) => ip_limit(&l),
            },
            "auth": match r.auth.names().as_slice() { [one] => json!(one), many => json!(many) },
            "cost": r.cost,
            "rate_limit_headers": match r.rate_limit_headers {
                HeadersMode::On => "on",
                HeadersMode::Off => "off",
                HeadersMode::NearLimit => "near_limit",
            },
            "legacy_rate_limit_headers": r.legacy_rate_limit_headers,
            "forward_api_key": r.forward_api_key,
            "on_store_error": FailureMode::as_str(r.on_store_error),
            "shadow": r.shadow,
            "max_concurrent": r.max_concurrent,
            "limits": r.limits.iter().map(|l| json!({
                "name": &*l.policy.name,
                "algorithm": l.policy.algorithm.as_str(),
                "limit": l.policy.limit(),
                "window": window(&l.policy),
                "burst": l.policy.burst(),
                "shadow": l.shadow,
                "key": l.key.iter().map(|p| p.describe()).collect::<Vec<_>>(),
                "missing": l.missing.as_str(),
            })).collect::<Vec<_>>(),
            "body_key_bytes": r.body_key_bytes,
            "priority": r.priority.as_str(),
            "issuers": r.issuers,
            "token_from": r.auth.jwt.then(|| r.token_from.describe()),
            "forward_token": r.forward_token,
            "forward_claims": r.forward_claims.iter().map(|(h, c)| (h.to_string(), json!(c.as_str()))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "plans": config.plans.values().map(|p| json!({
            "name": p.name,
            "limits": p.limits.iter().zip(&p.shadow).map(|(l, shadow)| json!({
                "name": &*l.name,
                "algorithm": l.algorithm.as_str(),
                "limit": l.limit(),
                "window": window(l),
                "burst": l.burst(),
                "shadow": shadow,
            })).collect::<Vec<_>>(),
            "max_concurrent": p.max_concurrent,
            "lease": p.lease,
            "priority": p.priority.map(|p| p.as_str()),
        })).collect::<Vec<_>>(),
        "clients": config.clients.iter().map(|c| json!({
            "id": c.id,
            "plan": c.plan,
            "api_keys": format!("{} redacted", c.api_keys.len()),
        })).collect::<Vec<_>>(),
        "issuers": config.issuers.values().map(issuer).collect::<Vec<_>>(),
    })
}

/// A limit's window as written: a duration, or a calendar unit and its time zone.
fn window(policy: &crate::limit::Policy) -> Value {
    match policy.calendar() {
        Some(c) => json!({"calendar": c.unit.as_str(), "time_zone": c.zone}),
        None => json!(format_duration(std::time::Duration::from_millis(
            policy.window_ms()
        ))),
    }
}

/// An issuer without its secrets: a JWKS URL's credentials and query redacted, fixed keys
/// and HMAC secrets only as "set".
fn issuer(i: &super::model::IssuerConfig) -> Value {
    use super::model::IssuerKeys;
    json!({
        "name": i.name,
        "issuer": i.issuer,
        "audiences": i.audiences,
        "algorithms": i.algorithms.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>(),
        "jwks_url": match &i.keys { IssuerKeys::Jwks(j) => Some(j.shown_url.clone()), _ => None },
        "jwks_refresh": match &i.keys { IssuerKeys::Jwks(j) => Some(format_duration(j.refresh)), _ => None },
        "jwks_min_refresh": match &i.keys { IssuerKeys::Jwks(j) => Some(format_duration(j.min_refresh)), _ => None },
        "keys": if matches!(i.keys, IssuerKeys::Fixed(_)) { "set" } else { "not set" },
        "secret": if matches!(i.keys, IssuerKeys::Hmac(_)) { "set" } else { "not set" },
        "leeway": format_duration(i.leeway),
        "required_claims": i.required.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "client_id_claim": i.client_id_claim.as_str(),
        "plan": i.plan,
        "plan_claim": i.plan_claim.as_ref().map(|c| c.as_str()),
        "groups_claim": i.groups_claim.as_ref().map(|c| c.as_str()),
        "plans": i.plans,
    })
}

fn shedding(s: &crate::upstream::shed::GateSettings) -> Value {
    let c = &s.controller;
    json!({
        "min_limit": c.min_limit,
        "max_limit": c.max_limit,
        "initial_limit": c.initial_limit,
        "tolerance": c.tolerance,
        "window": format_duration(c.window),
        "baseline_interval": format_duration(c.baseline_interval),
        "smoothing": c.smoothing,
        "queue": s.queue,
        "queue_timeout": format_duration(s.queue_timeout),
        "reserve_critical": s.reserve_critical,
        "reserve_default": s.reserve_default,
    })
}

fn ip_limit(l: &IpLimitConfig) -> Value {
    json!({ "rate": l.rate.to_string(), "burst": l.burst })
}

fn store(store: &StoreConfig) -> Value {
    match store {
        StoreConfig::Memory => json!({ "kind": "memory" }),
        StoreConfig::Redis(r, f) => {
            let (kind, nodes): (&str, Vec<String>) = match &r.topology {
                Topology::Single(url) => ("redis", vec![redact_url(url)]),
                Topology::Cluster(urls) => (
                    "redis_cluster",
                    urls.iter().map(|u| redact_url(u)).collect(),
                ),
                Topology::Sentinel { sentinels, .. } => (
                    "redis_sentinel",
                    sentinels.iter().map(|u| redact_url(u)).collect(),
                ),
            };
            let master = match &r.topology {
                Topology::Sentinel { master, .. } => Some(master.as_str()),
                _ => None,
            };
            json!({
                "kind": kind,
                "nodes": nodes,
                "master_name": master,
                "username": r.auth.username,
                "password": if r.auth.password.is_some() { "set" } else { "not set" },
                "tls_ca_file": r.tls.ca_file.as_ref().map(|p| p.display().to_string()),
                "tls_client_cert": r.tls.client_cert.as_ref().map(|(c, _)| c.display().to_string()),
                "prefix": r.prefix,
                "timeout": format_duration(r.timeout),
                "breaker_failures": f.breaker_failures,
                "breaker_cooldown": format_duration(f.breaker_cooldown),
                "expected_instances": f.expected_instances,
                "heartbeat_interval": format_duration(f.heartbeat_interval),
                "concurrency_slot_ttl": format_duration(r.slot_ttl),
                "batch_max": r.batch_max,
                "batch_in_flight": r.batch_in_flight,
                "startup_grace": format_duration(r.startup_grace),
                "decide_with": r.decide_with.as_str(),
            })
        }
    }
}

/// Query parameters of a Redis URL shown as they are; every other one's value is `***`.
const SHOWN_QUERY_PARAMETERS: [&str; 3] = ["db", "protocol", "user"];

/// A Redis URL with every credential replaced by `***`: the password of the user info
/// (`redis://user:secret@host` → `redis://user:***@host`), and the value of every query
/// parameter but `db`, `protocol` and `user` (`redis+unix:///run/redis.sock?pass=secret` →
/// `…?pass=***`) — an allow-list, so a parameter this code does not know is hidden too.
/// Anything that does not parse as a URL is hidden whole.
pub fn redact_url(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        return "***".to_owned();
    };
    if url.password().is_some() && url.set_password(Some("***")).is_err() {
        return "***".to_owned();
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let shown = SHOWN_QUERY_PARAMETERS.contains(&k.as_ref());
                (
                    k.into_owned(),
                    if shown {
                        v.into_owned()
                    } else {
                        "***".to_owned()
                    },
                )
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if url.fragment().is_some() {
        url.set_fragment(Some("***"));
    }
    // The serializer percent-encodes the asterisks of a query value; show them plainly.
    url.as_str().replace("%2A%2A%2A", "***")
}

/// What counts as a failure for outlier detection, as configured.
fn failures(on: &crate::upstream::outlier::Failures) -> Vec<&'static str> {
    [
        ("5xx", on.status_5xx),
        ("connect", on.connect),
        ("timeout", on.timeout),
        ("reset", on.reset),
    ]
    .into_iter()
    .filter(|(_, counted)| *counted)
    .map(|(name, _)| name)
    .collect()
}

/// A route's header rules by name: what is set, added and removed (values left out).
fn rule_names(rules: &crate::chain::header_rules::HeaderRules) -> Value {
    let names = |list: &[(http::HeaderName, crate::chain::header_rules::Template)]| {
        list.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>()
    };
    json!({
        "set": names(&rules.set),
        "add": names(&rules.add),
        "remove": rules.remove.iter().map(http::HeaderName::as_str).collect::<Vec<_>>(),
    })
}

/// `allow_ips` (`allow`) or `deny_ips` as configured; `null` for no allow list (every address).
fn address_list(rules: Option<&crate::chain::address::AddressRules>, allow: bool) -> Value {
    let nets = rules.map(|r| if allow { &r.allow_nets } else { &r.deny_nets });
    match nets {
        Some(nets) if !nets.is_empty() => {
            json!(nets.iter().map(ToString::to_string).collect::<Vec<_>>())
        }
        _ if allow => Value::Null,
        _ => json!([]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_redacted() {
        assert_eq!(redact_url("redis://:secret@h:6379"), "redis://:***@h:6379");
        assert_eq!(
            redact_url("redis://user:secret@h:6379/2"),
            "redis://user:***@h:6379/2"
        );
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(
            redact_url("redis+unix:///run/redis.sock?db=2&pass=secret&user=gw"),
            "redis+unix:///run/redis.sock?db=2&pass=***&user=gw"
        );
        assert_eq!(
            redact_url("unix:///run/redis.sock?password=secret&token=x"),
            "unix:///run/redis.sock?password=***&token=***"
        );
        assert_eq!(
            redact_url("rediss://u:p%40ss@h:6380/0?protocol=resp3#frag"),
            "rediss://u:***@h:6380/0?protocol=resp3#***"
        );
        assert_eq!(redact_url("not a url with secret"), "***");
    }

    #[test]
    fn keys_and_tokens_never_appear() {
        let text = r#"
[admin]
token = "admin-token-0123456789"
[store]
kind = "redis"
url = "redis://:hunter2@127.0.0.1:6379"
[upstreams.u]
servers = ["127.0.0.1:1"]
[plans.p]
limits = [{ name = "l", algorithm = "fixed_window", limit = 1, window = "1s" }]
[[clients]]
id = "ada"
plan = "p"
api_keys = ["plaintext-key-0123456789", "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"]
[[routes]]
name = "r"
path_prefix = "/"
upstream = "u"
"#;
        let view = render(&Config::parse(text).unwrap()).to_string();
        for secret in [
            "plaintext-key-0123456789",
            "ba7816bf",
            "admin-token-0123456789",
            "hunter2",
        ] {
            assert!(!view.contains(secret), "{secret} leaked: {view}");
        }
        assert!(view.contains("2 redacted"));
        assert!(view.contains(r#""token":"set""#));
    }
}
