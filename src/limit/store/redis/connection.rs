//! Connections to Redis: made lazily, inside the runtime that uses them (so a Redis that is
//! down at start does not stop the gateway), one multiplexed connection per node and lane,
//! every script loaded when a connection is made. The request lane's connection is repaired
//! as soon as it is known lost (`repair.rs`); single-node and Sentinel connections speak RESP3
//! unless the URL says `protocol=resp2`, so that a dropped connection reports itself.

use crate::limit::store::error::StoreError;
use crate::limit::store::redis::config::{RedisAuth, RedisConfig, RedisTls, Topology};
use crate::limit::store::redis::repair::{repair_loop, LaneWatch, OnDisconnect, Ping};
use crate::limit::store::redis::scripts::{Call, Scripts};
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ErrorKind, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo,
    RedisError, ServerErrorKind, TlsCertificates,
};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Which connection a call uses.
#[derive(Clone, Copy)]
pub enum Lane {
    /// Decisions and releases: the connection made (and so driven) by the runtime serving
    /// requests, so a decision never hops threads to reach Redis.
    Requests,
    /// Heartbeats and shutdown give-backs, from the background runtime.
    Background,
}

/// How long a connection waits for any reply. Each call is bounded by the configured timeout
/// on the caller's side; the connection itself waits longer, so that a reply arriving after
/// that timeout still reaches a caller that kept waiting for it (a lease renewal, whose grant
/// is then kept instead of lost).
pub const LATE_REPLY: Duration = Duration::from_secs(30);

// One per process, created once and never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Nodes {
    Single {
        client: redis::Client,
        lanes: Lanes<ConnectionManager>,
    },
    Cluster {
        client: ClusterClient,
        lanes: Lanes<ClusterConnection>,
    },
    /// The primary the sentinels name; asked again when its connection fails or it turns
    /// out to be a replica (after a failover).
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        lanes: SentinelLanes,
    },
}

#[derive(Default)]
struct SentinelLanes {
    requests: arc_swap::ArcSwapOption<MultiplexedConnection>,
    background: arc_swap::ArcSwapOption<MultiplexedConnection>,
}

impl SentinelLanes {
    fn pick(&self, lane: Lane) -> &arc_swap::ArcSwapOption<MultiplexedConnection> {
        match lane {
            Lane::Requests => &self.requests,
            Lane::Background => &self.background,
        }
    }
}

struct Lanes<C> {
    requests: OnceCell<C>,
    background: OnceCell<C>,
}

impl<C> Lanes<C> {
    fn new() -> Lanes<C> {
        Lanes {
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

/// The connections of one Redis store.
pub struct Link {
    nodes: Nodes,
    /// Bound on making a connection.
    connect_timeout: Duration,
    scripts: Arc<Scripts>,
    /// Whether the request lane's connection is known lost (and being repaired).
    watch: Arc<LaneWatch>,
    /// RESP3: the connections report a drop (single node, Sentinel).
    resp3: bool,
    me: Weak<Link>,
}

impl Link {
    /// Parses the addresses and reads the TLS files; does not connect (the first call does).
    pub fn new(
        config: &RedisConfig,
        connect_timeout: Duration,
        scripts: Arc<Scripts>,
    ) -> Result<Arc<Link>, StoreError> {
        // rustls needs a process-wide crypto provider before a `rediss://` connection.
        pingora::tls::install_default_crypto_provider();
        let unusable = |e: RedisError| StoreError::Unavailable(e.to_string());
        let certs = tls_certificates(&config.tls)?;
        let mut resp3 = false;
        let nodes = match &config.topology {
            Topology::Single(url) => {
                let info = url.as_str().into_connection_info().map_err(unusable)?;
                let mut redis = with_auth(info.redis_settings().clone(), &config.auth);
                if !names_protocol(url) {
                    redis = redis.set_protocol(ProtocolVersion::RESP3);
                }
                resp3 = redis.protocol() == ProtocolVersion::RESP3;
                let info = info.set_redis_settings(redis);
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(info, certs),
                    None => redis::Client::open(info),
                };
                Nodes::Single {
                    client: client.map_err(unusable)?,
                    lanes: Lanes::new(),
                }
            }
            Topology::Cluster(nodes) => {
                let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(connect_timeout)
                    .response_timeout(LATE_REPLY)
                    .retries(0);
                if let Some(user) = &config.auth.username {
                    builder = builder.username(user);
                }
                if let Some(password) = &config.auth.password {
                    builder = builder.password(password);
                }
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                Nodes::Cluster {
                    client: builder.build().map_err(unusable)?,
                    lanes: Lanes::new(),
                }
            }
            Topology::Sentinel { master, sentinels } => {
                resp3 = true;
                let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(
                    with_auth(RedisConnectionInfo::default(), &config.auth)
                        .set_protocol(ProtocolVersion::RESP3),
                );
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master,
                    Some(node),
                    SentinelServerType::Master,
                )
                .map_err(unusable)?;
                Nodes::Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    lanes: SentinelLanes::default(),
                }
            }
        };
        Ok(Arc::new_cyclic(|me| Link {
            nodes,
            connect_timeout,
            scripts,
            watch: Arc::new(LaneWatch::default()),
            resp3,
            me: me.clone(),
        }))
    }

