//! The validated configuration: typed values only (durations, addresses, policies, enums);
//! nothing downstream sees a string that encodes a choice.

use super::units::Rate;
use crate::chain::auth::{Auth, KeyDigest};
use crate::chain::headers::HeadersMode;
use crate::chain::identity::{Grouping, TrustedProxies};
use crate::chain::jwt::claims::ClaimPath;
use crate::chain::message::RequestLimits;
use crate::limit::store::redis::RedisConfig;
use crate::limit::store::{FailureMode, FailureSettings};
use crate::limit::{Algorithm, Policy, IP_POLICY_NAME};
pub use crate::upstream::config::{HealthCheckConfig, UpstreamConfig, UpstreamTls};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

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
    /// Identity providers whose tokens routes accept, by name.
    pub issuers: BTreeMap<String, IssuerConfig>,
    /// Clients managed at runtime (`[registry]`), if on.
    pub registry: Option<crate::registry::state::RegistrySettings>,
    /// `server.clients_file`: where the memory store's runtime clients are written.
    pub clients_file: Option<std::path::PathBuf>,
    /// OpenTelemetry tracing; `None`: off (restart).
    pub tracing: Option<crate::ops::trace::TraceSettings>,
    /// Other files it reads (secret files, certificates, keys): watched with it, and part of
    /// its content hash.
    pub files: Vec<std::path::PathBuf>,
    /// Accepted, but worth saying (a deprecated key): shown by `turnstile check`, logged at
    /// start and on reload.
    pub warnings: Vec<super::error::Problem>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `https_redirect`: plain-HTTP requests are redirected (308) to this port of the TLS
    /// listener, after routing and the per-IP bucket (`None`: off).
    pub https_redirect: Option<u16>,
    /// `[server] cors`: every route's without its own (`None`: none).
    pub cors: Option<std::sync::Arc<crate::chain::cors::Cors>>,
    pub threads: usize,
    pub pid_file: String,
    pub upgrade_sock: String,
    pub grace_period: Duration,
    pub graceful_shutdown_timeout: Duration,
    pub upstream_keepalive_pool_size: usize,
    /// true (default): tokio's work-stealing runtime; false: each worker thread runs its own
    /// event loop and keeps the connections it accepted (Pingora's no-steal runtime). (restart)
    pub work_stealing: bool,
    /// Whether a change of the file on disk reloads it (takes effect at once on reload).
    pub watch_config: bool,
    /// Application log lines (restart).
    pub log_format: crate::ops::logging::LogFormat,
    /// HTTP/2 with prior knowledge on the plaintext listener (restart).
    pub h2c: bool,
    /// DNS servers for upstream names; empty: the system's resolver.
    pub dns_servers: Vec<SocketAddr>,
    /// The TLS listener (its address and ALPN: restart; its certificates: reload).
    pub tls: Option<TlsListenerConfig>,
    /// Secret of keyed limits' keyed hash; `None`: a built-in one (docs/configuration.md).
    pub key_hash_secret: Option<super::units::Secret>,
    pub trusted_proxies: TrustedProxies,
    /// `allow_ips` / `deny_ips` of every route, checked before routing (`None`: no rules).
    pub addresses: Option<std::sync::Arc<crate::chain::address::AddressRules>>,
    pub grouping: Grouping,
    /// Per-IP limit of routes that do not choose their own.
    pub ip_limit: Option<IpLimitConfig>,
    /// Most addresses one per-IP table tracks.
    pub max_tracked_ips: usize,
    /// Most keyed-limit keys each in-process store (memory store, local fallback) tracks.
    pub max_tracked_keys: usize,
    /// Most verified bearer tokens remembered (0: none).
    pub max_cached_tokens: usize,
    /// The quota status path on the main listener, if on.
    pub quota_path: Option<String>,
    /// Each identified client's bucket for the quota endpoint (`None`: off).
    pub quota_limit: Option<IpLimitConfig>,
    /// Bearer tokens that may fail their checks per grouped address before that address's
    /// tokens are refused unverified for a while (`None`: off).
    pub token_failure_limit: Option<IpLimitConfig>,
    /// Most requests held by leaky buckets at once on this instance.
    pub max_delayed: usize,
    /// Most of them one client holds at once (by client id, and by grouped address).
    pub max_delayed_per_client: usize,
    /// Failure mode of routes that do not choose their own.
    pub on_store_error: FailureMode,
    /// How response header names reach clients over HTTP/1 (`proxy/response_head.rs`).
    pub response_header_case: crate::upstream::config::HeaderCase,
    pub limits: RequestLimits,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogConfig {
    pub mode: crate::ops::access_log::Mode,
    pub target: crate::ops::access_log::Target,
}

