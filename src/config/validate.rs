//! Serde mirror → typed [`Config`]: defaults applied, values checked, cross-references
//! resolved. Every field of the mirror is destructured, so adding a field to `file.rs` does
//! not compile until it is handled here. All problems are collected, not just the first.

use super::file::{FileConfig, HealthCheckFile, RouteFile, ServerFile, UpstreamFile};
use super::units::HumanDuration;
use super::{
    defaults, Config, HealthCheckConfig, Problem, RouteConfig, ServerConfig, UpstreamConfig,
};
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
            upstreams,
            routes,
        } = file;
        let mut problems = Problems::default();
        let server = server_config(server, &mut problems);
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
            .map(|(i, r)| route_config(i, r, &upstreams, &mut problems))
            .collect();
        check_route_overlaps(&routes, &mut problems);
        if problems.0.is_empty() {
            Ok(Config {
                server,
                upstreams,
                routes,
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
    } = file;
    let base = format!("routes[{index}]");
    check_name(&format!("{base}.name"), &name, problems);
    if let Err(msg) = crate::router::check_path_prefix(&path_prefix) {
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
