//! Serde mirror → typed [`Config`]: defaults applied, values checked, cross-references
//! resolved. Every field of the mirror is destructured, so adding a field to `file.rs` does
//! not compile until it is handled here. All problems are collected, not just the first.

use super::file::{
    AccessLogFile, AccessLogModeFile, AdminFile, AlgorithmFile, AuthFile, ClientFile,
    FailureModeFile, FileConfig, HeadersModeFile, HealthCheckFile, IpLimitFile, IpLimitSetting,
    LimitFile, PlanFile, RouteFile, ServerFile, StoreFile, UpstreamFile,
};
use super::units::HumanDuration;
use super::{
    defaults, AccessLogConfig, AdminConfig, Auth, ClientConfig, Config, FailureMode, HeadersMode,
    HealthCheckConfig, IpLimitChoice, IpLimitConfig, PlanConfig, Problem, RequestLimits,
    RouteConfig, ServerConfig, StoreConfig, UpstreamConfig, IP_POLICY_NAME,
};
use crate::chain::auth::KeyDigest;
use crate::chain::identity::{Grouping, TrustedProxies};
use crate::limit::algorithm::MAX_PRODUCT;
use crate::limit::store::redis::{RedisConfig, Topology};
use crate::limit::store::FailureSettings;
use crate::limit::{Algorithm, Policy};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Longest route / upstream name accepted (names end up in metric labels and store keys).
pub const MAX_NAME_LEN: usize = 64;
const MAX_THREADS: usize = 1024;

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
            location: None,
        });
    }
}

impl TryFrom<FileConfig> for Config {
    type Error = Vec<Problem>;

    fn try_from(file: FileConfig) -> Result<Config, Vec<Problem>> {
        let FileConfig {
            server,
            admin,
            access_log,
            upstreams,
            routes,
            store,
            plans,
            clients,
        } = file;
        let mut problems = Problems::default();
        let server = server_config(server, &mut problems);
        let admin = admin_config(admin, &mut problems);
        let access_log = access_log_config(access_log, &mut problems);
        let store = store_config(store, &mut problems);
        let plans: BTreeMap<String, PlanConfig> = plans
            .into_iter()
            .map(|(name, plan)| {
                let cfg = plan_config(&name, plan, &mut problems);
                (name, cfg)
            })
            .collect();
        let clients = clients_config(clients, &plans, &mut problems);
        let upstreams: BTreeMap<String, UpstreamConfig> = upstreams
            .into_iter()
            .map(|(name, up)| {
                let cfg = upstream_config(&name, up, &mut problems);
                (name, cfg)
            })
            .collect();
        if routes.is_empty() {
            problems.push("routes", "at least one [[routes]] entry is required");
        }
        let routes: Vec<RouteConfig> = routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| route_config(i, r, &upstreams, &server, &mut problems))
            .collect();
        check_route_overlaps(&routes, &mut problems);
        check_costs(&routes, &plans, &mut problems);
        if problems.0.is_empty() {
            Ok(Config {
                server,
                admin,
                access_log,
                upstreams,
                routes,
                store,
                plans,
                clients,
            })
        } else {
            Err(problems.0)
        }
    }
}

