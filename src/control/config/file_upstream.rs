//! The serde mirror of `[upstreams.NAME]`: servers, balancing, health checks, TLS, load
//! shedding. Checked and typed by `validate/upstreams.rs` and `validate/shedding.rs`.

use super::units::HumanDuration;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub servers: Vec<String>,
    pub health_check: Option<HealthCheckFile>,
    /// How long an idle keep-alive connection to a server of this pool is kept.
    pub keepalive_timeout: Option<HumanDuration>,
    /// Load shedding (adaptive concurrency); off unless this table is present.
    pub shedding: Option<SheddingFile>,
    /// TLS to the servers (default off).
    pub tls: Option<bool>,
    /// SNI and the name verified (default: each server's host, name or address).
    pub tls_sni: Option<String>,
    /// The CA the servers' certificates chain to (default: the system's roots).
    pub tls_ca_file: Option<String>,
    /// Turns verification off; only when asked for by this name.
    pub tls_insecure_skip_verify: Option<bool>,
    /// A client certificate for servers that ask for one (mTLS).
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<super::units::SecretSource>,
    /// HTTP/2 to the servers (ALPN over TLS, prior knowledge without): gRPC.
    pub http2: Option<bool>,
    /// How often server names are resolved again (default "30s"; "0s": only at load).
    pub resolve_interval: Option<HumanDuration>,
    /// How requests are spread over the servers (default round robin).
    pub balance: Option<BalanceFile>,
    /// Passive outlier ejection; off unless this table is present.
    pub outlier_detection: Option<OutlierFile>,
    /// How many retries the pool takes at once, relative to its requests in flight.
    pub retry_budget: Option<RetryBudgetFile>,
    /// `"lower"` (default) or `"preserve"`: how header names reach the servers over HTTP/1.
    pub header_case: Option<HeaderCaseFile>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderCaseFile {
    Lower,
    Preserve,
}

/// `retry_budget = { percent = 20, min_retries = 3 }` on an upstream.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBudgetFile {
    pub percent: Option<u8>,
    pub min_retries: Option<u32>,
}

/// `retry = { ... }` on a route: what is retried after the request was sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryFile {
    pub attempts: Option<u32>,
    /// `"timeout"`, `"reset"`, `"5xx"`, `"gateway"` (502, 503, 504) or a status (`"503"`).
    pub on: Option<Vec<String>>,
    pub per_try_timeout: Option<HumanDuration>,
    pub timeout: Option<HumanDuration>,
    pub backoff: Option<HumanDuration>,
    pub max_backoff: Option<HumanDuration>,
    pub methods: Option<Vec<String>>,
}

/// `[upstreams.NAME.outlier_detection]`: servers failing requests in a row are taken out of
/// rotation for a while.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierFile {
    pub consecutive_failures: Option<u32>,
    pub base_ejection_time: Option<HumanDuration>,
    pub max_ejection_time: Option<HumanDuration>,
    pub max_ejected_percent: Option<u8>,
    /// What counts as a failure (default all of them).
    pub on: Option<Vec<FailureFile>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum FailureFile {
    #[serde(rename = "5xx")]
    Status5xx,
    #[serde(rename = "connect")]
    Connect,
    #[serde(rename = "timeout")]
    Timeout,
    #[serde(rename = "reset")]
    Reset,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceFile {
    RoundRobin,
    LeastRequest,
}

/// `[upstreams.NAME.shedding]`: the limit on requests in flight to the pool, learned from its
/// latency, and how requests over it wait or are shed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SheddingFile {
    /// `false` turns it off while keeping the table (default `true`).
    pub enabled: Option<bool>,
    pub min_limit: Option<u32>,
    pub max_limit: Option<u32>,
    pub initial_limit: Option<u32>,
    /// Latency up to `tolerance` × the baseline counts as healthy.
    pub tolerance: Option<f64>,
    /// How often the limit is recomputed.
    pub window: Option<HumanDuration>,
    /// How long the lowest latency is remembered.
    pub baseline_interval: Option<HumanDuration>,
    pub smoothing: Option<f64>,
    /// Most requests waiting for a slot.
    pub queue: Option<usize>,
    pub queue_timeout: Option<HumanDuration>,
    /// Share of the limit only critical requests may use.
    pub reserve_critical: Option<f64>,
    /// Further share sheddable requests may not use.
    pub reserve_default: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorityFile {
    Critical,
    Default,
    Sheddable,
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
