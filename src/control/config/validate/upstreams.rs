//! `[upstreams.NAME]`: servers, keep-alive, health checks.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::{HealthCheckFile, UpstreamFile};
use crate::control::config::model::{HealthCheckConfig, UpstreamConfig};
use std::net::SocketAddr;

pub(super) fn upstream_config(
    name: &str,
    file: UpstreamFile,
    problems: &mut Problems,
) -> UpstreamConfig {
    let UpstreamFile {
        servers,
        health_check,
        keepalive_timeout,
        shedding,
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
    let shedding = super::shedding::shedding_config(&base, shedding, problems);
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
        shedding,
    }
}

/// `ip:port`, `[v6]:port` or `host:port` (the host is resolved later, when pools are built).
pub(super) fn check_server(server: &str) -> Result<(), String> {
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

pub(super) fn health_check_config(
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