fn server_config(file: ServerFile, problems: &mut Problems) -> ServerConfig {
    let ServerFile {
        listen,
        threads,
        pid_file,
        upgrade_sock,
        grace_period,
        graceful_shutdown_timeout,
        upstream_keepalive_pool_size,
        watch_config,
        trusted_proxies,
        ipv4_prefix,
        ipv6_prefix,
        ip_limit,
        max_tracked_ips,
        on_store_error,
        header_timeout,
        body_timeout,
        keepalive_timeout,
        max_header_bytes,
        max_header_count,
        max_uri_length,
        max_body_bytes,
    } = file;
    let listen_text = listen.unwrap_or_else(|| defaults::LISTEN.to_owned());
    let listen = listen_text.parse::<SocketAddr>().unwrap_or_else(|_| {
        problems.push(
            "server.listen",
            format!("{listen_text:?} is not an address: expected ip:port like \"0.0.0.0:8080\""),
        );
        defaults::LISTEN
            .parse()
            .expect("default listen address parses")
    });
    let threads = threads.unwrap_or_else(defaults::threads);
    if threads == 0 || threads > MAX_THREADS {
        problems.push(
            "server.threads",
            format!("{threads} worker threads: expected 1 to {MAX_THREADS}"),
        );
    }
    ServerConfig {
        listen,
        threads,
        pid_file: pid_file.unwrap_or_else(|| defaults::PID_FILE.to_owned()),
        upgrade_sock: upgrade_sock.unwrap_or_else(|| defaults::UPGRADE_SOCK.to_owned()),
        grace_period: grace_period.map_or(defaults::GRACE_PERIOD, |d| d.0),
        graceful_shutdown_timeout: graceful_shutdown_timeout
            .map_or(defaults::GRACEFUL_SHUTDOWN_TIMEOUT, |d| d.0),
        upstream_keepalive_pool_size: upstream_keepalive_pool_size
            .unwrap_or(defaults::UPSTREAM_KEEPALIVE_POOL_SIZE),
        watch_config: watch_config.unwrap_or(true),
        trusted_proxies: trusted_proxies_config(trusted_proxies.unwrap_or_default(), problems),
        grouping: grouping_config(ipv4_prefix, ipv6_prefix, problems),
        ip_limit: ip_limit.map(|l| ip_limit_config("server.ip_limit", l, problems)),
        max_tracked_ips: match max_tracked_ips {
            Some(0) => {
                problems.push("server.max_tracked_ips", "must be at least 1");
                defaults::MAX_TRACKED_IPS
            }
            Some(n) => n,
            None => defaults::MAX_TRACKED_IPS,
        },
        on_store_error: on_store_error.map_or(defaults::ON_STORE_ERROR, failure_mode),
        limits: RequestLimits {
            header_timeout: positive(
                "server.header_timeout".into(),
                header_timeout,
                defaults::HEADER_TIMEOUT,
                problems,
            ),
            body_timeout: positive(
                "server.body_timeout".into(),
                body_timeout,
                defaults::BODY_TIMEOUT,
                problems,
            ),
            keepalive_timeout: {
                let d = positive(
                    "server.keepalive_timeout".into(),
                    keepalive_timeout,
                    defaults::CLIENT_KEEPALIVE_TIMEOUT,
                    problems,
                );
                if d < Duration::from_secs(1) {
                    problems.push(
                        "server.keepalive_timeout",
                        "must be at least 1s (whole seconds)",
                    );
                }
                d
            },
            max_header_bytes: bounded(
                "server.max_header_bytes",
                max_header_bytes,
                defaults::MAX_HEADER_BYTES,
                256,
                MAX_HEADER_BYTES_CAP,
                problems,
            ),
            max_header_count: bounded(
                "server.max_header_count",
                max_header_count,
                defaults::MAX_HEADER_COUNT,
                1,
                MAX_HEADER_COUNT_CAP,
                problems,
            ),
            max_uri_length: bounded(
                "server.max_uri_length",
                max_uri_length,
                defaults::MAX_URI_LENGTH,
                16,
                MAX_HEADER_BYTES_CAP,
                problems,
            ),
            max_body_bytes: max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES),
        },
    }
}

/// Pingora refuses headers beyond 1 MiB and 256 fields by itself; our limits stay below.
const MAX_HEADER_BYTES_CAP: usize = 1024 * 1024 - 1;
const MAX_HEADER_COUNT_CAP: usize = 256;

fn bounded(
    path: &str,
    value: Option<usize>,
    default: usize,
    min: usize,
    max: usize,
    problems: &mut Problems,
) -> usize {
    match value {
        Some(v) if v < min || v > max => {
            problems.push(path, format!("{v}: expected {min} to {max}"));
            default
        }
        Some(v) => v,
        None => default,
    }
}

