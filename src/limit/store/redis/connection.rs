//! Connections to Redis: made lazily, inside the runtime that uses them (so a Redis that is
//! down at start does not stop the gateway), one multiplexed connection per node and lane,
//! every script loaded when a connection is made.

use crate::limit::store::error::StoreError;
use crate::limit::store::redis::config::Topology;
use crate::limit::store::redis::scripts::Scripts;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ScriptInvocation, ServerErrorKind};
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
    /// Parses the addresses; does not connect (the first call does).
    pub fn new(topology: &Topology, connect_timeout: Duration) -> Result<Link, StoreError> {
        let backend = match topology {
            Topology::Single(url) => Backend::Single {
                client: redis::Client::open(url.as_str())
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                lanes: Lanes::new(),
            },
            Topology::Cluster(nodes) => Backend::Cluster {
                client: ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(connect_timeout)
                    .response_timeout(LATE_REPLY)
                    .retries(0)
                    .build()
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?,
                lanes: Lanes::new(),
            },
        };
        Ok(Link {
            backend,
            connect_timeout,
        })
    }

    /// Runs a script invocation on `lane`'s connection, making it first if needed (then
    /// loading every script, so steady state is one EVALSHA per call). Not bounded in time:
    /// callers bound it. If Redis is unreachable, the next call tries again.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        lane: Lane,
        scripts: &Scripts,
    ) -> Result<T, StoreError> {
        Ok(match &self.backend {
            Backend::Single { client, lanes } => {
                let conn = lanes
                    .pick(lane)
                    .get_or_try_init(|| async {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(self.connect_timeout))
                            .set_response_timeout(Some(LATE_REPLY))
                            // One attempt per (re)connection: a retry after a backoff would
                            // outlast the call's timeout and turn a fast, telling failure
                            // (refused, wrong password) into a timeout. The next call
                            // connects again.
                            .set_number_of_retries(0)
                            .set_max_delay(Duration::from_secs(1));
                        let mut conn =
                            ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                        load(scripts, &mut conn).await?;
                        Ok::<_, RedisError>(conn)
                    })
                    .await?;
                invocation.invoke_async(&mut conn.clone()).await?
            }
            Backend::Cluster { client, lanes } => {
                let conn = lanes
                    .pick(lane)
                    .get_or_try_init(|| async {
                        let mut conn = client.get_async_connection().await?;
                        load(scripts, &mut conn).await?;
                        Ok::<_, RedisError>(conn)
                    })
                    .await?;
                invocation.invoke_async(&mut conn.clone()).await?
            }
        })
    }
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
