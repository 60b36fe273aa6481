//! The Redis store (`store.kind = "redis"` or `"redis_cluster"`): every limit of a request is
//! decided by one call of one Lua script (`lua/`), atomically, on Redis's clock.
//!
//! - One connection per node, multiplexed: concurrent requests are pipelined on it (the
//!   `redis` crate's `ConnectionManager` for one node, reconnecting by itself; its cluster
//!   connection for Redis Cluster). Connections are made lazily, on the first call, inside
//!   the proxy's runtime, so a Redis that is down at start does not stop the gateway.
//! - The script is loaded once and invoked by SHA (`EVALSHA`); a `NOSCRIPT` reply (Redis
//!   restarted, `SCRIPT FLUSH`) makes the `redis` crate load it and retry, transparently.
//! - Every call is bounded by the configured timeout.
//! - Keys: `<prefix>:{<client id>}:<route>:<limit name>@<definition>`. The client id is the
//!   hash tag: one client's keys share a Cluster slot (so one script can touch them all),
//!   clients spread over slots. The definition in the key means a changed limit starts from
//!   fresh keys, as in the memory store; old keys expire by their TTL.

use crate::limit::store::lease::{Grant, GrantWindow};
use crate::limit::{Algorithm, Decision, Policy, Verdict};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use std::fmt::Write;
use std::time::Duration;
use tokio::sync::OnceCell;

/// The script Redis runs: the helpers, the four algorithms, then the entry point.
pub const SCRIPT_SOURCE: &str = concat!(
    include_str!("../../../../lua/lib.lua"),
    "\n",
    include_str!("../../../../lua/token_bucket.lua"),
    "\n",
    include_str!("../../../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../../../lua/sliding_window.lua"),
    "\n",
    include_str!("../../../../lua/sliding_log.lua"),
    "\n",
    include_str!("../../../../lua/concurrency.lua"),
    "\n",
    include_str!("../../../../lua/check.lua"),
);

/// Quota leasing (`lua/lease.lua`): reserves a slice of every limit of a plan at once.
pub const LEASE_SOURCE: &str = concat!(
    include_str!("../../../../lua/lib.lua"),
    "\n",
    include_str!("../../../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../../../lua/sliding_window.lua"),
    "\n",
    include_str!("../../../../lua/return_units.lua"),
    "\n",
    include_str!("../../../../lua/lease.lua"),
);

/// Gives the unspent units of leases back (`lua/give_back.lua`).
pub const GIVE_BACK_SOURCE: &str = concat!(
    include_str!("../../../../lua/return_units.lua"),
    "\n",
    include_str!("../../../../lua/give_back.lua"),
);

/// Frees a finished request's concurrency slots (`lua/release.lua`).
pub const RELEASE_SOURCE: &str = include_str!("../../../../lua/release.lua");

/// The instance heartbeat script (`lua/heartbeat.lua`).
pub const HEARTBEAT_SOURCE: &str = include_str!("../../../../lua/heartbeat.lua");

/// How long the connection waits for any reply. Each call is bounded by the configured
/// timeout on our side (`RedisStore::bounded`); the connection itself waits longer, so that
/// a reply arriving after that timeout still reaches a caller that kept waiting for it (a
/// lease renewal, whose grant is then kept instead of lost).
pub const LATE_REPLY: Duration = Duration::from_secs(30);

/// Why a store call did not produce a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("store unreachable: {0}")]
    Unavailable(String),
    /// Redis answered with an error: out of memory under `noeviction`, a key of the wrong
    /// type, a script error, a read-only replica...
    #[error("store refused the call: {0}")]
    Refused(String),
    /// Redis did not accept the configured credentials (wrong password or ACL user). Counts
    /// as an outage: without the breaker every request would open a connection to be refused.
    #[error("store rejected the credentials: {0}")]
    Auth(String),
    #[error("unexpected reply from the store: {0}")]
    Protocol(String),
    /// Not called: the circuit breaker is open after consecutive outages.
    #[error("store not called: circuit breaker open")]
    CircuitOpen,
}

