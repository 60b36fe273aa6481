//! `[server]`: listen address, threads, trusted proxies, address grouping, the default per-IP limit, request limits.

use super::checks::*;
use super::store::*;
use crate::chain::identity::{Grouping, TrustedProxies};
use crate::chain::message::RequestLimits;
use crate::control::config::defaults;
use crate::control::config::file::{IpLimitFile, ServerFile};
use crate::control::config::model::{IpLimitConfig, ServerConfig};
use crate::limit::algorithm::MAX_PRODUCT;
use std::net::SocketAddr;
use std::time::Duration;

const MAX_THREADS: usize = 1024;
/// Shortest key hash secret accepted.
pub const MIN_KEY_HASH_SECRET_LEN: usize = 16;

pub(super) fn server_config(file: ServerFile, problems: &mut Problems) -> ServerConfig {
    let ServerFile {
        listen,
        threads,
        pid_file,
        upgrade_sock,
        grace_period,
        graceful_shutdown_timeout,
        upstream_keepalive_pool_size,
        work_stealing,
        key_hash_secret,
        watch_config,
        log_format,
        h2c,
        clients_file: _,
        dns_servers,
        tls,
        trusted_proxies,
        allow_ips,
        deny_ips,
        https_redirect,
        cors,
        ipv4_prefix,
        ipv6_prefix,
        ip_limit,
        max_tracked_ips,
        max_tracked_keys,
        max_cached_tokens,
        quota_path,
        quota_limit,
        token_failure_limit,
        max_delayed,
        max_delayed_per_client,
        on_store_error,
        header_timeout,
        body_timeout,
        send_timeout,
        keepalive_timeout,
        max_header_bytes,
        max_header_count,
        max_uri_length,
        max_body_bytes,
        response_header_case,
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
        work_stealing: work_stealing.unwrap_or(true),
        watch_config: watch_config.unwrap_or(true),
        h2c: h2c.unwrap_or(false),
        dns_servers: dns_servers
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.parse::<SocketAddr>()
                    .map_err(|_| {
                        problems.push(
                            format!("server.dns_servers[{i}]"),
                            format!("{s:?}: expected ip:port like \"10.0.0.2:53\""),
                        )
                    })
                    .ok()
            })
            .collect(),
        https_redirect: https_redirect_port(https_redirect, tls.as_ref(), problems),
        cors: super::cors::cors("server.cors", cors, problems),
        tls: tls.map(|t| tls_listener_config(t, problems)),
        log_format: match log_format {
            Some(crate::control::config::file::LogFormatFile::Json) => {
                crate::ops::logging::LogFormat::Json
            }
            _ => crate::ops::logging::LogFormat::Text,
        },
        key_hash_secret: key_hash_secret
            .and_then(|s| secret("server.key_hash_secret", &s, problems))
            .filter(|secret| {
                let ok = secret.expose().len() >= MIN_KEY_HASH_SECRET_LEN;
                if !ok {
                    // The secret itself is never echoed.
                    problems.push(
                        "server.key_hash_secret",
                        format!("too short: at least {MIN_KEY_HASH_SECRET_LEN} bytes"),
                    );
                }
                ok
            }),
        trusted_proxies: trusted_proxies_config(trusted_proxies.unwrap_or_default(), problems),
        addresses: super::addresses::address_rules("server", allow_ips, deny_ips, problems),
        grouping: grouping_config(ipv4_prefix, ipv6_prefix, problems),
        ip_limit: ip_limit.map(|l| ip_limit_config("server.ip_limit", l, problems)),
        max_tracked_ips: at_least_one(
            "server.max_tracked_ips",
            max_tracked_ips,
            defaults::MAX_TRACKED_IPS,
            problems,
        ),
        max_tracked_keys: at_least_one(
            "server.max_tracked_keys",
            max_tracked_keys,
            defaults::MAX_TRACKED_KEYS,
            problems,
        ),
        max_cached_tokens: max_cached_tokens.unwrap_or(defaults::MAX_CACHED_TOKENS),
        quota_limit: on_by_default("server.quota_limit", quota_limit, (1, 10), problems),
        token_failure_limit: on_by_default(
            "server.token_failure_limit",
            token_failure_limit,
            (5, 20),
            problems,
        ),
        max_delayed: max_delayed.unwrap_or(10_000),
        max_delayed_per_client: at_least_one(
            "server.max_delayed_per_client",
            max_delayed_per_client,
            crate::chain::admission::default_share(max_delayed.unwrap_or(10_000)),
            problems,
        ),
        quota_path: quota_path.filter(|p| {
            let ok = crate::chain::path::check_path_prefix(p).is_ok() && p.len() > 1;
            if !ok {
                problems.push(
                    "server.quota_path",
                    format!("{p:?}: expected a path in normal form, like \"/_turnstile/quota\""),
                );
            }
            ok
        }),
        on_store_error: on_store_error.map_or(defaults::ON_STORE_ERROR, failure_mode),
        response_header_case: super::upstreams::header_case_of(response_header_case),
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
            send_timeout: positive(
                "server.send_timeout".into(),
                send_timeout,
                defaults::SEND_TIMEOUT,
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
                max_header_bytes.map(|b| usize::try_from(b.0).unwrap_or(usize::MAX)),
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
                max_uri_length.map(|b| usize::try_from(b.0).unwrap_or(usize::MAX)),
                defaults::MAX_URI_LENGTH,
                16,
                MAX_HEADER_BYTES_CAP,
                problems,
            ),
            max_body_bytes: max_body_bytes.map_or(defaults::MAX_BODY_BYTES, |b| b.0),
        },
    }
}

