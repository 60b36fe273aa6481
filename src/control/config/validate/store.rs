//! `[store]`: memory, Redis, Redis Cluster or Sentinel (one set of fields, checked per kind),
//! timeouts, the breaker and the fallback.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::{FailureModeFile, StoreFile, StoreKindFile};
use crate::control::config::model::StoreConfig;
use crate::control::config::units::HumanDuration;
use crate::control::config::units::SecretSource;
use crate::limit::store::redis::config::DecideWith;
use crate::limit::store::redis::{RedisAuth, RedisConfig, RedisTls, Topology};
use crate::limit::store::{FailureMode, FailureSettings};
use std::time::Duration;

pub(super) fn store_config(file: Option<StoreFile>, problems: &mut Problems) -> StoreConfig {
    let Some(file) = file else {
        return StoreConfig::Memory;
    };
    let kind = file.kind;
    let Some(topology) = topology(&file, problems) else {
        return StoreConfig::Memory;
    };
    let StoreFile {
        username,
        password,
        tls_ca_file,
        tls_client_cert,
        tls_client_key,
        prefix,
        timeout,
        breaker_failures,
        breaker_cooldown,
        expected_instances,
        heartbeat_interval,
        concurrency_slot_ttl,
        concurrency_lease,
        batch_max,
        batch_in_flight,
        startup_grace,
        decide_with,
        ..
    } = file;
    debug_assert_ne!(kind, StoreKindFile::Memory);
    let auth = RedisAuth {
        username,
        password: password
            .and_then(|p| secret("store.password", &p, problems))
            .map(|p| p.expose().to_owned()),
    };
    let tls = redis_tls(tls_ca_file, tls_client_cert, tls_client_key, problems);
    let prefix = prefix.unwrap_or_else(|| defaults::STORE_PREFIX.to_owned());
    let prefix_ok = !prefix.is_empty()
        && prefix.len() <= MAX_NAME_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if !prefix_ok {
        problems.push(
            "store.prefix",
            format!("invalid prefix {prefix:?}: expected 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ - . : (no braces: the hash tag is the client id)"),
        );
    }
    let breaker_failures = at_least_one(
        "store.breaker_failures",
        breaker_failures,
        defaults::BREAKER_FAILURES,
        problems,
    );
    let expected_instances = at_least_one(
        "store.expected_instances",
        expected_instances,
        defaults::EXPECTED_INSTANCES,
        problems,
    );
    StoreConfig::Redis(
        RedisConfig {
            topology,
            auth,
            tls,
            prefix,
            timeout: positive(
                "store.timeout".to_owned(),
                timeout,
                defaults::STORE_TIMEOUT,
                problems,
            ),
            slot_ttl: slot_ttl(concurrency_slot_ttl, concurrency_lease, problems),
            batch_max: batch_size(batch_max, problems),
            batch_in_flight: in_flight(batch_in_flight, problems),
            startup_grace: grace(startup_grace, problems),
            decide_with: decide_with_of(decide_with, &kind, problems),
        },
        FailureSettings {
            breaker_failures,
            breaker_cooldown: positive(
                "store.breaker_cooldown".to_owned(),
                breaker_cooldown,
                defaults::BREAKER_COOLDOWN,
                problems,
            ),
            expected_instances,
            heartbeat_interval: positive(
                "store.heartbeat_interval".to_owned(),
                heartbeat_interval,
                defaults::HEARTBEAT_INTERVAL,
                problems,
            ),
        },
    )
}