impl StoreError {
    /// A short, stable name for logs and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Refused(_) => "refused",
            StoreError::Auth(_) => "auth",
            StoreError::Protocol(_) => "protocol",
            StoreError::CircuitOpen => "circuit_open",
        }
    }

    /// An outage (counts toward opening the circuit breaker), as opposed to an error Redis
    /// answered with.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::Auth(_)
        )
    }
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> StoreError {
        if e.is_timeout() {
            return StoreError::Unavailable(format!("timed out: {e}"));
        }
        let auth_code = matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
        if e.kind() == ErrorKind::AuthenticationFailed || auth_code {
            return StoreError::Auth(e.to_string());
        }
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            return StoreError::Unavailable(e.to_string());
        }
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::ClusterDown)
            | ErrorKind::Server(ServerErrorKind::TryAgain) => {
                StoreError::Unavailable(e.to_string())
            }
            ErrorKind::Server(_) | ErrorKind::Extension => StoreError::Refused(e.to_string()),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                StoreError::Protocol(e.to_string())
            }
            _ => StoreError::Unavailable(e.to_string()),
        }
    }
}

/// Where the shared counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One node (or a primary behind a stable address).
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub topology: Topology,
    pub prefix: String,
    /// Bound on every call (connecting included).
    pub timeout: Duration,
    /// How long a concurrency slot lives if its request never releases it (a crashed
    /// gateway): the longest a request can hold a slot.
    pub concurrency_lease: Duration,
}

// One per process, created once and never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Single {
        client: redis::Client,
        conns: Connections<ConnectionManager>,
    },
    Cluster {
        client: ClusterClient,
        conns: Connections<ClusterConnection>,
    },
}

/// Two lazily made connections: one for decisions, made (and so driven) by the runtime that
/// serves requests, and one for background work (heartbeats), so that neither runtime does
/// the other's socket I/O: a decision never hops threads to reach Redis.
struct Connections<C> {
    requests: OnceCell<C>,
    background: OnceCell<C>,
}

impl<C> Connections<C> {
    fn new() -> Connections<C> {
        Connections {
            requests: OnceCell::new(),
            background: OnceCell::new(),
        }
    }

    fn pick(&self, lane: Lane) -> &OnceCell<C> {
        match lane {
            Lane::Requests => &self.requests,
            Lane::Background => &self.background,
        }
    }
}

#[derive(Clone, Copy)]
enum Lane {
    Requests,
    Background,
}

pub struct RedisStore {
    config: RedisConfig,
    backend: Backend,
    script: Script,
    heartbeat: Script,
    release: Script,
    lease: Script,
    give_back: Script,
}

impl RedisStore {
    /// Parses the addresses; does not connect (that happens on the first call).
    pub fn new(config: RedisConfig) -> Result<RedisStore, StoreError> {
        let backend = match &config.topology {
            Topology::Single(url) => Backend::Single {
                client: redis::Client::open(url.as_str())
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                conns: Connections::new(),
            },
            Topology::Cluster(nodes) => Backend::Cluster {
                client: ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(config.timeout)
                    .response_timeout(LATE_REPLY)
                    .retries(0)
                    .build()
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                conns: Connections::new(),
            },
        };
        Ok(RedisStore {
            config,
            backend,
            script: Script::new(SCRIPT_SOURCE),
            heartbeat: Script::new(HEARTBEAT_SOURCE),
            release: Script::new(RELEASE_SOURCE),
            lease: Script::new(LEASE_SOURCE),
            give_back: Script::new(GIVE_BACK_SOURCE),
        })
    }

    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The SHA1 the script is called by.
    pub fn script_sha(&self) -> &str {
        self.script.get_hash()
    }

    /// The Redis key of one limit of one client on one route.
    pub fn key(&self, client: &str, route: &str, policy: &Policy) -> String {
        key(&self.config.prefix, client, route, policy)
    }

