//! The serde mirror of the TOML file: field names and nesting exactly as users write them.
//! Every table denies unknown fields, so a typo is an error, not a silently ignored setting.
//! Conversion to the typed [`super::Config`] (and every cross-reference check) lives in
//! `super::validate`.

pub use super::file_auth::{
    AuthFile, AuthMethodFile, ClientCertModeFile, ClientIdentityFile, ExemptFile, IssuerFile,
    RegistryFile,
};
pub use super::file_rules::{CorsFile, CorsSetting, HeaderRulesFile, RedirectFile, RespondFile};
pub use super::file_store::{StoreFile, StoreKindFile};
pub use super::file_upstream::{
    BalanceFile, FailureFile, HeaderCaseFile, HealthCheckFile, OutlierFile, PriorityFile,
    RetryBudgetFile, RetryFile, SheddingFile, UpstreamFile,
};
use super::units::{HumanDuration, Rate};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub admin: AdminFile,
    #[serde(default)]
    pub access_log: AccessLogFile,
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamFile>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    pub store: Option<StoreFile>,
    #[serde(default)]
    pub plans: BTreeMap<String, PlanFile>,
    #[serde(default)]
    pub clients: Vec<ClientFile>,
    /// Identity providers whose signed tokens (JWT) routes accept.
    #[serde(default)]
    pub issuers: BTreeMap<String, IssuerFile>,
    /// API clients managed at runtime through the admin API.
    pub registry: Option<RegistryFile>,
    pub tracing: Option<TracingFile>,
}

/// The content of `clients_file`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientsFile {
    #[serde(default)]
    pub clients: Vec<ClientFile>,
}

/// `parent_based = true | false | "trusted"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ParentBasedFile {
    Flag(bool),
    Named(String),
}

/// `[tracing]`: OpenTelemetry traces over OTLP/HTTP (off unless this table is present).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingFile {
    /// `false` turns it off while keeping the table (default `true`).
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP traces endpoint, `http(s)://host:4318/v1/traces` (default:
    /// from `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: Option<String>,
    /// `"http/protobuf"` (default) or `"http/json"`.
    pub protocol: Option<String>,
    /// `"gzip"` or `"none"` (default).
    pub compression: Option<String>,
    /// Headers sent with every export (a hosted collector's API key): name = secret.
    pub headers: Option<std::collections::BTreeMap<String, super::units::SecretSource>>,
    /// CA certificates (PEM) an https collector is verified against (default: Mozilla's).
    pub ca_file: Option<String>,
    pub service_name: Option<String>,
    /// Share of new traces recorded (0 to 1).
    pub sample_ratio: Option<f64>,
    /// Whose `traceparent` sampling flag is followed: `true` (everybody's), `false`
    /// (nobody's), `"trusted"` (peers in `server.trusted_proxies`; the default).
    pub parent_based: Option<ParentBasedFile>,
    /// Most traces sampled per second (0: no bound; default 100).
    pub max_sampled_per_second: Option<u32>,
    /// Most requests' spans waiting for export (beyond, dropped and counted).
    pub queue: Option<usize>,
    /// Most spans per export call.
    pub batch: Option<usize>,
    pub export_interval: Option<HumanDuration>,
    pub export_timeout: Option<HumanDuration>,
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
    /// Whether idle worker threads take connections' work from busy ones (tokio's
    /// work-stealing runtime, the default) instead of each thread running its own
    /// connections.
    pub work_stealing: Option<bool>,
    /// Secret of the keyed hash that turns keyed limits' key parts into store keys (the same
    /// on every instance).
    pub key_hash_secret: Option<super::units::SecretSource>,
    /// Reload when the configuration file changes on disk (SIGHUP and `POST /reload` work
    /// either way).
    pub watch_config: Option<bool>,
    /// Application log lines: "text" (default) or "json".
    pub log_format: Option<LogFormatFile>,
    /// HTTP/2 with prior knowledge (h2c) on the plaintext listener, next to HTTP/1.
    pub h2c: Option<bool>,
    /// A file of more `[[clients]]` (absolute path): keys can live apart from the rest and
    /// change on their own (watched and reloaded like the main file).
    pub clients_file: Option<String>,
    /// DNS servers (`ip:port`) upstream names are resolved with (default: the system's
    /// resolver).
    pub dns_servers: Option<Vec<String>>,
    /// A TLS listener (HTTPS, HTTP/2 by ALPN).
    pub tls: Option<TlsListenerFile>,
    /// Peers whose `X-Forwarded-For` is believed (CIDRs or single addresses).
    pub trusted_proxies: Option<Vec<String>>,
    /// Only clients from these networks may call any route; clients from `deny_ips` none.
    pub allow_ips: Option<Vec<String>>,
    pub deny_ips: Option<Vec<String>>,
    /// Plain-HTTP requests are redirected (308) to the TLS listener.
    pub https_redirect: Option<bool>,
    /// CORS for every route without its own `cors`.
    pub cors: Option<CorsFile>,
    /// Client addresses are limited per prefix of this length.
    pub ipv4_prefix: Option<u8>,
    pub ipv6_prefix: Option<u8>,
    /// Per-IP limit of routes that do not set their own.
    pub ip_limit: Option<IpLimitFile>,
    /// Most client addresses one per-IP table tracks.
    pub max_tracked_ips: Option<usize>,
    /// Most keyed-limit keys the in-process stores track (memory store, local fallback).
    pub max_tracked_keys: Option<usize>,
    /// Verified bearer tokens remembered (0: every request's token is verified).
    pub max_cached_tokens: Option<usize>,
    /// Where an identified client asks for its quota on the main listener (off unless set).
    pub quota_path: Option<String>,
    /// Each client's own bucket for the quota endpoint (`"off"`, or `{ rate, burst }`;
    /// default 1/s, burst 10).
    pub quota_limit: Option<IpLimitSetting>,
    /// Failed bearer-token checks per address before its tokens are refused unverified
    /// (`"off"`, or `{ rate, burst }`; default 5/s, burst 20).
    pub token_failure_limit: Option<IpLimitSetting>,
    /// Most requests held by leaky buckets at once on this instance (default 10000).
    pub max_delayed: Option<usize>,
    /// Most of them one client holds, by client id and by address (default a quarter).
    pub max_delayed_per_client: Option<usize>,
    /// Failure mode of routes that do not choose their own.
    pub on_store_error: Option<FailureModeFile>,
    /// Total time to receive a request's headers.
    pub header_timeout: Option<HumanDuration>,
    /// Longest pause while receiving a request body.
    pub body_timeout: Option<HumanDuration>,
    /// Longest wait for the client to take more of a response.
    pub send_timeout: Option<HumanDuration>,
    /// Idle keep-alive connections are closed after this.
    pub keepalive_timeout: Option<HumanDuration>,
    pub max_header_bytes: Option<super::units::ByteSize>,
    pub max_header_count: Option<usize>,
    pub max_uri_length: Option<super::units::ByteSize>,
    pub max_body_bytes: Option<super::units::ByteSize>,
    /// `"lower"` (default) or `"preserve"`: how response header names reach clients over
    /// HTTP/1.
    pub response_header_case: Option<HeaderCaseFile>,
}