/// The addresses of the store's kind, each field checked against the kind: the one it needs
/// present, the other kinds' absent. `None` for the memory store (or when the kind's
/// addresses are missing: the problem is recorded).
fn topology(file: &StoreFile, problems: &mut Problems) -> Option<Topology> {
    let kind = file.kind;
    let present = [
        ("url", file.url.is_some()),
        ("nodes", file.nodes.is_some()),
        ("master_name", file.master_name.is_some()),
        ("sentinels", file.sentinels.is_some()),
    ];
    let takes: &[&str] = match kind {
        StoreKindFile::Memory => &[],
        StoreKindFile::Redis => &["url"],
        StoreKindFile::RedisCluster => &["nodes"],
        StoreKindFile::RedisSentinel => &["master_name", "sentinels"],
    };
    for (field, set) in present {
        if set && !takes.contains(&field) {
            problems.push(
                format!("store.{field}"),
                format!("not a setting of kind = \"{}\"", kind.as_str()),
            );
        }
    }
    if kind == StoreKindFile::Memory {
        let redis_only = [
            ("username", file.username.is_some()),
            ("password", file.password.is_some()),
            ("tls_ca_file", file.tls_ca_file.is_some()),
            ("tls_client_cert", file.tls_client_cert.is_some()),
            ("tls_client_key", file.tls_client_key.is_some()),
            ("prefix", file.prefix.is_some()),
            ("timeout", file.timeout.is_some()),
            ("breaker_failures", file.breaker_failures.is_some()),
            ("breaker_cooldown", file.breaker_cooldown.is_some()),
            ("expected_instances", file.expected_instances.is_some()),
            ("heartbeat_interval", file.heartbeat_interval.is_some()),
            ("concurrency_slot_ttl", file.concurrency_slot_ttl.is_some()),
            ("concurrency_lease", file.concurrency_lease.is_some()),
            ("batch_max", file.batch_max.is_some()),
            ("batch_in_flight", file.batch_in_flight.is_some()),
            ("startup_grace", file.startup_grace.is_some()),
            ("decide_with", file.decide_with.is_some()),
        ];
        for (field, set) in redis_only {
            if set {
                problems.push(
                    format!("store.{field}"),
                    "not a setting of kind = \"memory\" (it is one of the Redis kinds')",
                );
            }
        }
        return None;
    }
    let missing = |problems: &mut Problems, field: &str| {
        problems.push(
            format!("store.{field}"),
            format!("required with kind = \"{}\"", kind.as_str()),
        );
    };
    match kind {
        StoreKindFile::Memory => None,
        StoreKindFile::Redis => {
            let Some(url) = &file.url else {
                missing(problems, "url");
                return None;
            };
            check_redis_url("store.url", url, problems);
            Some(Topology::Single(url.clone()))
        }
        StoreKindFile::RedisCluster => {
            let Some(nodes) = &file.nodes else {
                missing(problems, "nodes");
                return None;
            };
            if nodes.is_empty() {
                problems.push("store.nodes", "at least one seed node is required");
            }
            for (i, url) in nodes.iter().enumerate() {
                check_redis_url(&format!("store.nodes[{i}]"), url, problems);
            }
            Some(Topology::Cluster(nodes.clone()))
        }
        StoreKindFile::RedisSentinel => {
            let (Some(master), Some(sentinels)) = (&file.master_name, &file.sentinels) else {
                if file.master_name.is_none() {
                    missing(problems, "master_name");
                }
                if file.sentinels.is_none() {
                    missing(problems, "sentinels");
                }
                return None;
            };
            if master.is_empty() || master.chars().any(|c| c.is_whitespace() || c.is_control()) {
                problems.push(
                    "store.master_name",
                    "expected the name the sentinels monitor the primary under",
                );
            }
            if sentinels.is_empty() {
                problems.push("store.sentinels", "at least one sentinel is required");
            }
            for (i, url) in sentinels.iter().enumerate() {
                check_redis_url(&format!("store.sentinels[{i}]"), url, problems);
            }
            Some(Topology::Sentinel {
                master: master.clone(),
                sentinels: sentinels.clone(),
            })
        }
    }
}

/// `store.tls_ca_file`, `store.tls_client_cert` + `store.tls_client_key`: files that must
/// exist (read when the store connects).
fn redis_tls(
    ca_file: Option<String>,
    client_cert: Option<String>,
    client_key: Option<SecretSource>,
    problems: &mut Problems,
) -> RedisTls {
    let readable = |path: &str, file: &str, problems: &mut Problems| {
        if let Err(e) = std::fs::metadata(file) {
            problems.push(path, format!("cannot read {file}: {}", e.kind()));
        }
    };
    if let Some(ca) = &ca_file {
        readable("store.tls_ca_file", ca, problems);
    }
    let key = client_key
        .and_then(|k| secret("store.tls_client_key", &k, problems))
        .map(|k| k.expose().to_owned());
    let client_cert = match (client_cert, key) {
        (Some(cert), Some(key)) => {
            readable("store.tls_client_cert", &cert, problems);
            // The key's path may be a secret: not quoted.
            if std::fs::metadata(&key).is_err() {
                problems.push("store.tls_client_key", "the key file cannot be read");
            }
            Some((cert.into(), key.into()))
        }
        (None, None) => None,
        _ => {
            problems.push(
                "store.tls_client_cert",
                "a client certificate needs both tls_client_cert and tls_client_key",
            );
            None
        }
    };
    RedisTls {
        ca_file: ca_file.map(Into::into),
        client_cert,
    }
}