    /// Decides one request: every policy in one script call, within the timeout.
    /// `shadow[i]`: policy `i` decides but never blocks. `lease_id` names the request's
    /// concurrency slots. `now_ms` replaces Redis's clock (deterministic tests only).
    pub async fn check(&self, call: Call<'_>) -> Result<Verdict, StoreError> {
        self.check_timed(call).await.map(|(verdict, _)| verdict)
    }

    /// [`check`](Self::check), also returning the time (ms) the script decided at.
    pub async fn check_timed(&self, call: Call<'_>) -> Result<(Verdict, u64), StoreError> {
        self.bounded(self.call(call)).await
    }

    async fn call(&self, call: Call<'_>) -> Result<(Verdict, u64), StoreError> {
        let Call {
            client,
            route,
            policies,
            shadow,
            cost,
            lease_id,
            time,
        } = call;
        let mut invocation = self.script.prepare_invoke();
        for policy in policies {
            invocation.key(self.key(client, route, policy));
        }
        time.push_arg(&mut invocation);
        invocation.arg(cost).arg(lease_id);
        for (i, p) in policies.iter().enumerate() {
            let is_shadow = shadow.get(i).copied().unwrap_or(false);
            invocation
                .arg(&*p.name)
                .arg(algorithm_code(p.algorithm))
                .arg(p.limit)
                .arg(p.window_ms)
                .arg(p.burst)
                .arg(if is_shadow { "1" } else { "0" });
        }
        let reply: Vec<Value> = self.invoke(&invocation, Lane::Requests).await?;
        Ok((parse_reply(&reply, policies)?, int(&reply[1])?))
    }
}