fn access_log_config(file: AccessLogFile, problems: &mut Problems) -> AccessLogConfig {
    use crate::ops::access_log::{Mode, Target};
    let AccessLogFile { mode, sample, path } = file;
    let mode = match (mode.unwrap_or(AccessLogModeFile::Off), sample) {
        (AccessLogModeFile::Sampled, Some(f)) if f > 0.0 && f <= 1.0 => Mode::Sampled(f),
        (AccessLogModeFile::Sampled, Some(f)) => {
            problems.push(
                "access_log.sample",
                format!("{f}: expected a fraction greater than 0 and at most 1"),
            );
            Mode::Off
        }
        (AccessLogModeFile::Sampled, None) => {
            problems.push(
                "access_log.sample",
                "mode = \"sampled\" needs a sample fraction, like 0.1",
            );
            Mode::Off
        }
        (_, Some(_)) => {
            problems.push(
                "access_log.sample",
                "only mode = \"sampled\" takes a sample fraction",
            );
            Mode::Off
        }
        (AccessLogModeFile::Off, None) => Mode::Off,
        (AccessLogModeFile::On, None) => Mode::On,
    };
    let target = match path.as_deref() {
        None | Some("stdout") | Some("-") => Target::Stdout,
        Some("") => {
            problems.push("access_log.path", "expected \"stdout\" or a file path");
            Target::Stdout
        }
        Some(p) => Target::File(p.into()),
    };
    AccessLogConfig { mode, target }
}

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

fn admin_config(file: AdminFile, problems: &mut Problems) -> AdminConfig {
    let AdminFile { listen, token } = file;
    let text = listen.unwrap_or_else(|| defaults::ADMIN_LISTEN.to_owned());
    let listen = text.parse::<SocketAddr>().unwrap_or_else(|_| {
        problems.push(
            "admin.listen",
            format!("{text:?} is not an address: expected ip:port like \"127.0.0.1:9090\""),
        );
        defaults::ADMIN_LISTEN
            .parse()
            .expect("default admin address parses")
    });
    if let Some(token) = &token {
        if token.len() < MIN_ADMIN_TOKEN_LEN || !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            // The token itself is never echoed.
            problems.push(
                "admin.token",
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters"),
            );
        }
    }
    AdminConfig { listen, token }
}