    /// The request connection is lost: requests wait for its repair.
    pub fn lost(&self) {
        self.watch.lost();
    }

    pub fn is_up(&self) -> bool {
        !self.watch.is_down()
    }

    pub fn repairs(&self) -> u64 {
        self.watch.repairs()
    }

    /// A call on this lane timed out. On Sentinel the primary may be frozen while the
    /// sentinels have promoted a replica: the next call asks them again.
    pub fn timed_out(&self) {
        if let Nodes::Sentinel { lanes, .. } = &self.nodes {
            lanes.requests.store(None);
            self.watch.lost();
        }
    }

    /// Runs a script call on `lane`'s connection, making it first if needed (then
    /// loading every script, so steady state is one EVALSHA per call). Not bounded in time:
    /// callers bound it. If Redis is unreachable, the next call tries again.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
    ) -> Result<T, StoreError> {
        if matches!(lane, Lane::Requests) {
            if self.watch.start() {
                // In the runtime serving requests, whose connection it repairs.
                tokio::spawn(repair_loop(self.me.clone(), Arc::clone(&self.watch)));
            }
            // Boxed: rare, and its state would widen every call's future.
            if self.watch.is_down() && !Box::pin(self.watch.wait_up()).await {
                return Err(StoreError::Unavailable(
                    "the connection to Redis is lost and could not be made again yet".into(),
                ));
            }
        }
        let result = self.invoke_now(call, lane).await;
        if let (Err(e), Lane::Requests) = (&result, lane) {
            if lost_connection(e) {
                self.watch.lost();
            }
        }
        Ok(result?)
    }

    async fn invoke_now<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
    ) -> Result<T, RedisError> {
        Ok(match &self.nodes {
            Nodes::Single { client, lanes } => {
                let conn = self.single(client, lanes, lane).await?;
                run(call, &mut conn.clone()).await?
            }
            Nodes::Cluster { client, lanes } => {
                let conn = first_or(lanes.pick(lane), || async {
                    let mut conn = client.get_async_connection().await?;
                    load(&self.scripts, &mut conn).await?;
                    Ok(conn)
                })
                .await?;
                run(call, &mut conn.clone()).await?
            }
            Nodes::Sentinel { client, lanes } => {
                let slot = lanes.pick(lane);
                let conn = match slot.load_full() {
                    Some(conn) => conn,
                    // Boxed, as in `first_or`.
                    None => Box::pin(self.sentinel_connect(client, slot, lane)).await?,
                };
                let result = run(call, &mut (*conn).clone()).await;
                if let Err(e) = &result {
                    if lost_the_primary(e) {
                        // The next call asks the sentinels where the primary is now.
                        slot.compare_and_swap(&conn, None);
                    }
                }
                result?
            }
        })
    }

    /// The single node's connection for `lane`, made (with every script loaded) if needed.
    async fn single<'a>(
        &self,
        client: &redis::Client,
        lanes: &'a Lanes<ConnectionManager>,
        lane: Lane,
    ) -> Result<&'a ConnectionManager, RedisError> {
        first_or(lanes.pick(lane), || async {
            let mut config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(LATE_REPLY))
                // One attempt per (re)connection: a retry after a backoff would outlast the
                // call's timeout and turn a fast, telling failure (refused, wrong password)
                // into a timeout. The next call connects again.
                .set_number_of_retries(0)
                .set_max_delay(Duration::from_secs(1));
            if self.resp3 && matches!(lane, Lane::Requests) {
                config = config.set_push_sender(OnDisconnect(self.me.clone()));
            }
            let mut conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
            load(&self.scripts, &mut conn).await?;
            Ok(conn)
        })
        .await
    }

    /// Asks the sentinels for the primary and connects to it (one caller at a time; the
    /// others find the new connection).
    async fn sentinel_connect(
        &self,
        client: &tokio::sync::Mutex<SentinelClient>,
        slot: &arc_swap::ArcSwapOption<MultiplexedConnection>,
        lane: Lane,
    ) -> Result<Arc<MultiplexedConnection>, RedisError> {
        let mut client = client.lock().await;
        if let Some(conn) = slot.load_full() {
            return Ok(conn);
        }
        let mut config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(LATE_REPLY));
        if matches!(lane, Lane::Requests) {
            config = config.set_push_sender(OnDisconnect(self.me.clone()));
        }
        let mut conn = client.get_async_connection_with_config(&config).await?;
        load(&self.scripts, &mut conn).await?;
        let conn = Arc::new(conn);
        slot.store(Some(Arc::clone(&conn)));
        Ok(conn)
    }
}

