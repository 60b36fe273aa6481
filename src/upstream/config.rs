//! What a pool is made of, as the configuration says (`[upstreams.NAME]`, validated by
//! `control::config`).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// `ip:port` or `host:port`; names are resolved when a snapshot is built (at start and
    /// at every reload), not by `turnstile check`.
    pub servers: Vec<String>,
    pub health_check: Option<HealthCheckConfig>,
    pub keepalive_timeout: Duration,
    /// Load shedding; `None`: off (every request goes through).
    pub shedding: Option<crate::upstream::shed::GateSettings>,
    /// TLS to the servers; `None`: plaintext.
    pub tls: Option<UpstreamTls>,
    /// HTTP/2 to the servers.
    pub http2: bool,
    /// How often host names are resolved again; zero: only when the pool is built.
    pub resolve_interval: Duration,
    /// How requests are spread over the servers.
    pub balance: crate::upstream::balance::Balance,
    /// Passive outlier ejection; `None`: off.
    pub outlier_detection: Option<crate::upstream::outlier::OutlierSettings>,
    /// How many retries the pool takes at once.
    pub retry_budget: crate::upstream::retry::BudgetSettings,
    /// How the names of the request head reach its servers.
    pub header_case: HeaderCase,
}

/// How header names reach a pool's servers over HTTP/1 (HTTP/2 names are lower-case always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderCase {
    /// Lower-case (the default, as Envoy's): the head is edited as `http` parts, the gateway's
    /// own headers inserted without parsing their names.
    #[default]
    Lower,
    /// Each name as the client spelled it (the gateway's own lower-case): for a legacy server
    /// that reads names case-sensitively. Costs a little more per request (every insert also
    /// records its spelling).
    Preserve,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// SNI and verified name; `None`: each server's host.
    pub sni: Option<String>,
    pub verify: bool,
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate and key files (mTLS).
    pub client_cert: Option<(std::path::PathBuf, crate::secret::Secret)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthCheckConfig {
    pub path: String,
    pub host: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_threshold: usize,
    pub healthy_threshold: usize,
}