#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer tokens admin requests may carry, by name (`token` is named "admin"); none: no
    /// token needed, and no writes. Never printed.
    pub tokens: Vec<(String, String)>,
    /// The names of the tokens (among `tokens`) that may only read: GET, never a change.
    pub readers: Vec<String>,
    /// Host names requests may name besides `localhost`, the machine's name and IP literals
    /// (lower case, no port).
    pub hosts: Vec<String>,
}

impl AdminConfig {
    /// The name of the token `presented` is, if any (compared in constant time).
    pub fn token_named(&self, presented: &[u8]) -> Option<&str> {
        use subtle::ConstantTimeEq;
        self.tokens
            .iter()
            .find(|(_, t)| bool::from(t.as_bytes().ct_eq(presented)))
            .map(|(name, _)| name.as_str())
    }

    /// Whether the token named `name` may change things (not a read-only token).
    pub fn may_write(&self, name: &str) -> bool {
        !self.readers.iter().any(|r| r == name)
    }
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field(
                "tokens",
                &self.tokens.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// `ip_limit = { rate, burst }`: a token bucket per client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpLimitConfig {
    pub rate: Rate,
    pub burst: u64,
}

impl IpLimitConfig {
    pub fn policy(&self) -> Policy {
        self.policy_named(IP_POLICY_NAME)
    }