/// Sends `call` by SHA; if Redis does not know the script (it restarted, or its scripts were
/// flushed, since the connection loaded them), loads it and sends the call again.
async fn run<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
    call: &Call<'_>,
    conn: &mut C,
) -> Result<T, RedisError> {
    match call.cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // Boxed, as in `first_or`.
            Box::pin(async {
                call.script.prepare_invoke().load_async(conn).await?;
                call.cmd.query_async(conn).await
            })
            .await
        }
        result => result,
    }
}

/// The connection in `cell`, made by `connect` when there is none yet. Making one is boxed:
/// its state (connecting, loading every script) would otherwise be part of every call's
/// future, which is part of every request's.
async fn first_or<C, F>(cell: &OnceCell<C>, connect: impl FnOnce() -> F) -> Result<&C, RedisError>
where
    F: std::future::Future<Output = Result<C, RedisError>>,
{
    match cell.get() {
        Some(conn) => Ok(conn),
        None => Box::pin(cell.get_or_try_init(connect)).await,
    }
}

impl Ping for Link {
    fn watch(&self) -> &LaneWatch {
        &self.watch
    }

    /// One PING through the request lane's connection (made anew if the old one is gone;
    /// on Sentinel, to the primary the sentinels name now), bounded by the connect timeout.
    async fn ping(&self) -> bool {
        let ping = async {
            match &self.nodes {
                Nodes::Single { client, lanes } => {
                    let conn = self.single(client, lanes, Lane::Requests).await?;
                    let pong = redis::cmd("PING")
                        .query_async::<()>(&mut conn.clone())
                        .await;
                    match pong {
                        // The manager's last reconnection failed (Redis was down then): this
                        // error started a new one, which the second ping waits for.
                        Err(e) if lost_connection(&e) => {
                            redis::cmd("PING")
                                .query_async::<()>(&mut conn.clone())
                                .await
                        }
                        pong => pong,
                    }
                }
                // The cluster client repairs its own connections, node by node; a PING
                // says whether the cluster answers.
                Nodes::Cluster { client, lanes } => {
                    let conn = first_or(lanes.pick(Lane::Requests), || async {
                        let mut conn = client.get_async_connection().await?;
                        load(&self.scripts, &mut conn).await?;
                        Ok(conn)
                    })
                    .await?;
                    redis::cmd("PING")
                        .query_async::<()>(&mut conn.clone())
                        .await
                }
                Nodes::Sentinel { client, lanes } => {
                    let slot = &lanes.requests;
                    let conn = match slot.load_full() {
                        Some(conn) => conn,
                        None => self.sentinel_connect(client, slot, Lane::Requests).await?,
                    };
                    let pong = redis::cmd("PING")
                        .query_async::<()>(&mut (*conn).clone())
                        .await;
                    if pong.is_err() {
                        slot.compare_and_swap(&conn, None);
                    }
                    pong
                }
            }
        };
        matches!(
            tokio::time::timeout(self.connect_timeout.max(Duration::from_millis(100)), ping).await,
            Ok(Ok(()))
        )
    }
}

/// The connection is gone (not merely an error Redis answered with).
fn lost_connection(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// Whether a URL chooses its protocol itself (`?protocol=resp2`).
fn names_protocol(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| u.query_pairs().any(|(k, _)| k == "protocol"))
}

/// The connection no longer reaches a writable primary: broken, or the node was demoted to
/// a replica by a failover (`READONLY`), or it is not ready.
fn lost_the_primary(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// The URL's connection settings with the configured user and password over them.
fn with_auth(mut redis: RedisConnectionInfo, auth: &RedisAuth) -> RedisConnectionInfo {
    if let Some(user) = &auth.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &auth.password {
        redis = redis.set_password(password);
    }
    redis
}

/// The CA and client certificate files, read now (`None`: the system roots, no client
/// certificate).
fn tls_certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, StoreError> {
    if tls.ca_file.is_none() && tls.client_cert.is_none() {
        return Ok(None);
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot read the {what}: {}", e.kind())))
    };
    let root_cert = match &tls.ca_file {
        Some(ca) => Some(read(ca, "Redis CA file")?),
        None => None,
    };
    let client_tls = match &tls.client_cert {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "Redis client certificate")?,
            client_key: read(key, "Redis client key")?,
        }),
        None => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Loads every script on a new connection, so that each call is one EVALSHA that Redis runs
/// in the order it was sent. A script loaded only on its first `NOSCRIPT` would be sent again
/// after that reply: behind calls sent meanwhile (a release queued after a stalled check must
/// run after it, and before the next check).
async fn load<C: redis::aio::ConnectionLike>(
    scripts: &Scripts,
    conn: &mut C,
) -> Result<(), RedisError> {
    for script in scripts.all() {
        script.prepare_invoke().load_async(conn).await?;
    }
    Ok(())
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
