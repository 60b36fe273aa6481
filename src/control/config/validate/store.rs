//! `[store]`: memory, Redis or Redis Cluster, timeouts, the breaker and the fallback.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::{FailureModeFile, StoreFile};
use crate::control::config::model::StoreConfig;
use crate::control::config::units::HumanDuration;
use crate::limit::store::redis::{RedisConfig, Topology};
use crate::limit::store::{FailureMode, FailureSettings};
use std::time::Duration;

pub(super) fn store_config(file: Option<StoreFile>, problems: &mut Problems) -> StoreConfig {
    let (
        topology,
        prefix,
        timeout,
        breaker_failures,
        breaker_cooldown,
        expected_instances,
        heartbeat_interval,
        concurrency_slot_ttl,
        concurrency_lease,
    ) = match file {
        None | Some(StoreFile::Memory {}) => return StoreConfig::Memory,
        Some(StoreFile::Redis {
            url,
            prefix,
            timeout,
            breaker_failures,
            breaker_cooldown,
            expected_instances,
            heartbeat_interval,
            concurrency_slot_ttl,
            concurrency_lease,
        }) => {
            check_redis_url("store.url", &url, problems);
            (
                Topology::Single(url),
                prefix,
                timeout,
                breaker_failures,
                breaker_cooldown,
                expected_instances,
                heartbeat_interval,
                concurrency_slot_ttl,
                concurrency_lease,
            )
        }
        Some(StoreFile::RedisCluster {
            nodes,
            prefix,
            timeout,
            breaker_failures,
            breaker_cooldown,
            expected_instances,
            heartbeat_interval,
            concurrency_slot_ttl,
            concurrency_lease,
        }) => {
            if nodes.is_empty() {
                problems.push("store.nodes", "at least one seed node is required");
            }
            for (i, url) in nodes.iter().enumerate() {
                check_redis_url(&format!("store.nodes[{i}]"), url, problems);
            }
            (
                Topology::Cluster(nodes),
                prefix,
                timeout,
                breaker_failures,
                breaker_cooldown,
                expected_instances,
                heartbeat_interval,
                concurrency_slot_ttl,
                concurrency_lease,
            )
        }
    };
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
    let breaker_failures = match breaker_failures {
        Some(0) => {
            problems.push("store.breaker_failures", "must be at least 1");
            defaults::BREAKER_FAILURES
        }
        Some(n) => n,
        None => defaults::BREAKER_FAILURES,
    };
    let expected_instances = match expected_instances {
        Some(0) => {
            problems.push("store.expected_instances", "must be at least 1");
            defaults::EXPECTED_INSTANCES
        }
        Some(n) => n,
        None => defaults::EXPECTED_INSTANCES,
    };
    StoreConfig::Redis(
        RedisConfig {
            topology,
            prefix,
            timeout: positive(
                "store.timeout".to_owned(),
                timeout,
                defaults::STORE_TIMEOUT,
                problems,
            ),
            slot_ttl: slot_ttl(concurrency_slot_ttl, concurrency_lease, problems),
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