    /// The same bucket under another name (`quota`: the quota endpoint's own).
    pub fn policy_named(&self, name: &str) -> Policy {
        Policy::new(
            name,
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

#[derive(Debug, Clone, PartialEq, Eq)]
// One per configuration: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum StoreConfig {
    Memory,
    Redis(RedisConfig, FailureSettings),
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
    /// Load-shedding class of the plan's requests, over the route's.
    pub priority: Option<crate::upstream::shed::Priority>,
    /// Route limits (by name) and "ip" the plan's clients skip.
    pub exempt_from: Vec<String>,
    /// Limits charged from the response.
    pub response_costs: Vec<crate::chain::cost::ResponseCost>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    pub id: String,
    pub plan: String,
    pub api_keys: Vec<KeyDigest>,
    pub metadata: BTreeMap<String, String>,
    /// Groups the client is in.
    pub groups: Vec<String>,
    /// From `server.clients_file` (which the admin API may rewrite), not the main file.
    pub in_clients_file: bool,
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
    /// `None`: the route answers itself (`answer`).
    pub upstream: Option<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    /// An upgraded connection (WebSocket) ends when either direction is silent this long;
    /// it replaces `read_timeout` and `body_timeout` for upgrade requests.
    pub upgrade_idle_timeout: Duration,
    /// Which protocol upgrades reach the upstream.
    pub upgrades: crate::chain::message::Upgrades,
    /// The path the upstream gets: without `path_prefix` (`strip_prefix`), with `add_prefix`
    /// in front (`chain::rewrite`).
    pub strip_prefix: bool,
    pub add_prefix: Option<String>,
    /// The upstream gets an RFC 7239 `Forwarded` element of this hop.
    pub forwarded: bool,
    /// Retries after the request was sent; `None`: none.
    pub retry: Option<crate::upstream::retry::RetryPolicy>,
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
    /// The route's own limits, each counted per key.
    pub limits: Vec<RouteLimitConfig>,
    /// Largest request body read for `body:` key parts (bodies over it lack the fields).
    pub body_key_bytes: u64,
    /// Load-shedding class of the route's requests (a plan's own wins).
    pub priority: crate::upstream::shed::Priority,
    /// With `auth.jwt`: the issuers whose tokens it accepts (names, at least one).
    pub issuers: Vec<String>,
    pub token_from: crate::chain::credential::TokenFrom,
    /// The bearer token reaches the upstream.
    pub forward_token: bool,
    /// Upstream headers set from claims of the verified token.
    pub forward_claims: Vec<(http::HeaderName, ClaimPath)>,
    /// Callers that skip some of the route's limits.
    pub exempt: Vec<ExemptRule>,
    /// The header a request declares its cost in, and the most it may declare.
    pub cost_from_request: Option<(http::HeaderName, u64)>,
    /// Where a request states what it reserves of limits charged from the response (a
    /// header or a body field).
    pub reserve_from: Option<crate::chain::partition::KeyPart>,
    /// `allow_ips` / `deny_ips`, checked after the server's (`None`: no rules).
    pub addresses: Option<std::sync::Arc<crate::chain::address::AddressRules>>,
    /// `allow_clients` / `allow_plans` and their `deny_` forms (`None`: no rules).
    pub callers: Option<std::sync::Arc<crate::chain::callers::CallerRules>>,
    /// `request_headers` and `response_headers` (`None`: no rules).
    pub request_headers: Option<std::sync::Arc<crate::chain::header_rules::HeaderRules>>,
    pub response_headers: Option<std::sync::Arc<crate::chain::header_rules::HeaderRules>>,
    /// `cors` (`None`: browsers on other origins get no CORS headers; preflights are
    /// routed as any `OPTIONS` request).
    pub cors: Option<std::sync::Arc<crate::chain::cors::Cors>>,
    /// `redirect` / `respond`: the route answers every request itself, after the per-IP
    /// bucket (`None`: it proxies).
    pub answer: Option<std::sync::Arc<crate::chain::answer::Answer>>,
}

/// Callers from `nets` or identified as one of `clients` skip `limits` (`None`: every
/// limit, the per-IP one included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExemptRule {
    pub nets: Vec<ipnet::IpNet>,
    pub clients: Vec<String>,
    pub limits: Option<Vec<String>>,
}

/// A route's limit, counted per key (per IP, account, header value, or route-wide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLimitConfig {
    pub policy: Policy,
    /// A dry run (the route's `shadow` makes every limit one).
    pub shadow: bool,
    pub key: Vec<crate::chain::partition::KeyPart>,
    pub missing: crate::chain::partition::Missing,
}

impl RouteConfig {
    /// Whether some keyed limit, or the reservation, reads the body.
    pub fn reads_body(&self) -> bool {
        use crate::chain::partition::KeyPart;
        matches!(self.reserve_from, Some(KeyPart::Body(_)))
            || self
                .limits
                .iter()
                .any(|l| l.key.iter().any(|p| matches!(p, KeyPart::Body(_))))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListenerConfig {
    pub listen: SocketAddr,
    /// ALPN offers `h2` as well as `http/1.1`.
    pub h2: bool,
    pub certificates: Vec<CertificateConfig>,
    /// Client certificates (mTLS), when asked for.
    pub client_auth: Option<ClientAuthConfig>,
}

/// The TLS listener's client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuthConfig {
    /// A handshake without a certificate from the CA fails (else routes decide).
    pub required: bool,
    pub ca_file: std::path::PathBuf,
    /// The CA file's certificates (PEM).
    pub ca_pem: Vec<u8>,
    pub identity: crate::chain::cert::ClientIdentity,
    /// The plan of callers identified by their certificate.
    pub plan: Option<String>,
}

/// `[issuers.NAME]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct IssuerConfig {
    pub name: String,
    pub issuer: String,
    pub audiences: Vec<String>,
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    pub keys: IssuerKeys,
    pub leeway: Duration,
    pub required: Vec<ClaimPath>,
    pub client_id_claim: ClaimPath,
    pub plan: String,
    pub plan_claim: Option<ClaimPath>,
    /// `plan_claim` value → plan name.
    pub plans: BTreeMap<String, String>,
    /// The claim naming the caller's groups.
    pub groups_claim: Option<ClaimPath>,
}

/// Where an issuer's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssuerKeys {
    Jwks(crate::chain::jwt::source::JwksSettings),
    /// PEM public keys, a JWK or a JWKS document (checked when loaded).
    Fixed(super::units::Secret),
    /// An HMAC secret.
    Hmac(super::units::Secret),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateConfig {
    pub cert: std::path::PathBuf,
    /// The key file's path (a secret: it may have come from the environment).
    pub key: super::units::Secret,
    /// SNI names, lower case; empty: the certificate's DNS names.
    pub names: Vec<String>,
}