pub(super) fn failure_mode(file: FailureModeFile) -> FailureMode {
    match file {
        FailureModeFile::FailOpen => FailureMode::FailOpen,
        FailureModeFile::FailClosed => FailureMode::FailClosed,
        FailureModeFile::Local => FailureMode::Local,
    }
}

pub(super) fn check_redis_url(path: &str, url: &str, problems: &mut Problems) {
    use redis::IntoConnectionInfo;
    let scheme_ok = ["redis://", "rediss://", "unix://", "redis+unix://"]
        .iter()
        .any(|s| url.starts_with(s));
    if !scheme_ok {
        problems.push(path, "expected a URL like \"redis://127.0.0.1:6379\"");
    } else if let Err(e) = url.into_connection_info() {
        // The error may quote the URL; URLs can hold passwords, so it is not echoed.
        problems.push(path, format!("not a usable Redis URL ({})", e.category()));
    }
}

/// `store.concurrency_slot_ttl`, or its old name `concurrency_lease` (accepted, with a
/// warning: "lease" now means quota leasing only).
fn slot_ttl(
    ttl: Option<HumanDuration>,
    old: Option<HumanDuration>,
    problems: &mut Problems,
) -> Duration {
    let (path, value) = match (ttl, old) {
        (Some(_), Some(_)) => {
            problems.push(
                "store.concurrency_lease",
                "the old name of store.concurrency_slot_ttl, given as well: keep one",
            );
            ("store.concurrency_slot_ttl", ttl)
        }
        (None, Some(_)) => {
            problems.warn(
                "store.concurrency_lease",
                "deprecated: renamed store.concurrency_slot_ttl (the old name is still read)",
            );
            ("store.concurrency_lease", old)
        }
        _ => ("store.concurrency_slot_ttl", ttl),
    };
    positive(
        path.to_owned(),
        value,
        defaults::CONCURRENCY_SLOT_TTL,
        problems,
    )
}

/// `store.decide_with`: "module" is refused on a Redis Cluster, which always decides with
/// the scripts (its batches span slots: `native.rs`) — it would be silently ignored.
fn decide_with_of(
    value: Option<DecideWith>,
    kind: &StoreKindFile,
    problems: &mut Problems,
) -> DecideWith {
    let value = value.unwrap_or_default();
    if value == DecideWith::Module && matches!(kind, StoreKindFile::RedisCluster) {
        problems.push(
            "store.decide_with",
            "\"module\" is not available on kind = \"redis_cluster\": a Redis Cluster decides with the Lua scripts (use \"auto\" or \"lua\")",
        );
        return DecideWith::Auto;
    }
    value
}

/// `store.batch_in_flight`: 1 to `STORE_BATCH_IN_FLIGHT_LIMIT`.
fn in_flight(value: Option<usize>, problems: &mut Problems) -> usize {
    match value {
        None => defaults::STORE_BATCH_IN_FLIGHT,
        Some(n) if (1..=defaults::STORE_BATCH_IN_FLIGHT_LIMIT).contains(&n) => n,
        Some(n) => {
            problems.push(
                "store.batch_in_flight",
                format!(
                    "{n} is out of range: 1 (decisions queue behind every call) to {}",
                    defaults::STORE_BATCH_IN_FLIGHT_LIMIT
                ),
            );
            defaults::STORE_BATCH_IN_FLIGHT
        }
    }
}

/// `store.startup_grace`: 0 (requests never wait for a warm-up) to `STARTUP_GRACE_LIMIT`.
fn grace(value: Option<HumanDuration>, problems: &mut Problems) -> Duration {
    let Some(HumanDuration(grace)) = value else {
        return defaults::STARTUP_GRACE;
    };
    if grace > defaults::STARTUP_GRACE_LIMIT {
        problems.push(
            "store.startup_grace",
            format!(
                "{grace:?} is too long: at most {:?} (after it the instance is ready, and a Redis still not warm is met by each route's failure mode)",
                defaults::STARTUP_GRACE_LIMIT
            ),
        );
        return defaults::STARTUP_GRACE;
    }
    grace
}

/// `store.batch_max`: 1 (no batching) to `STORE_BATCH_MAX_LIMIT`.
fn batch_size(value: Option<usize>, problems: &mut Problems) -> usize {
    match value {
        None => defaults::STORE_BATCH_MAX,
        Some(n) if (1..=defaults::STORE_BATCH_MAX_LIMIT).contains(&n) => n,
        Some(n) => {
            problems.push(
                "store.batch_max",
                format!(
                    "{n} is out of range: 1 (every decision its own call) to {}",
                    defaults::STORE_BATCH_MAX_LIMIT
                ),
            );
            defaults::STORE_BATCH_MAX
        }
    }
}
