//! Connections to Redis: made lazily, inside the runtime that uses them (so a Redis that is
//! down at start does not stop the gateway), one multiplexed connection per node and lane,
//! every script loaded when a connection is made.

use crate::limit::store::error::StoreError;
use crate::limit::store::redis::config::{RedisAuth, RedisConfig, RedisTls, Topology};
use crate::limit::store::redis::scripts::{Call, Scripts};
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError,
    ServerErrorKind, TlsCertificates,
};
use std::sync::Arc;
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
enum Backend {
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
    backend: Backend,
    /// Bound on making a connection.
    connect_timeout: Duration,
}

impl Link {
    /// Parses the addresses and reads the TLS files; does not connect (the first call does).
    pub fn new(config: &RedisConfig, connect_timeout: Duration) -> Result<Link, StoreError> {
        // rustls needs a process-wide crypto provider before a `rediss://` connection.
        pingora::tls::install_default_crypto_provider();
        let unusable = |e: RedisError| StoreError::Unavailable(e.to_string());
        let certs = tls_certificates(&config.tls)?;
        let backend = match &config.topology {
            Topology::Single(url) => {
                let info = url.as_str().into_connection_info().map_err(unusable)?;
                let redis = with_auth(info.redis_settings().clone(), &config.auth);
                let info = info.set_redis_settings(redis);
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(info, certs),
                    None => redis::Client::open(info),
                };
                Backend::Single {
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
                Backend::Cluster {
                    client: builder.build().map_err(unusable)?,
                    lanes: Lanes::new(),
                }
            }
            Topology::Sentinel { master, sentinels } => {
                let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(
                    with_auth(RedisConnectionInfo::default(), &config.auth),
                );
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master,
                    Some(node),
                    SentinelServerType::Master,
                )
                .map_err(unusable)?;
                Backend::Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    lanes: SentinelLanes::default(),
                }
            }
        };
        Ok(Link {
            backend,
            connect_timeout,
        })
    }

    /// Runs a script call on `lane`'s connection, making it first if needed (then
    /// loading every script, so steady state is one EVALSHA per call). Not bounded in time:
    /// callers bound it. If Redis is unreachable, the next call tries again.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
        scripts: &Scripts,
    ) -> Result<T, StoreError> {
        Ok(match &self.backend {
            Backend::Single { client, lanes } => {
                let conn = first_or(lanes.pick(lane), || async {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.connect_timeout))
                        .set_response_timeout(Some(LATE_REPLY))
                        // One attempt per (re)connection: a retry after a backoff would
                        // outlast the call's timeout and turn a fast, telling failure
                        // (refused, wrong password) into a timeout. The next call
                        // connects again.
                        .set_number_of_retries(0)
                        .set_max_delay(Duration::from_secs(1));
                    let mut conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                    load(scripts, &mut conn).await?;
                    Ok(conn)
                })
                .await?;
                run(call, &mut conn.clone()).await?
            }
            Backend::Cluster { client, lanes } => {
                let conn = first_or(lanes.pick(lane), || async {
                    let mut conn = client.get_async_connection().await?;
                    load(scripts, &mut conn).await?;
                    Ok(conn)
                })
                .await?;
                run(call, &mut conn.clone()).await?
            }
            Backend::Sentinel { client, lanes } => {
                let slot = lanes.pick(lane);
                let conn = match slot.load_full() {
                    Some(conn) => conn,
                    // Boxed, as in `first_or`.
                    None => Box::pin(self.sentinel_connect(client, slot, scripts)).await?,
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

    /// Asks the sentinels for the primary and connects to it (one caller at a time; the
    /// others find the new connection).
    async fn sentinel_connect(
        &self,
        client: &tokio::sync::Mutex<SentinelClient>,
        slot: &arc_swap::ArcSwapOption<MultiplexedConnection>,
        scripts: &Scripts,
    ) -> Result<Arc<MultiplexedConnection>, RedisError> {
        let mut client = client.lock().await;
        if let Some(conn) = slot.load_full() {
            return Ok(conn);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(LATE_REPLY));
        let mut conn = client.get_async_connection_with_config(&config).await?;
        load(scripts, &mut conn).await?;
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