/// `[server.tls]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsListenerFile {
    /// Address of the TLS listener, `host:port`.
    pub listen: String,
    /// Offer HTTP/2 by ALPN (default `true`).
    pub h2: Option<bool>,
    pub certificates: Vec<CertificateFile>,
    /// Ask clients for a certificate (mTLS): `optional` or `required`.
    pub client_certificates: Option<ClientCertModeFile>,
    /// The CA client certificates must chain to.
    pub client_ca_file: Option<String>,
    /// Which name of a client certificate identifies it (default `san`).
    pub client_identity: Option<ClientIdentityFile>,
    /// The plan of callers identified by their certificate.
    pub client_plan: Option<String>,
}

/// One certificate of the TLS listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateFile {
    /// PEM certificate chain, leaf first.
    pub cert: String,
    /// PEM private key file (the path may come from the environment or a file).
    pub key: super::units::SecretSource,
    /// SNI names served (default: the certificate's DNS names); `*.example.com` for one label.
    pub names: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogFile {
    pub mode: Option<AccessLogModeFile>,
    /// Fraction of requests logged in `sampled` mode.
    pub sample: Option<f64>,
    /// `"stdout"` or a file path.
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogModeFile {
    Off,
    On,
    Sampled,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// Address of the admin listener (default loopback).
    pub listen: Option<String>,
    /// When set, every admin request needs `Authorization: Bearer <token>`.
    pub token: Option<super::units::SecretSource>,
    /// Named tokens (the name is who the audit log says made a change).
    pub tokens: Option<BTreeMap<String, super::units::SecretSource>>,
    /// Named tokens that may only read (GET): the console or a dashboard for support staff.
    pub read_tokens: Option<BTreeMap<String, super::units::SecretSource>>,
    /// Host names requests may name besides the listener's own (DNS rebinding guard).
    pub hosts: Option<Vec<String>>,
}

impl fmt::Debug for AdminFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminFile")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "tokens",
                &self.tokens.as_ref().map(|t| t.keys().collect::<Vec<_>>()),
            )
            .field(
                "read_tokens",
                &self
                    .read_tokens
                    .as_ref()
                    .map(|t| t.keys().collect::<Vec<_>>()),
            )
            .field("hosts", &self.hosts)
            .finish()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpLimitFile {
    pub rate: Rate,
    pub burst: Option<u64>,
}