/// Pingora refuses headers beyond 1 MiB and 256 fields by itself; our limits stay below.
const MAX_HEADER_BYTES_CAP: usize = 1024 * 1024 - 1;
const MAX_HEADER_COUNT_CAP: usize = 256;

pub(super) fn trusted_proxies_config(list: Vec<String>, problems: &mut Problems) -> TrustedProxies {
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

pub(super) fn grouping_config(v4: Option<u8>, v6: Option<u8>, problems: &mut Problems) -> Grouping {
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

/// A bucket that is on unless `"off"`: `default` is (per second, burst).
fn on_by_default(
    path: &str,
    setting: Option<crate::control::config::file::IpLimitSetting>,
    default: (u64, u64),
    problems: &mut Problems,
) -> Option<IpLimitConfig> {
    use crate::control::config::file::IpLimitSetting;
    match setting {
        None => Some(IpLimitConfig {
            rate: crate::control::config::units::Rate {
                amount: default.0,
                period: std::time::Duration::from_secs(1),
            },
            burst: default.1,
        }),
        Some(IpLimitSetting::Off) => None,
        Some(IpLimitSetting::Limit(l)) => Some(ip_limit_config(path, l, problems)),
    }
}

pub(super) fn ip_limit_config(
    path: &str,
    file: IpLimitFile,
    problems: &mut Problems,
) -> IpLimitConfig {
    let IpLimitFile { rate, burst } = file;
    let burst = burst.unwrap_or(rate.amount);
    refuse_zero(format!("{path}.burst"), burst, problems);
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

/// `[server.tls]`: the address and the certificates' files (read, and checked to match,
/// when a snapshot is built).
fn tls_listener_config(
    file: crate::control::config::file::TlsListenerFile,
    problems: &mut Problems,
) -> crate::control::config::model::TlsListenerConfig {
    use crate::control::config::model::{CertificateConfig, TlsListenerConfig};
    let crate::control::config::file::TlsListenerFile {
        listen,
        h2,
        certificates,
        client_certificates,
        client_ca_file,
        client_identity,
        client_plan,
    } = file;
    let client_auth = client_auth_config(
        client_certificates,
        client_ca_file,
        client_identity,
        client_plan,
        problems,
    );
    let addr = listen.parse::<SocketAddr>().unwrap_or_else(|_| {
        problems.push(
            "server.tls.listen",
            format!("{listen:?} is not an address: expected ip:port like \"0.0.0.0:8443\""),
        );
        SocketAddr::from(([0, 0, 0, 0], 8443))
    });
    if certificates.is_empty() {
        problems.push(
            "server.tls.certificates",
            "at least one certificate is required",
        );
    }
    let certificates = certificates
        .into_iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let at = format!("server.tls.certificates[{i}]");
            let key = secret(&format!("{at}.key"), &c.key, problems)?;
            let names: Vec<String> = c
                .names
                .unwrap_or_default()
                .into_iter()
                .map(|n| n.to_ascii_lowercase())
                .collect();
            for (j, name) in names.iter().enumerate() {
                let bare = name.strip_prefix("*.").unwrap_or(name);
                let ok = !bare.is_empty()
                    && bare.len() <= 253
                    && bare.split('.').all(|label| {
                        !label.is_empty()
                            && label.len() <= 63
                            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    });
                if !ok {
                    problems.push(
                        format!("{at}.names[{j}]"),
                        format!("{name:?} is not a host name (\"api.example.com\" or \"*.example.com\")"),
                    );
                }
            }
            problems.files.push(c.cert.clone().into());
            problems.files.push(key.expose().into());
            Some(CertificateConfig {
                cert: c.cert.into(),
                key,
                names,
            })
        })
        .collect();
    TlsListenerConfig {
        listen: addr,
        h2: h2.unwrap_or(true),
        certificates,
        client_auth,
    }
}

/// `[server.tls]`'s client certificates: asked for (`client_certificates`) against a CA.
fn client_auth_config(
    mode: Option<crate::control::config::file::ClientCertModeFile>,
    ca_file: Option<String>,
    identity: Option<crate::control::config::file::ClientIdentityFile>,
    plan: Option<String>,
    problems: &mut Problems,
) -> Option<crate::control::config::model::ClientAuthConfig> {
    use crate::chain::cert::ClientIdentity;
    use crate::control::config::file::{ClientCertModeFile, ClientIdentityFile};
    let Some(mode) = mode else {
        for (key, given) in [
            ("client_ca_file", ca_file.is_some()),
            ("client_identity", identity.is_some()),
            ("client_plan", plan.is_some()),
        ] {
            if given {
                problems.push(
                    format!("server.tls.{key}"),
                    "only with client_certificates = \"optional\" or \"required\"",
                );
            }
        }
        return None;
    };
    let Some(ca_file) = ca_file else {
        problems.push(
            "server.tls.client_ca_file",
            "required with client_certificates: the CA client certificates chain to",
        );
        return None;
    };
    problems.files.push(ca_file.clone().into());
    let ca_pem = std::fs::read(&ca_file)
        .map_err(|e| {
            problems.push(
                "server.tls.client_ca_file",
                format!("cannot read {ca_file}: {}", e.kind()),
            )
        })
        .ok()?;
    Some(crate::control::config::model::ClientAuthConfig {
        required: mode == ClientCertModeFile::Required,
        ca_file: ca_file.into(),
        ca_pem,
        identity: match identity {
            None | Some(ClientIdentityFile::San) => ClientIdentity::San,
            Some(ClientIdentityFile::Subject) => ClientIdentity::Subject,
        },
        plan,
    })
}

/// `https_redirect`: the TLS listener's port plain requests are sent to (`None`: off).
fn https_redirect_port(
    on: Option<bool>,
    tls: Option<&crate::control::config::file::TlsListenerFile>,
    problems: &mut Problems,
) -> Option<u16> {
    if on != Some(true) {
        return None;
    }
    let Some(tls) = tls else {
        problems.push(
            "server.https_redirect",
            "needs a TLS listener to send requests to: add [server.tls]",
        );
        return None;
    };
    // A bad address is reported by the TLS listener's own check.
    tls.listen.parse::<SocketAddr>().ok().map(|a| a.port())
}
