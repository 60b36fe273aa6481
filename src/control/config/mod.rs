//! Configuration: one TOML file, read into the serde mirror ([`file`]), then converted and
//! validated into the typed [`Config`] ([`validate`]). Nothing downstream of this module sees
//! a string that encodes a choice; every error names the TOML path it is about.

pub mod file;
pub mod units;
mod validate;
pub mod view;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chain::auth::KeyDigest;
use crate::chain::identity::{Grouping, TrustedProxies};
use crate::limit::store::redis::RedisConfig;
use crate::limit::store::FailureSettings;
use crate::limit::{Algorithm, Policy};
use units::Rate;

pub use validate::MAX_NAME_LEN;

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub access_log: AccessLogConfig,
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    pub routes: Vec<RouteConfig>,
    pub store: StoreConfig,
    pub plans: BTreeMap<String, PlanConfig>,
    pub clients: Vec<ClientConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub threads: usize,
    pub pid_file: String,
    pub upgrade_sock: String,
    pub grace_period: Duration,
    pub graceful_shutdown_timeout: Duration,
    pub upstream_keepalive_pool_size: usize,
    /// Whether a change of the file on disk reloads it (takes effect at once on reload).
    pub watch_config: bool,
    pub trusted_proxies: TrustedProxies,
    pub grouping: Grouping,
    /// Per-IP limit of routes that do not choose their own.
    pub ip_limit: Option<IpLimitConfig>,
    /// Most addresses one per-IP table tracks.
    pub max_tracked_ips: usize,
    /// Failure mode of routes that do not choose their own.
    pub on_store_error: FailureMode,
    pub limits: RequestLimits,
}

/// What a request may cost the gateway before it is refused or cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Total time to receive a request's headers (slowloris); the connection is closed.
    pub header_timeout: Duration,
    /// Longest pause while receiving a request body; the connection is closed.
    pub body_timeout: Duration,
    /// Idle keep-alive connections are closed after this (whole seconds).
    pub keepalive_timeout: Duration,
    /// Request line plus headers, in bytes → 431.
    pub max_header_bytes: usize,
    /// Number of header fields → 431.
    pub max_header_count: usize,
    /// Request target length → 414.
    pub max_uri_length: usize,
    /// Request body size (routes may lower or raise it) → 413.
    pub max_body_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogConfig {
    pub mode: crate::ops::access_log::Mode,
    pub target: crate::ops::access_log::Target,
}

#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token every admin request must carry, if set. Never printed.
    pub token: Option<String>,
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `ip_limit = { rate, burst }`: a token bucket per client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpLimitConfig {
    pub rate: Rate,
    pub burst: u64,
}

/// Name of the per-IP policy in `RateLimit` headers and 429 bodies (reserved for plans).
pub const IP_POLICY_NAME: &str = "ip";

impl IpLimitConfig {
    pub fn policy(&self) -> Policy {
        Policy::new(
            IP_POLICY_NAME,
            Algorithm::TokenBucket,
            self.rate.amount,
            self.rate.period.as_millis() as u64,
            self.burst,
        )
    }
}

/// A route's per-IP limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpLimitChoice {
    /// `server.ip_limit`, if any (one table shared by every route using it).
    ServerDefault,
    Off,
    /// The route's own limit and table.
    Own(IpLimitConfig),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    None,
    ApiKey,
}

/// Whether admitted responses carry the quota headers (rejections always do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersMode {
    On,
    Off,
    /// Only when some policy has at most a tenth of its quota left.
    NearLimit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Memory,
    Redis(RedisConfig, FailureSettings),
}

/// What a route does when the store cannot decide (down, slow, refusing, breaker open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Admit the request without a decision (counted and logged).
    FailOpen,
    /// Answer 503 limiter-unavailable (not 429: the client did nothing wrong).
    FailClosed,
    /// Decide in process with the limits divided by the number of live instances.
    Local,
}

impl FailureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::FailOpen => "fail_open",
            FailureMode::FailClosed => "fail_closed",
            FailureMode::Local => "local",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    pub name: String,
    pub limits: Vec<Policy>,
    /// `shadow[i]`: `limits[i]` is a dry run.
    pub shadow: Vec<bool>,
    pub max_concurrent: Option<u64>,
    /// Quota leasing: the smallest `lease` of the plan's limits (all of them lease, or none).
    pub lease: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    pub id: String,
    pub plan: String,
    pub api_keys: Vec<KeyDigest>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// `ip:port` or `host:port`; names are resolved when a snapshot is built (at start and
    /// at every reload), not by `turnstile check`.
    pub servers: Vec<String>,
    pub health_check: Option<HealthCheckConfig>,
    pub keepalive_timeout: Duration,
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