impl RedisStore {
    /// Runs a script invocation on the (lazily made) connection. The first call connects and
    /// loads the scripts ([`load_scripts`](Self::load_scripts)), so that steady state is one EVALSHA per decision; if Redis
    /// is unreachable, the next call tries again.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        lane: Lane,
    ) -> Result<T, StoreError> {
        Ok(match &self.backend {
            Backend::Single { client, conns } => {
                let conn = conns
                    .pick(lane)
                    .get_or_try_init(|| async {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(self.config.timeout))
                            .set_response_timeout(Some(LATE_REPLY))
                            // One attempt per (re)connection: a retry after a backoff would
                            // outlast the call's timeout and turn a fast, telling failure
                            // (refused, wrong password) into a timeout. The next call
                            // connects again.
                            .set_number_of_retries(0)
                            .set_max_delay(Duration::from_secs(1));
                        let mut conn =
                            ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                        self.load_scripts(&mut conn).await?;
                        Ok::<_, RedisError>(conn)
                    })
                    .await?;
                invocation.invoke_async(&mut conn.clone()).await?
            }
            Backend::Cluster { client, conns } => {
                let conn = conns
                    .pick(lane)
                    .get_or_try_init(|| async {
                        let mut conn = client.get_async_connection().await?;
                        self.load_scripts(&mut conn).await?;
                        Ok::<_, RedisError>(conn)
                    })
                    .await?;
                invocation.invoke_async(&mut conn.clone()).await?
            }
        })
    }

    /// Loads every script on a new connection, so that each call is one EVALSHA that Redis
    /// runs in the order it was sent. A script loaded only on its first `NOSCRIPT` would be
    /// sent again after that reply: behind calls sent meanwhile (a release queued after a
    /// stalled check must run after it, and before the next check).
    async fn load_scripts<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> Result<(), RedisError> {
        for script in [
            &self.script,
            &self.release,
            &self.lease,
            &self.give_back,
            &self.heartbeat,
        ] {
            script.prepare_invoke().load_async(conn).await?;
        }
        Ok(())
    }

    /// [`check`](Self::check) for enforced rate limits only (no shadow flags, no slots).
    pub async fn check_limits(
        &self,
        client: &str,
        route: &str,
        policies: &[Policy],
        cost: u64,
        now_ms: Option<u64>,
    ) -> Result<Verdict, StoreError> {
        self.check(Call {
            client,
            route,
            policies,
            shadow: &[],
            cost,
            lease_id: "",
            time: now_ms.into(),
        })
        .await
    }

    /// Frees the concurrency slots a finished request holds (one call, within the timeout).
    pub async fn release(
        &self,
        client: &str,
        route: &str,
        policies: &[Policy],
        lease_id: &str,
    ) -> Result<(), StoreError> {
        self.release_within(client, route, policies, lease_id, self.config.timeout)
            .await
    }

    /// [`release`](Self::release) waiting up to `within` (a call given up on before it
    /// reached the connection would not be sent at all).
    pub async fn release_within(
        &self,
        client: &str,
        route: &str,
        policies: &[Policy],
        lease_id: &str,
        within: Duration,
    ) -> Result<(), StoreError> {
        let mut invocation = self.release.prepare_invoke();
        let mut any = false;
        for policy in policies.iter().filter(|p| p.is_concurrency()) {
            invocation.key(self.key(client, route, policy));
            any = true;
        }
        if !any {
            return Ok(());
        }
        invocation.arg(lease_id);
        match tokio::time::timeout(within, self.invoke::<u64>(&invocation, Lane::Requests)).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    /// Asks for a lease: `want` units (at least `need`) of every policy (fixed or sliding
    /// windows), after giving back a lapsed lease. One call, within the timeout.
    pub async fn lease(&self, call: LeaseCall<'_>) -> Result<Grant, StoreError> {
        self.bounded(self.lease_unbounded(call)).await
    }

    /// [`lease`](Self::lease) without the timeout: the caller bounds it (a renewal outlives
    /// a request that stops waiting for it).
    pub async fn lease_unbounded(&self, call: LeaseCall<'_>) -> Result<Grant, StoreError> {
        let LeaseCall {
            client,
            route,
            policies,
            need,
            want,
            give_back,
            give_back_starts,
            now_ms,
        } = call;
        let mut invocation = self.lease.prepare_invoke();
        for policy in policies {
            invocation.key(self.key(client, route, policy));
        }
        ScriptTime::from(now_ms).push_arg(&mut invocation);
        invocation.arg(need).arg(want);
        for (i, p) in policies.iter().enumerate() {
            let (start, units) = match give_back_starts.get(i) {
                Some(start) => (*start, give_back),
                None => (0, 0),
            };
            invocation
                .arg(&*p.name)
                .arg(algorithm_code(p.algorithm))
                .arg(p.limit)
                .arg(p.window_ms)
                .arg(start)
                .arg(units);
        }
        let reply: Vec<Value> = self.invoke(&invocation, Lane::Requests).await?;
        parse_grant(&reply, policies)
    }

    /// Gives `units` of a lease back to each policy's window that started at `starts[i]`
    /// (graceful shutdown). Returns the units the store took back.
    pub async fn give_back(
        &self,
        client: &str,
        route: &str,
        policies: &[Policy],
        starts: &[u64],
        units: u64,
    ) -> Result<u64, StoreError> {
        let mut invocation = self.give_back.prepare_invoke();
        for (policy, start) in policies.iter().zip(starts) {
            invocation
                .key(self.key(client, route, policy))
                .arg(algorithm_code(policy.algorithm))
                .arg(policy.window_ms)
                .arg(*start)
                .arg(units);
        }
        self.bounded(self.invoke(&invocation, Lane::Background))
            .await
    }

    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.config.timeout)),
        }
    }

    /// Announces `instance` (or, with `leave`, withdraws it) and returns how many instances
    /// have announced themselves within `liveness`. Bounded by the store timeout.
    pub async fn heartbeat(
        &self,
        instance: &str,
        liveness: Duration,
        leave: bool,
    ) -> Result<u64, StoreError> {
        let mut invocation = self.heartbeat.prepare_invoke();
        invocation
            .key(format!("{}:instances", self.config.prefix))
            .arg(instance)
            .arg(liveness.as_millis() as u64)
            .arg(if leave { "1" } else { "0" });
        self.bounded(self.invoke::<u64>(&invocation, Lane::Background))
            .await
    }
}