fn store_config(file: Option<StoreFile>, problems: &mut Problems) -> StoreConfig {
    let (
        topology,
        prefix,
        timeout,
        breaker_failures,
        breaker_cooldown,
        expected_instances,
        heartbeat_interval,
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
            concurrency_lease: positive(
                "store.concurrency_lease".to_owned(),
                concurrency_lease,
                defaults::CONCURRENCY_LEASE,
                problems,
            ),
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

fn failure_mode(file: FailureModeFile) -> FailureMode {
    match file {
        FailureModeFile::FailOpen => FailureMode::FailOpen,
        FailureModeFile::FailClosed => FailureMode::FailClosed,
        FailureModeFile::Local => FailureMode::Local,
    }
}

fn check_redis_url(path: &str, url: &str, problems: &mut Problems) {
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

fn trusted_proxies_config(list: Vec<String>, problems: &mut Problems) -> TrustedProxies {
    let mut nets = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let parsed = text
            .parse::<ipnet::IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
        match parsed {
            Ok(net) => nets.push(net.trunc()),
            Err(_) => problems.push(
                format!("server.trusted_proxies[{i}]"),
                format!("{text:?}: expected a CIDR like \"10.0.0.0/8\" or an address like \"192.0.2.7\""),
            ),
        }
    }
    TrustedProxies::new(nets)
}

fn grouping_config(v4: Option<u8>, v6: Option<u8>, problems: &mut Problems) -> Grouping {
    let defaults = Grouping::default();
    let mut prefix = |path: &str, value: Option<u8>, max: u8, default: u8| match value {
        Some(p) if p == 0 || p > max => {
            problems.push(
                path,
                format!("{p}: expected a prefix length from 1 to {max}"),
            );
            default
        }
        Some(p) => p,
        None => default,
    };
    Grouping {
        ipv4_prefix: prefix("server.ipv4_prefix", v4, 32, defaults.ipv4_prefix),
        ipv6_prefix: prefix("server.ipv6_prefix", v6, 128, defaults.ipv6_prefix),
    }
}

fn ip_limit_config(path: &str, file: IpLimitFile, problems: &mut Problems) -> IpLimitConfig {
    let IpLimitFile { rate, burst } = file;
    let burst = burst.unwrap_or(rate.amount);
    if burst == 0 {
        problems.push(format!("{path}.burst"), "must be at least 1");
    }
    let period_ms = rate.period.as_millis() as u64;
    if burst.saturating_mul(period_ms) > MAX_PRODUCT
        || rate.amount.saturating_mul(period_ms) > MAX_PRODUCT
    {
        problems.push(
            path.to_owned(),
            "rate and burst are too large for exact arithmetic",
        );
    }
    IpLimitConfig {
        rate,
        burst: burst.max(1),
    }
}

fn algorithm(file: AlgorithmFile) -> Algorithm {
    match file {
        AlgorithmFile::TokenBucket => Algorithm::TokenBucket,
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::SlidingWindow => Algorithm::SlidingWindow,
        AlgorithmFile::SlidingLog => Algorithm::SlidingLog,
    }
}

/// Sliding logs keep one entry per admitted unit: cap them so a typo cannot eat the memory.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;

fn plan_config(name: &str, file: PlanFile, problems: &mut Problems) -> PlanConfig {
    let PlanFile {
        limits,
        max_concurrent,
    } = file;
    let base = format!("plans.{name}");
    check_name(&base, name, problems);
    if limits.is_empty() {
        problems.push(format!("{base}.limits"), "a plan needs at least one limit");
    }
    let mut policies: Vec<Policy> = Vec::with_capacity(limits.len());
    let mut shadows: Vec<bool> = Vec::with_capacity(limits.len());
    let mut leases: Vec<(String, Option<u64>)> = Vec::with_capacity(limits.len());
    if max_concurrent == Some(0) {
        problems.push(format!("{base}.max_concurrent"), "must be at least 1");
    }
    for (i, limit) in limits.into_iter().enumerate() {
        let LimitFile {
            name: limit_name,
            algorithm: alg,
            limit,
            window,
            burst,
            shadow,
            lease,
        } = limit;
        let path = format!("{base}.limits[{i}]");
        shadows.push(shadow.unwrap_or(false));
        leases.push((path.clone(), lease));
        check_name(&format!("{path}.name"), &limit_name, problems);
        if limit_name == IP_POLICY_NAME {
            problems.push(
                format!("{path}.name"),
                "\"ip\" is reserved for the per-IP limit",
            );
        }
        if [
            super::CONCURRENCY_POLICY_NAME,
            super::ROUTE_CONCURRENCY_POLICY_NAME,
        ]
        .contains(&limit_name.as_str())
        {
            problems.push(
                format!("{path}.name"),
                format!("{limit_name:?} is reserved for concurrency limits (max_concurrent)"),
            );
        }
        if policies.iter().any(|p| *p.name == *limit_name) {
            problems.push(
                format!("{path}.name"),
                format!("{limit_name:?} is used twice in this plan"),
            );
        }
        let alg = algorithm(alg);
        if limit == 0 {
            problems.push(format!("{path}.limit"), "must be at least 1");
        }
        let window_ms = window.0.as_millis() as u64;
        if window_ms == 0 {
            problems.push(format!("{path}.window"), "must be greater than zero");
        }
        let burst = match (alg, burst) {
            (Algorithm::TokenBucket, Some(0)) => {
                problems.push(format!("{path}.burst"), "must be at least 1");
                limit
            }
            (Algorithm::TokenBucket, Some(b)) => b,
            (Algorithm::TokenBucket, None) => limit,
            (_, Some(_)) => {
                problems.push(
                    format!("{path}.burst"),
                    format!("only token_bucket has a burst, not {alg}"),
                );
                limit
            }
            (_, None) => limit,
        };
        if burst.max(limit).saturating_mul(window_ms).saturating_mul(2) > MAX_PRODUCT {
            problems.push(
                path.clone(),
                "limit × window is too large for exact arithmetic",
            );
        }
        if alg == Algorithm::SlidingLog && limit > MAX_SLIDING_LOG_LIMIT {
            problems.push(
                format!("{path}.limit"),
                format!("a sliding_log keeps one entry per request: at most {MAX_SLIDING_LOG_LIMIT} (use sliding_window for larger limits)"),
            );
        }
        policies.push(Policy::new(
            &limit_name,
            alg,
            limit.max(1),
            window_ms.max(1),
            burst.max(1),
        ));
    }
    let lease = plan_lease(
        &base,
        &policies,
        &shadows,
        &leases,
        max_concurrent,
        problems,
    );
    PlanConfig {
        name: name.to_owned(),
        limits: policies,
        shadow: shadows,
        max_concurrent: max_concurrent.filter(|n| *n > 0),
        lease,
    }
}

/// Quota leasing is all or nothing per plan: one local lease decides every limit of a
/// request, so each must be a window that bounds the lease's life (fixed or sliding), and
/// enforced (a dry run counts every request, which a lease would hide). The plan leases the
/// smallest size its limits ask for.
fn plan_lease(
    base: &str,
    policies: &[Policy],
    shadows: &[bool],
    leases: &[(String, Option<u64>)],
    max_concurrent: Option<u64>,
    problems: &mut Problems,
) -> Option<u64> {
    if leases.iter().all(|(_, l)| l.is_none()) {
        return None;
    }
    if max_concurrent.is_some() {
        problems.push(
            format!("{base}.max_concurrent"),
            "a plan whose limits are leased cannot have a concurrency limit (each request must reach the store for its slot)",
        );
    }
    for ((path, lease), (policy, shadow)) in leases.iter().zip(policies.iter().zip(shadows)) {
        match lease {
            None => problems.push(
                format!("{path}.lease"),
                "every limit of a plan that leases must lease (one local lease decides them all)",
            ),
            Some(0) => problems.push(format!("{path}.lease"), "must be at least 1"),
            Some(n) if *n > policy.limit => problems.push(
                format!("{path}.lease"),
                format!("cannot exceed the limit ({})", policy.limit),
            ),
            Some(_) => {}
        }
        if !matches!(
            policy.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow
        ) {
            problems.push(
                format!("{path}.lease"),
                format!(
                    "only fixed_window and sliding_window limits can be leased (a lease lives until its window ends), not {}",
                    policy.algorithm
                ),
            );
        }
        if *shadow {
            problems.push(
                format!("{path}.lease"),
                "a shadow (dry-run) limit cannot be leased",
            );
        }
    }
    leases
        .iter()
        .filter_map(|(_, l)| *l)
        .min()
        .filter(|n| *n > 0)
}

/// Shortest plaintext key accepted: anything shorter can be guessed.
pub const MIN_PLAINTEXT_KEY_LEN: usize = 16;

fn clients_config(
    clients: Vec<ClientFile>,
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) -> Vec<ClientConfig> {
    let mut out: Vec<ClientConfig> = Vec::with_capacity(clients.len());
    for (i, client) in clients.into_iter().enumerate() {
        let ClientFile { id, plan, api_keys } = client;
        let base = format!("clients[{i}]");
        check_name(&format!("{base}.id"), &id, problems);
        if let Some(j) = out.iter().position(|c| c.id == id) {
            problems.push(
                format!("{base}.id"),
                format!("{id:?} is already the id of clients[{j}]"),
            );
        }
        if !plans.contains_key(&plan) {
            let known: Vec<&str> = plans.keys().map(String::as_str).collect();
            problems.push(
                format!("{base}.plan"),
                format!(
                    "unknown plan {plan:?}: define [plans.{plan}] or use one of [{}]",
                    known.join(", ")
                ),
            );
        }
        if api_keys.is_empty() {
            problems.push(
                format!("{base}.api_keys"),
                "a client needs at least one key",
            );
        }
        let mut digests = Vec::with_capacity(api_keys.len());
        for (k, key) in api_keys.iter().enumerate() {
            let path = format!("{base}.api_keys[{k}]");
            // Never echo a key (or what looks like one) in an error message.
            let digest = if let Some(hex) = key.strip_prefix("sha256:") {
                KeyDigest::from_hex(hex).or_else(|| {
                    problems.push(
                        path.clone(),
                        "expected \"sha256:\" followed by 64 hex digits",
                    );
                    None
                })
            } else if key.len() < MIN_PLAINTEXT_KEY_LEN
                || key.len() > crate::chain::auth::MAX_KEY_LEN
                || !key.bytes().all(|b| (0x21..=0x7e).contains(&b))
            {
                problems.push(
                    path.clone(),
                    format!(
                        "a plaintext key must be {MIN_PLAINTEXT_KEY_LEN} to {} visible ASCII characters (or write \"sha256:<hex>\")",
                        crate::chain::auth::MAX_KEY_LEN
                    ),
                );
                None
            } else {
                Some(KeyDigest::of(key.as_bytes()))
            };
            let Some(digest) = digest else { continue };
            let owner = out
                .iter()
                .position(|c| c.api_keys.contains(&digest))
                .map(|j| format!("clients[{j}] ({:?})", out[j].id))
                .or_else(|| digests.contains(&digest).then(|| "this client".to_owned()));
            match owner {
                Some(owner) => {
                    problems.push(path, format!("the same key is already given to {owner}"))
                }
                None => digests.push(digest),
            }
        }
        out.push(ClientConfig {
            id,
            plan,
            api_keys: digests,
        });
    }
    out
}

/// A route's cost must fit every plan limit at least once, or its requests could never pass.
fn check_costs(
    routes: &[RouteConfig],
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) {
    for (i, route) in routes.iter().enumerate() {
        if route.auth != Auth::ApiKey {
            continue;
        }
        for plan in plans.values() {
            for policy in &plan.limits {
                if route.cost > policy.capacity() {
                    problems.push(
                        format!("routes[{i}].cost"),
                        format!(
                            "{} is more than limit {:?} of plan {:?} admits at once ({}): such requests could never pass",
                            route.cost,
                            policy.name,
                            plan.name,
                            policy.capacity()
                        ),
                    );
                }
            }
        }
    }
}

/// Names appear in metric labels, logs and store keys: keep them boring.
fn check_name(path: &str, name: &str, problems: &mut Problems) {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !ok {
        problems.push(
            path,
            format!(
                "invalid name {name:?}: expected 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ - ."
            ),
        );
    }
}

fn positive(
    path: String,
    value: Option<HumanDuration>,
    default: Duration,
    p: &mut Problems,
) -> Duration {
    match value {
        Some(HumanDuration(d)) if d.is_zero() => {
            p.push(path, "must be greater than zero");
            default
        }
        Some(HumanDuration(d)) => d,
        None => default,
    }
}

fn upstream_config(name: &str, file: UpstreamFile, problems: &mut Problems) -> UpstreamConfig {
    let UpstreamFile {
        servers,
        health_check,
        keepalive_timeout,
    } = file;
    let base = format!("upstreams.{name}");
    check_name(&base, name, problems);
    if servers.is_empty() {
        problems.push(format!("{base}.servers"), "at least one server is required");
    }
    let mut seen: Vec<&str> = Vec::with_capacity(servers.len());
    for (i, server) in servers.iter().enumerate() {
        if let Err(msg) = check_server(server) {
            problems.push(format!("{base}.servers[{i}]"), msg);
        } else if seen.contains(&server.as_str()) {
            problems.push(
                format!("{base}.servers[{i}]"),
                format!("{server:?} is listed twice"),
            );
        }
        seen.push(server);
    }
    let health_check = health_check.map(|hc| health_check_config(&base, hc, problems));
    UpstreamConfig {
        name: name.to_owned(),
        servers,
        health_check,
        keepalive_timeout: positive(
            format!("{base}.keepalive_timeout"),
            keepalive_timeout,
            defaults::KEEPALIVE_TIMEOUT,
            problems,
        ),
    }
}

/// `ip:port`, `[v6]:port` or `host:port` (the host is resolved later, when pools are built).
fn check_server(server: &str) -> Result<(), String> {
    if server.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let expected = "expected host:port like \"127.0.0.1:9001\" or \"orders:9001\"";
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| format!("{server:?} has no port: {expected}"))?;
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    match port.parse::<u16>() {
        Ok(p) if p > 0 && host_ok => Ok(()),
        _ => Err(format!("{server:?} is not host:port: {expected}")),
    }
}

fn health_check_config(
    base: &str,
    file: HealthCheckFile,
    problems: &mut Problems,
) -> HealthCheckConfig {
    let HealthCheckFile {
        path,
        interval,
        timeout,
        host,
        unhealthy_threshold,
        healthy_threshold,
    } = file;
    let base = format!("{base}.health_check");
    if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        problems.push(
            format!("{base}.path"),
            format!("{path:?}: expected a path starting with '/' and without spaces"),
        );
    }
    let host = host.unwrap_or_else(|| defaults::HEALTH_HOST.to_owned());
    if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'/') {
        problems.push(
            format!("{base}.host"),
            format!("{host:?} is not a host name"),
        );
    }
    let mut threshold = |field: &str, value: Option<usize>, default: usize| match value {
        Some(0) => {
            problems.push(format!("{base}.{field}"), "must be at least 1");
            default
        }
        Some(n) => n,
        None => default,
    };
    let unhealthy_threshold = threshold(
        "unhealthy_threshold",
        unhealthy_threshold,
        defaults::UNHEALTHY_THRESHOLD,
    );
    let healthy_threshold = threshold(
        "healthy_threshold",
        healthy_threshold,
        defaults::HEALTHY_THRESHOLD,
    );
    HealthCheckConfig {
        path,
        host,
        interval: positive(
            format!("{base}.interval"),
            interval,
            defaults::HEALTH_INTERVAL,
            problems,
        ),
        timeout: positive(
            format!("{base}.timeout"),
            timeout,
            defaults::HEALTH_TIMEOUT,
            problems,
        ),
        unhealthy_threshold,
        healthy_threshold,
    }
}

