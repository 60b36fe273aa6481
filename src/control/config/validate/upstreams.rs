//! `[upstreams.NAME]`: servers, keep-alive, health checks.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::{
    BalanceFile, FailureFile, HeaderCaseFile, HealthCheckFile, OutlierFile, UpstreamFile,
};
use crate::control::config::model::{HealthCheckConfig, UpstreamConfig, UpstreamTls};
use crate::control::config::units::{HumanDuration, SecretSource};
use crate::upstream::balance::{server_entry, Balance};
use crate::upstream::config::HeaderCase;
use crate::upstream::outlier::{Failures, OutlierSettings};
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
        tls,
        tls_sni,
        tls_ca_file,
        tls_insecure_skip_verify,
        tls_client_cert,
        tls_client_key,
        http2,
        resolve_interval,
        balance,
        outlier_detection,
        retry_budget,
        header_case,
    } = file;
    let base = format!("upstreams.{name}");
    check_name(&base, name, problems);
    if servers.is_empty() {
        problems.push(format!("{base}.servers"), "at least one server is required");
    }
    let mut seen: Vec<&str> = Vec::with_capacity(servers.len());
    for (i, text) in servers.iter().enumerate() {
        let server = match server_entry(text) {
            Ok(entry) => entry.address,
            Err(msg) => {
                problems.push(format!("{base}.servers[{i}]"), msg);
                continue;
            }
        };
        if let Err(msg) = check_server(server) {
            problems.push(format!("{base}.servers[{i}]"), msg);
        } else if seen.contains(&server) {
            problems.push(
                format!("{base}.servers[{i}]"),
                format!("{server:?} is listed twice"),
            );
        }
        seen.push(server);
    }
    let health_check = health_check.map(|hc| health_check_config(&base, hc, problems));
    let shedding = super::shedding::shedding_config(&base, shedding, problems);
    let tls = upstream_tls(
        &base,
        tls.unwrap_or(false),
        UpstreamTlsFile {
            sni: tls_sni,
            ca_file: tls_ca_file,
            insecure_skip_verify: tls_insecure_skip_verify,
            client_cert: tls_client_cert,
            client_key: tls_client_key,
        },
        problems,
    );
    let resolve_interval = match resolve_interval {
        Some(HumanDuration(d)) => d,
        None => defaults::RESOLVE_INTERVAL,
    };
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
        tls,
        http2: http2.unwrap_or(false),
        resolve_interval,
        balance: match balance {
            None | Some(BalanceFile::RoundRobin) => Balance::RoundRobin,
            Some(BalanceFile::LeastRequest) => Balance::LeastRequest,
        },
        outlier_detection: outlier_detection.map(|o| outlier_config(&base, o, problems)),
        retry_budget: super::retry::budget(&base, retry_budget, problems),
        header_case: header_case_of(header_case),
    }
}

struct UpstreamTlsFile {
    sni: Option<String>,
    ca_file: Option<String>,
    insecure_skip_verify: Option<bool>,
    client_cert: Option<String>,
    client_key: Option<SecretSource>,
}

/// `tls = true` and its `tls_*` settings (which need it).
fn upstream_tls(
    base: &str,
    on: bool,
    file: UpstreamTlsFile,
    problems: &mut Problems,
) -> Option<UpstreamTls> {
    let UpstreamTlsFile {
        sni,
        ca_file,
        insecure_skip_verify,
        client_cert,
        client_key,
    } = file;
    if !on {
        let given = sni.is_some()
            || ca_file.is_some()
            || insecure_skip_verify.is_some()
            || client_cert.is_some()
            || client_key.is_some();
        if given {
            problems.push(format!("{base}.tls"), "tls_* settings need tls = true");
        }
        return None;
    }
    if let Some(ca) = &ca_file {
        problems.files.push(ca.into());
        if let Err(e) = std::fs::metadata(ca) {
            problems.push(
                format!("{base}.tls_ca_file"),
                format!("cannot read {ca}: {}", e.kind()),
            );
        }
    }
    let key = client_key.and_then(|k| secret(&format!("{base}.tls_client_key"), &k, problems));
    let client_cert = match (client_cert, key) {
        (Some(cert), Some(key)) => {
            problems.files.push(cert.clone().into());
            problems.files.push(key.expose().into());
            Some((cert.into(), key))
        }
        (None, None) => None,
        _ => {
            problems.push(
                format!("{base}.tls_client_cert"),
                "a client certificate needs both tls_client_cert and tls_client_key",
            );
            None
        }
    };
    Some(UpstreamTls {
        sni,
        verify: !insecure_skip_verify.unwrap_or(false),
        ca_file: ca_file.map(Into::into),
        client_cert,
    })
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

fn outlier_config(base: &str, file: OutlierFile, problems: &mut Problems) -> OutlierSettings {
    let base = format!("{base}.outlier_detection");
    let OutlierFile {
        consecutive_failures,
        base_ejection_time,
        max_ejection_time,
        max_ejected_percent,
        on,
    } = file;
    let consecutive_failures = at_least_one(
        format!("{base}.consecutive_failures"),
        consecutive_failures,
        defaults::OUTLIER_FAILURES,
        problems,
    );
    let base_ejection_time = positive(
        format!("{base}.base_ejection_time"),
        base_ejection_time,
        defaults::OUTLIER_BASE_EJECTION,
        problems,
    );
    let max_ejection_time = positive(
        format!("{base}.max_ejection_time"),
        max_ejection_time,
        defaults::OUTLIER_MAX_EJECTION.max(base_ejection_time),
        problems,
    );
    if max_ejection_time < base_ejection_time {
        problems.push(
            format!("{base}.max_ejection_time"),
            "must be at least base_ejection_time",
        );
    }
    let max_ejected_percent = match max_ejected_percent {
        Some(p) if !(1..=100).contains(&p) => {
            problems.push(format!("{base}.max_ejected_percent"), "expected 1 to 100");
            defaults::OUTLIER_MAX_PERCENT
        }
        Some(p) => p,
        None => defaults::OUTLIER_MAX_PERCENT,
    };
    let on = match on {
        None => Failures::ALL,
        Some(list) if list.is_empty() => {
            problems.push(
                format!("{base}.on"),
                "name at least one of \"5xx\", \"connect\", \"timeout\", \"reset\"",
            );
            Failures::ALL
        }
        Some(list) => Failures {
            status_5xx: list.contains(&FailureFile::Status5xx),
            connect: list.contains(&FailureFile::Connect),
            timeout: list.contains(&FailureFile::Timeout),
            reset: list.contains(&FailureFile::Reset),
        },
    };
    OutlierSettings {
        consecutive_failures,
        base_ejection_time,
        max_ejection_time,
        max_ejected_percent,
        on,
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
    let mut threshold = |field: &str, value: Option<usize>, default: usize| {
        at_least_one(format!("{base}.{field}"), value, default, problems)
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

/// `header_case` (a pool's) or `response_header_case` (the server's): lower-case by default.
pub(super) fn header_case_of(file: Option<HeaderCaseFile>) -> HeaderCase {
    match file {
        None | Some(HeaderCaseFile::Lower) => HeaderCase::Lower,
        Some(HeaderCaseFile::Preserve) => HeaderCase::Preserve,
    }
}