/// One request's question to the Redis store.
pub struct Call<'a> {
    pub client: &'a str,
    pub route: &'a str,
    pub policies: &'a [Policy],
    /// `shadow[i]`: policy `i` decides and counts but never blocks (missing = enforced).
    pub shadow: &'a [bool],
    pub cost: u64,
    /// Names the request's concurrency slots ("" when it takes none).
    pub lease_id: &'a str,
    pub time: ScriptTime,
}

/// The time a script decides at (`ARGV[1]`, see `now_ms` in `lua/lib.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptTime {
    /// Redis's clock (`TIME`): what production uses.
    Server,
    /// An explicit time in ms: deterministic tests replaying window edges exactly.
    At(u64),
    /// Redis's clock plus an offset in ms: tests that jump ahead in time without drifting
    /// from the clock Redis expires keys by.
    ServerPlus(u64),
}

impl From<Option<u64>> for ScriptTime {
    fn from(now_ms: Option<u64>) -> ScriptTime {
        now_ms.map_or(ScriptTime::Server, ScriptTime::At)
    }
}

impl ScriptTime {
    fn push_arg(self, invocation: &mut redis::ScriptInvocation<'_>) {
        match self {
            ScriptTime::Server => invocation.arg(""),
            ScriptTime::At(ms) => invocation.arg(ms),
            ScriptTime::ServerPlus(ms) => invocation.arg(format!("+{ms}")),
        };
    }
}

/// A renewal of a lease ([`crate::limit::store::lease::Ask`]) for the Redis store.
pub struct LeaseCall<'a> {
    pub client: &'a str,
    pub route: &'a str,
    pub policies: &'a [Policy],
    pub need: u64,
    pub want: u64,
    /// Units of a lapsed lease to give back first, and each policy's window start for them.
    pub give_back: u64,
    pub give_back_starts: &'a [u64],
    /// Replaces Redis's clock: deterministic tests only.
    pub now_ms: Option<u64>,
}

/// `<prefix>:{<client>}:<route>:<name>@<definition>`; `*` as the route of a client-wide
/// (all routes) limit.
pub fn key(prefix: &str, client: &str, route: &str, policy: &Policy) -> String {
    let route = match policy.scope {
        crate::limit::Scope::Route => route,
        crate::limit::Scope::Client => "*",
    };
    let mut key =
        String::with_capacity(prefix.len() + client.len() + route.len() + policy.name.len() + 32);
    let _ = write!(key, "{prefix}:{{{client}}}:{route}:{}@", policy.name);
    let _ = match policy.algorithm {
        Algorithm::TokenBucket => write!(
            key,
            "tb{}/{}/{}",
            policy.limit, policy.window_ms, policy.burst
        ),
        other => write!(
            key,
            "{}{}/{}",
            algorithm_code(other),
            policy.limit,
            policy.window_ms
        ),
    };
    key
}

fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::SlidingLog => "sl",
        Algorithm::Concurrency => "cc",
    }
}

/// `{admitted, now, rejected name, then 4 integers per limit}` → a verdict.
fn parse_reply(reply: &[Value], policies: &[Policy]) -> Result<Verdict, StoreError> {
    let limits = policies.len();
    if reply.len() != 3 + 4 * limits {
        return Err(StoreError::Protocol(format!(
            "expected {} values for {limits} limits, got {}",
            3 + 4 * limits,
            reply.len()
        )));
    }
    let decisions = reply[3..]
        .chunks(4)
        .zip(policies)
        .map(|(d, policy)| {
            Ok(Decision {
                allowed: int(&d[0])? == 1,
                limit: policy.capacity(),
                remaining: int(&d[1])?,
                reset_ms: int(&d[2])?,
                retry_after_ms: int(&d[3])?,
            })
        })
        .collect::<Result<Vec<Decision>, StoreError>>()?;
    let admitted = match &reply[0] {
        Value::Int(0) => false,
        Value::Int(1) => true,
        other => {
            return Err(StoreError::Protocol(format!(
                "expected 0 or 1, got {other:?}"
            )))
        }
    };
    Ok(Verdict {
        admitted,
        decisions,
    })
}