/// A route's `upgrades`: `true`, `false`, or the protocols allowed.
#[derive(Debug, Clone)]
pub enum UpgradesFile {
    Switch(bool),
    Only(Vec<String>),
}

impl<'de> Deserialize<'de> for UpgradesFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UpgradesFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false, or a list of protocols like [\"websocket\"]")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<UpgradesFile, E> {
                Ok(UpgradesFile::Switch(v))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<UpgradesFile, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(UpgradesFile::Only(names))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A route's `ip_limit`: a table, or `"off"` / `false` to opt out of the server default.
#[derive(Debug, Clone)]
pub enum IpLimitSetting {
    Off,
    Limit(IpLimitFile),
}

impl<'de> Deserialize<'de> for IpLimitSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IpLimitSetting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table like { rate = \"50/s\", burst = 100 }, or \"off\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IpLimitSetting, E> {
                match v {
                    "off" => Ok(IpLimitSetting::Off),
                    other => Err(E::custom(format_args!(
                        "invalid ip_limit {other:?}: expected a table like {{ rate = \"50/s\", burst = 100 }}, or \"off\""
                    ))),
                }
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<IpLimitSetting, E> {
                if v {
                    Err(E::custom(
                        "ip_limit = true says nothing: give { rate = \"50/s\", burst = 100 }",
                    ))
                } else {
                    Ok(IpLimitSetting::Off)
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IpLimitSetting, A::Error> {
                IpLimitFile::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(IpLimitSetting::Limit)
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    pub limits: Vec<LimitFile>,
    /// Most requests of one client in flight, all routes together.
    pub max_concurrent: Option<u64>,
    /// Load-shedding class of this plan's requests (overrides the route's).
    pub priority: Option<PriorityFile>,
    /// Route limits (by name) and the per-IP one ("ip") this plan's clients skip.
    pub exempt_from: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmFile {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitFile {
    pub name: String,
    pub algorithm: AlgorithmFile,
    pub limit: u64,
    pub window: super::units::WindowSetting,
    /// A calendar window's time zone (IANA; default "UTC").
    pub time_zone: Option<String>,
    /// Token bucket: capacity (default `limit`); leaky bucket: requests that may wait
    /// (default 0).
    pub burst: Option<u64>,
    /// Leaky bucket: how many of the `burst` pass at once (default 0: all wait their turn).
    pub delay: Option<u64>,
    /// Decide and count, but never reject (dry run).
    pub shadow: Option<bool>,
    /// Quota leasing: an instance reserves up to this many units at once (fixed_window and
    /// sliding_window; every limit of the plan, or none).
    pub lease: Option<u64>,
    /// Charge what the response says a request cost ("header:NAME"): fixed and sliding
    /// windows only.
    pub cost_from_response: Option<String>,
    /// Most units one response may charge (default: the limit).
    pub max_response_cost: Option<u64>,
    /// Units a request reserves of a limit charged from the response when it is admitted,
    /// unless it states its own bound (the route's `reserve_from`); default: the route's cost.
    pub reserve: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientFile {
    pub id: String,
    pub plan: String,
    /// Plaintext keys or `sha256:<hex>` digests (each may come from the environment or a
    /// file).
    #[serde(default)]
    pub api_keys: Vec<super::units::SecretSource>,
    /// Free-form names and values (shown by the admin API).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Groups the client is in (`allow_groups` / `deny_groups` on routes).
    pub groups: Option<Vec<String>>,
}

impl fmt::Debug for ClientFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientFile")
            .field("id", &self.id)
            .field("plan", &self.plan)
            .field("metadata", &self.metadata)
            .field(
                "api_keys",
                &format_args!("<{} redacted>", self.api_keys.len()),
            )
            .finish()
    }
}

/// What a route does when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureModeFile {
    FailOpen,
    FailClosed,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormatFile {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadersModeFile {
    On,
    Off,
    NearLimit,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: String,
    pub path_prefix: String,
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
    /// Where requests go (required unless the route answers itself: `redirect`, `respond`).
    pub upstream: Option<String>,
    pub connect_timeout: Option<HumanDuration>,
    pub read_timeout: Option<HumanDuration>,
    pub write_timeout: Option<HumanDuration>,
    /// An upgraded connection (WebSocket) ends when a direction is silent this long.
    pub upgrade_idle_timeout: Option<HumanDuration>,
    /// Protocol upgrades let through: `true` (any, the default), `false`, or a list of
    /// protocol names (`["websocket"]`).
    pub upgrades: Option<UpgradesFile>,
    /// The upstream gets the path without the route's `path_prefix`.
    pub strip_prefix: Option<bool>,
    /// The upstream gets the path with this prefix in front (after `strip_prefix`).
    pub add_prefix: Option<String>,
    /// Append an RFC 7239 `Forwarded` element for the upstream.
    pub forwarded: Option<bool>,
    /// Retries after the request was sent (off unless given).
    pub retry: Option<RetryFile>,
    pub ip_limit: Option<IpLimitSetting>,
    pub auth: Option<AuthFile>,
    /// Units each request costs against the client's plan limits.
    pub cost: Option<u64>,
    pub rate_limit_headers: Option<HeadersModeFile>,
    pub legacy_rate_limit_headers: Option<bool>,
    /// Pass the API key on to the upstream (default: removed).
    pub forward_api_key: Option<bool>,
    pub on_store_error: Option<FailureModeFile>,
    /// Largest request body this route accepts (default: `server.max_body_bytes`).
    pub max_body_bytes: Option<super::units::ByteSize>,
    /// Every limit on this route decides and counts but never rejects (dry run).
    pub shadow: Option<bool>,
    /// Most requests of one client in flight on this route.
    pub max_concurrent: Option<u64>,
    /// Keyed limits of this route (per IP, account, header, route-wide...).
    pub limits: Option<Vec<RouteLimitFile>>,
    /// Largest request body read for `body:` key parts.
    pub body_key_bytes: Option<super::units::ByteSize>,
    /// Load-shedding class of this route's requests (default `default`).
    pub priority: Option<PriorityFile>,
    /// With `auth` including "jwt": the issuers accepted (default: every one).
    pub issuers: Option<Vec<String>>,
    /// Where the token is: "authorization" (Bearer, the default), "header:NAME", "cookie:NAME".
    pub token_from: Option<String>,
    /// Pass the bearer token on to the upstream (default: true).
    pub forward_token: Option<bool>,
    /// Upstream header → claim, set from the verified token (the incoming header removed).
    pub forward_claims: Option<BTreeMap<String, String>>,
    /// Callers (by address or client id) that skip some of this route's limits.
    pub exempt: Option<Vec<ExemptFile>>,
    /// The request declares its cost ("header:NAME"), for callers trusted to.
    pub cost_from_request: Option<String>,
    /// Most a request may declare (default 100).
    pub max_cost: Option<u64>,
    /// Where a request states the bound of what it will cost ("header:NAME", "body:FIELD"):
    /// what it reserves of its plan's limits charged from the response.
    pub reserve_from: Option<String>,
    /// Only clients from these networks may call the route (CIDRs or addresses).
    pub allow_ips: Option<Vec<String>>,
    /// Clients from these networks may not call the route (even inside `allow_ips`).
    pub deny_ips: Option<Vec<String>>,
    /// Only these clients (by id), or clients of these plans, may call the route.
    pub allow_clients: Option<Vec<String>>,
    pub allow_plans: Option<Vec<String>>,
    /// These clients, and clients of these plans, may not call the route.
    pub deny_clients: Option<Vec<String>>,
    pub deny_plans: Option<Vec<String>>,
    /// Clients in these groups may (or may not) call the route.
    pub allow_groups: Option<Vec<String>>,
    pub deny_groups: Option<Vec<String>>,
    /// Headers set, added and removed on the request the upstream receives.
    pub request_headers: Option<HeaderRulesFile>,
    /// Headers set, added and removed on the upstream's response.
    pub response_headers: Option<HeaderRulesFile>,
    /// Browsers on these origins may call the route (preflights answered by the gateway);
    /// `"off"`: not `[server] cors` either.
    pub cors: Option<CorsSetting>,
    /// The route answers every request with a redirect to a fixed host.
    pub redirect: Option<RedirectFile>,
    /// The route answers every request itself (a maintenance page, a retired API).
    pub respond: Option<RespondFile>,
}

/// A route's own limit, counted per key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteLimitFile {
    pub name: String,
    pub algorithm: AlgorithmFile,
    pub limit: u64,
    pub window: super::units::WindowSetting,
    /// A calendar window's time zone (IANA; default "UTC").
    pub time_zone: Option<String>,
    pub burst: Option<u64>,
    /// Leaky bucket: how many of the `burst` pass at once.
    pub delay: Option<u64>,
    pub shadow: Option<bool>,
    /// Parts of the key: "ip", "client", "route", "header:NAME", "body:FIELD".
    pub key: Vec<String>,
    /// What a request lacking a part gets: reject (default), skip, shared.
    pub missing: Option<MissingFile>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingFile {
    Reject,
    Skip,
    Shared,
}
