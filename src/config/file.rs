//! The serde mirror of the TOML file: field names and nesting exactly as users write them.
//! Every table denies unknown fields, so a typo is an error, not a silently ignored setting.
//! Conversion to the typed [`super::Config`] (and every cross-reference check) lives in
//! `super::validate`.

use super::units::HumanDuration;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamFile>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    /// Address the proxy listens on, `host:port`.
    pub listen: Option<String>,
    /// Worker threads of the proxy service.
    pub threads: Option<usize>,
    /// Pingora's pid file (used with `--daemon`) and graceful-upgrade socket.
    pub pid_file: Option<String>,
    pub upgrade_sock: Option<String>,
    /// How long a graceful shutdown/upgrade keeps serving before and while draining.
    pub grace_period: Option<HumanDuration>,
    pub graceful_shutdown_timeout: Option<HumanDuration>,
    /// Idle keep-alive connections kept to upstreams (all pools together).
    pub upstream_keepalive_pool_size: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub servers: Vec<String>,
    pub health_check: Option<HealthCheckFile>,
    /// How long an idle keep-alive connection to a server of this pool is kept.
    pub keepalive_timeout: Option<HumanDuration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    pub path: String,
    pub interval: Option<HumanDuration>,
    pub timeout: Option<HumanDuration>,
    /// `Host` header sent with the check (default: `localhost`).
    pub host: Option<String>,
    /// Consecutive failures before a healthy server is taken out.
    pub unhealthy_threshold: Option<usize>,
    /// Consecutive successes before an unhealthy server is put back.
    pub healthy_threshold: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: String,
    pub path_prefix: String,
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
    pub upstream: String,
    pub connect_timeout: Option<HumanDuration>,
    pub read_timeout: Option<HumanDuration>,
    pub write_timeout: Option<HumanDuration>,
}