#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    /// Always starts with `/`. Matches the path itself and anything below it
    /// (`/orders` matches `/orders`, `/orders/7`, not `/ordersx`).
    pub path_prefix: String,
    /// Lower-case host name without port; `None` matches any host.
    pub host: Option<String>,
    /// `None` allows every method.
    pub methods: Option<Vec<http::Method>>,
    pub upstream: String,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub ip_limit: IpLimitChoice,
    pub auth: Auth,
    /// Units one request costs against the client's plan limits.
    pub cost: u64,
    pub rate_limit_headers: HeadersMode,
    pub legacy_rate_limit_headers: bool,
    pub forward_api_key: bool,
    pub on_store_error: FailureMode,
    pub max_body_bytes: u64,
    /// Every limit on this route is a dry run.
    pub shadow: bool,
    /// Per client, on this route.
    pub max_concurrent: Option<u64>,
}

/// Policy names used by concurrency limits (reserved for plans' rate limits).
pub const CONCURRENCY_POLICY_NAME: &str = "concurrency";
pub const ROUTE_CONCURRENCY_POLICY_NAME: &str = "route-concurrency";

/// Defaults, in one place so the docs (`conf/gateway.toml`) and the code agree.
pub mod defaults {
    use std::time::Duration;
    pub const LISTEN: &str = "0.0.0.0:8080";
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
    pub const CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
    pub const MAX_HEADER_BYTES: usize = 32 * 1024;
    pub const MAX_HEADER_COUNT: usize = 100;
    pub const MAX_URI_LENGTH: usize = 8 * 1024;
    pub const MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;
    pub const PID_FILE: &str = "/tmp/turnstile.pid";
    pub const UPGRADE_SOCK: &str = "/tmp/turnstile_upgrade.sock";
    pub const GRACE_PERIOD: Duration = Duration::from_secs(10);
    pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
    pub const UPSTREAM_KEEPALIVE_POOL_SIZE: usize = 128;
    pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
    pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
    pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
    pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
    pub const HEALTH_HOST: &str = "localhost";
    pub const MAX_TRACKED_IPS: usize = 100_000;
    pub const STORE_PREFIX: &str = "turnstile";
    pub const STORE_TIMEOUT: Duration = Duration::from_millis(20);
    pub const ON_STORE_ERROR: super::FailureMode = super::FailureMode::FailOpen;
    pub const BREAKER_FAILURES: u32 = 5;
    pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
    pub const EXPECTED_INSTANCES: u64 = 1;
    pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
    pub const CONCURRENCY_LEASE: Duration = Duration::from_secs(60);
    pub const UNHEALTHY_THRESHOLD: usize = 2;
    pub const HEALTHY_THRESHOLD: usize = 1;
    pub fn threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// One problem found in a configuration, located by its TOML path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted TOML path, e.g. `routes[1].upstream`; `.` for the document itself.
    pub path: String,
    pub message: String,
    /// 1-based line and column when the problem could be located in the text.
    pub location: Option<(usize, usize)>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)?;
        if let Some((line, column)) = self.location {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", display_problems(.0))]
    Invalid(Vec<Problem>),
}

fn display_problems(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    lines.join("\n")
}

impl ConfigError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            ConfigError::Read { .. } => &[],
        }
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text)
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let file = parse_file(text).map_err(|p| ConfigError::Invalid(vec![p]))?;
        Config::try_from(file).map_err(ConfigError::Invalid)
    }
}

/// TOML text → serde mirror, with the failing path and position on error.
fn parse_file(text: &str) -> Result<file::FileConfig, Problem> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| toml_problem(text, ".", &e))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        toml_problem(text, &path, e.inner())
    })
}

fn toml_problem(text: &str, path: &str, e: &toml::de::Error) -> Problem {
    Problem {
        path: path.to_owned(),
        message: e.message().trim().to_owned(),
        location: e.span().map(|span| line_column(text, span.start)),
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_is_one_based() {
        assert_eq!(line_column("a\nbc\n", 0), (1, 1));
        assert_eq!(line_column("a\nbc\n", 3), (2, 2));
    }

    #[test]
    fn syntax_errors_have_a_location() {
        let err = Config::parse("[server\nlisten = 1").unwrap_err();
        let p = &err.problems()[0];
        assert_eq!(p.path, ".");
        assert!(p.location.is_some(), "{p}");
    }

    #[test]
    fn type_errors_name_the_path() {
        let err = Config::parse("[server]\nthreads = \"two\"\n").unwrap_err();
        assert_eq!(err.problems()[0].path, "server.threads", "{err}");
    }
}