/// `{granted, now, rejected name, then 4 integers per limit}` → a grant.
fn parse_grant(reply: &[Value], policies: &[Policy]) -> Result<Grant, StoreError> {
    if reply.len() != 3 + 4 * policies.len() {
        return Err(StoreError::Protocol(format!(
            "expected {} values for a lease of {} limits, got {}",
            3 + 4 * policies.len(),
            policies.len(),
            reply.len()
        )));
    }
    let windows = reply[3..]
        .chunks(4)
        .map(|w| {
            Ok(GrantWindow {
                remaining: int(&w[0])?,
                reset_ms: int(&w[1])?,
                retry_after_ms: int(&w[2])?,
                start: int(&w[3])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let rejected = match &reply[2] {
        Value::BulkString(name) if !name.is_empty() => policies
            .iter()
            .position(|p| p.name.as_bytes() == name.as_slice()),
        _ => None,
    };
    Ok(Grant {
        granted: int(&reply[0])?,
        rejected,
        windows,
    })
}

fn int(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(StoreError::Protocol(format!(
            "expected a non-negative integer, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_put_the_client_in_the_hash_tag_and_the_definition_last() {
        let p = Policy::new("per-minute", Algorithm::SlidingWindow, 100, 60_000, 100);
        assert_eq!(
            key("turnstile", "ada", "orders", &p),
            "turnstile:{ada}:orders:per-minute@sw100/60000"
        );
        let p = Policy::new("burst", Algorithm::TokenBucket, 10, 1000, 20);
        assert_eq!(
            key("gw1", "ada", "orders", &p),
            "gw1:{ada}:orders:burst@tb10/1000/20"
        );
    }

    #[test]
    fn the_script_is_the_concatenation_of_lua_files() {
        for part in [
            "local function floor_div",
            "local function token_bucket",
            "local function fixed_window",
            "local function sliding_window",
            "local function sliding_log",
            "local algorithms =",
        ] {
            assert!(SCRIPT_SOURCE.contains(part), "{part}");
        }
        // Helpers come before their users, the entry point last.
        assert!(
            SCRIPT_SOURCE.find("local function ceil_div").unwrap()
                < SCRIPT_SOURCE.find("local function token_bucket").unwrap()
        );
        assert!(
            SCRIPT_SOURCE.find("local algorithms =").unwrap()
                > SCRIPT_SOURCE.find("local function sliding_log").unwrap()
        );
    }

    #[test]
    fn replies_are_checked() {
        let ok = [
            Value::Int(1),
            Value::Int(5),
            Value::SimpleString(String::new()),
            Value::Int(1),
            Value::Int(9),
            Value::Int(10),
            Value::Int(0),
        ];
        let p = Policy::new("p", Algorithm::FixedWindow, 10, 1000, 10);
        let v = parse_reply(&ok, std::slice::from_ref(&p)).unwrap();
        assert!(v.allowed());
        assert_eq!((v.decisions[0].remaining, v.decisions[0].limit), (9, 10));
        assert!(matches!(
            parse_reply(&ok, &[p.clone(), p.clone()]),
            Err(StoreError::Protocol(_))
        ));
        let mut rejected = ok.clone();
        rejected[0] = Value::Int(0);
        assert!(!parse_reply(&rejected, std::slice::from_ref(&p))
            .unwrap()
            .allowed());
        let mut bad = ok.clone();
        bad[0] = Value::Int(7);
        assert!(matches!(
            parse_reply(&bad, &[p]),
            Err(StoreError::Protocol(_))
        ));
    }
}