fn route_config(
    index: usize,
    file: RouteFile,
    upstreams: &BTreeMap<String, UpstreamConfig>,
    server: &ServerConfig,
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
    } = file;
    let base = format!("routes[{index}]");
    match max_concurrent {
        Some(0) => problems.push(format!("{base}.max_concurrent"), "must be at least 1"),
        Some(_) if auth != Some(AuthFile::ApiKey) => problems.push(
            format!("{base}.max_concurrent"),
            "a concurrency limit is per client: it needs auth = \"api_key\"",
        ),
        _ => {}
    }
    let ip_limit = match ip_limit {
        None => IpLimitChoice::ServerDefault,
        Some(IpLimitSetting::Off) => IpLimitChoice::Off,
        Some(IpLimitSetting::Limit(l)) => {
            IpLimitChoice::Own(ip_limit_config(&format!("{base}.ip_limit"), l, problems))
        }
    };
    let auth = match auth {
        None | Some(AuthFile::None) => Auth::None,
        Some(AuthFile::ApiKey) => Auth::ApiKey,
    };
    let cost = match cost {
        Some(0) => {
            problems.push(format!("{base}.cost"), "must be at least 1");
            1
        }
        Some(c) => c,
        None => 1,
    };
    if cost > 1 && auth != Auth::ApiKey {
        problems.push(
            format!("{base}.cost"),
            "cost applies to plan limits, which need auth = \"api_key\"",
        );
    }
    let rate_limit_headers = match rate_limit_headers {
        None | Some(HeadersModeFile::On) => HeadersMode::On,
        Some(HeadersModeFile::Off) => HeadersMode::Off,
        Some(HeadersModeFile::NearLimit) => HeadersMode::NearLimit,
    };
    check_name(&format!("{base}.name"), &name, problems);
    if let Err(msg) = crate::chain::router::check_path_prefix(&path_prefix) {
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
    if !upstreams.contains_key(&upstream) {
        let known: Vec<&str> = upstreams.keys().map(String::as_str).collect();
        problems.push(
            format!("{base}.upstream"),
            format!(
                "unknown upstream {upstream:?}: define [upstreams.{upstream}] or use one of [{}]",
                known.join(", ")
            ),
        );
    }
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
        ip_limit,
        auth,
        cost,
        rate_limit_headers,
        legacy_rate_limit_headers: legacy_rate_limit_headers.unwrap_or(false),
        forward_api_key: forward_api_key.unwrap_or(false),
        on_store_error: on_store_error.map_or(server.on_store_error, failure_mode),
        max_body_bytes: max_body_bytes.unwrap_or(server.limits.max_body_bytes),
        shadow: shadow.unwrap_or(false),
        max_concurrent: max_concurrent.filter(|n| *n > 0),
    }
}

/// Route names must be unique, and two routes must not claim the same host, prefix and method
/// (the second could never match).
fn check_route_overlaps(routes: &[RouteConfig], problems: &mut Problems) {
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
