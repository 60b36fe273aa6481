//! One node of a Redis Cluster: its connection per lane, its own circuit breaker and its own
//! health, so that one shard's trouble is that shard's clients' only.
//!
//! A connection is made by a task of its own (scripts loaded before it is used), never by
//! the request that needs it: a request giving up at its `store.timeout` does not abandon the
//! connecting, and the next request finds the connection made. A connection that breaks is
//! dropped (the next call makes another); one that stalls is kept — replies sent on it still
//! come back in order, which releases of concurrency slots rely on.

use crate::clock::{Clock, MonotonicClock};
use crate::limit::store::breaker::{Attempt, BreakerState, CircuitBreaker, Transition};
use crate::limit::store::error::StoreError;
use crate::limit::store::health::{HealthCell, StoreHealth};
use crate::limit::store::redis::batch::{
    unsupported, BatchCounts, Batcher, SendBatch, Sending, Sent,
};
use crate::limit::store::redis::making::{connect_bound, connection_timeout};
use crate::limit::store::redis::patient::patient;
use crate::limit::store::redis::scripts::{Call, Scripts};
use crate::limit::store::redis::wire::{load, lost_connection, run, Lane, LATE_REPLY};
use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How a call to a node ended, when it did not answer.
pub enum Failure {
    /// The slot is served elsewhere (`MOVED`), or is being moved and this key is there
    /// already (`ASK`): the node to ask instead.
    Redirect {
        ask: bool,
        to: String,
    },
    /// A multi-key call during its slot's migration (`TRYAGAIN`): some keys moved, some not.
    TryAgain,
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

pub struct Node {
    /// `host:port`, as the cluster names it.
    pub addr: String,
    /// The client to connect with (or why there is none: then every connection fails so).
    client: Result<redis::Client, String>,
    lanes: [NodeLane; 2],
    breaker: CircuitBreaker,
    health: HealthCell,
    scripts: Arc<Scripts>,
    store_timeout: Duration,
    /// Told when this node stalls or fails: the slot map may have changed (a failover).
    trouble: Arc<Notify>,
    /// This node's decisions, batched while a call is in flight (`batch.rs`).
    pub batcher: Arc<Batcher>,
}

#[derive(Default)]
struct NodeLane {
    conn: ArcSwapOption<MultiplexedConnection>,
    connecting: AtomicBool,
    made: Notify,
    last_error: Mutex<String>,
}

/// What a node reports of itself, for `/readyz` and the metrics.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub addr: String,
    pub breaker: BreakerState,
    pub health: StoreHealth,
    /// Slots it serves in the current map (0: a replica, or no longer in the map).
    pub slots: usize,
}

impl Node {
    pub fn new(
        addr: String,
        client: Result<redis::Client, redis::RedisError>,
        scripts: Arc<Scripts>,
        breaker: (u32, Duration),
        store_timeout: Duration,
        trouble: Arc<Notify>,
        (batching, counts): ((usize, usize), Arc<BatchCounts>),
    ) -> Node {
        let batcher =
            Arc::new(Batcher::new(scripts.batch.get_hash(), batching, counts).keys_in_args());
        Node {
            batcher,
            addr,
            client: client.map_err(|e| e.to_string()),
            lanes: Default::default(),
            breaker: CircuitBreaker::new(breaker.0, breaker.1.as_millis() as u64),
            health: HealthCell::default(),
            scripts,
            store_timeout,
            trouble,
        }
    }

    pub fn status(&self, slots: usize) -> NodeStatus {
        NodeStatus {
            addr: self.addr.clone(),
            breaker: self.breaker.state(),
            health: self.health.get(),
            slots,
        }
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Runs `call` on this node through its breaker (`asking`: after `ASKING`, for the
    /// request in hand during a slot's migration). A call dropped before it answered (its
    /// store timeout) counts as this node's timeout.
    pub async fn call<T: FromRedisValue>(
        self: &Arc<Self>,
        call: &Call<'_>,
        lane: Lane,
        asking: bool,
    ) -> Result<T, Failure> {
        let attempt = self.attempt();
        if attempt == Attempt::Reject {
            self.health.set(StoreHealth::Unreachable);
            self.trouble.notify_one();
            return Err(StoreError::CircuitOpen.into());
        }
        let mut pending = Pending {
            node: self,
            attempt,
            done: false,
        };
        let result = match self.conn(lane).await {
            Ok(conn) => {
                let mut conn = (*conn).clone();
                let sent = if asking {
                    Box::pin(run_asking(call, &mut conn)).await
                } else {
                    run(call, &mut conn).await
                };
                if let Err(e) = &sent {
                    if lost_connection(e) {
                        self.lanes[lane as usize].conn.store(None);
                    }
                }
                sent.map_err(read_failure)
            }
            Err(e) => Err(Failure::Store(e)),
        };
        pending.done = true;
        let outcome = match &result {
            Err(Failure::Store(e)) => Err(e),
            _ => Ok(()),
        };
        self.finish(attempt, outcome);
        result
    }

    /// Sends a command that is not a script (`CLUSTER SLOTS`, `PING`) on the background
    /// lane, outside the breaker.
    pub async fn command<T: FromRedisValue>(
        self: &Arc<Self>,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let conn = self.conn(Lane::Background).await?;
        let sent = cmd.query_async(&mut (*conn).clone()).await;
        if let Err(e) = &sent {
            if lost_connection(e) {
                self.lanes[Lane::Background as usize].conn.store(None);
            }
        }
        Ok(sent?)
    }

    /// What the breaker says of a call now (the clock is read only when it is not closed).
    fn attempt(&self) -> Attempt {
        if self.breaker.state() == BreakerState::Closed {
            return Attempt::Call;
        }
        let (attempt, transition) = self.breaker.attempt(MonotonicClock.now_ms());
        self.log_transition(transition);
        attempt
    }

    fn finish(&self, attempt: Attempt, outcome: Result<(), &StoreError>) {
        let transition = match outcome {
            Err(e) if e.is_outage() => {
                self.health.set(StoreHealth::Unreachable);
                self.trouble.notify_one();
                self.breaker.on_failure(attempt, MonotonicClock.now_ms())
            }
            Err(_) => {
                self.health.set(StoreHealth::Refusing);
                self.breaker.on_success(attempt)
            }
            Ok(()) => {
                self.health.set(StoreHealth::Ok);
                self.breaker.on_success(attempt)
            }
        };
        self.log_transition(transition);
    }

    fn log_transition(&self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        match t.to {
            BreakerState::Open => log::warn!(
                "limiter store node {} circuit breaker opened ({} -> open): clients whose keys live there use their routes' failure mode; other nodes' clients are decided as usual",
                self.addr,
                t.from.as_str()
            ),
            BreakerState::HalfOpen => {
                log::info!("limiter store node {} circuit breaker half-open: probing it", self.addr)
            }
            BreakerState::Closed => {
                log::info!("limiter store node {} circuit breaker closed: it answers again", self.addr)
            }
        }
    }

    /// Makes this node's request connection (scripts loaded), for the store's warm-up.
    pub async fn warm_up(self: &Arc<Self>) -> Result<(), StoreError> {
        self.conn(Lane::Requests).await.map(drop)
    }

    /// The connection of `lane`, waiting for one being made (by a task of its own) if there
    /// is none.
    async fn conn(self: &Arc<Self>, lane: Lane) -> Result<Arc<MultiplexedConnection>, StoreError> {
        let slot = &self.lanes[lane as usize];
        if let Some(conn) = slot.conn.load_full() {
            return Ok(conn);
        }
        // Boxed: rare, and its state would widen every call's future.
        Box::pin(self.connect(lane)).await
    }

    async fn connect(
        self: &Arc<Self>,
        lane: Lane,
    ) -> Result<Arc<MultiplexedConnection>, StoreError> {
        let slot = &self.lanes[lane as usize];
        let made = slot.made.notified();
        tokio::pin!(made);
        made.as_mut().enable();
        if let Some(conn) = slot.conn.load_full() {
            return Ok(conn);
        }
        if !slot.connecting.swap(true, Ordering::AcqRel) {
            let node = Arc::clone(self);
            tokio::spawn(async move {
                // Made in the background, for the requests after (`making.rs`).
                let bound = connect_bound(node.store_timeout);
                let made = tokio::time::timeout(bound, node.make()).await;
                let slot = &node.lanes[lane as usize];
                match made {
                    Ok(Ok(conn)) => slot.conn.store(Some(Arc::new(conn))),
                    Ok(Err(e)) => *lock(&slot.last_error) = e.to_string(),
                    Err(_) => *lock(&slot.last_error) = format!("no connection within {bound:?}"),
                }
                slot.connecting.store(false, Ordering::Release);
                slot.made.notify_waiters();
            });
        }
        made.await;
        slot.conn.load_full().ok_or_else(|| {
            StoreError::Unavailable(format!(
                "cannot connect to Redis Cluster node {}: {}",
                self.addr,
                lock(&slot.last_error)
            ))
        })
    }

    async fn make(&self) -> Result<MultiplexedConnection, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connection_timeout(self.store_timeout)))
            .set_response_timeout(Some(LATE_REPLY));
        let client = match &self.client {
            Ok(client) => client,
            Err(e) => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "unusable",
                    e.clone(),
                )))
            }
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        load(&self.scripts, &mut conn, None).await?;
        Ok(conn)
    }
}

/// A call in flight on a node: dropped unfinished, it timed out there.
struct Pending<'a> {
    node: &'a Node,
    attempt: Attempt,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let timeout = StoreError::Timeout(Duration::ZERO);
            self.node.finish(self.attempt, Err(&timeout));
        }
    }
}

/// `ASKING` and the call, sent together on the connection (so nothing comes between them).
async fn run_asking<T: FromRedisValue>(
    call: &Call<'_>,
    conn: &mut MultiplexedConnection,
) -> Result<T, RedisError> {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING")
        .ignore()
        .add_command(call.cmd.clone().into_owned());
    let (value,): (T,) = pipe.query_async(conn).await?;
    Ok(value)
}

fn read_failure(e: RedisError) -> Failure {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            match e.redirect_node() {
                Some((to, _)) => Failure::Redirect {
                    ask: e.kind() == ErrorKind::Server(ServerErrorKind::Ask),
                    to: to.to_owned(),
                },
                None => Failure::Store(e.into()),
            }
        }
        ErrorKind::Server(ServerErrorKind::TryAgain) => Failure::TryAgain,
        _ => Failure::Store(e.into()),
    }
}

fn lock(m: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Node {
    /// How this node's batches are sent: through its breaker, within `timeout`.
    pub fn sender(self: &Arc<Self>, timeout: Duration) -> NodeSender {
        NodeSender {
            node: Arc::clone(self),
            timeout,
        }
    }
}

#[derive(Clone)]
pub struct NodeSender {
    node: Arc<Node>,
    timeout: Duration,
}

impl SendBatch for NodeSender {
    fn send(
        &self,
        cmd: &redis::Cmd,
        what: Sending,
    ) -> impl std::future::Future<Output = Sent> + Send {
        let node = Arc::clone(&self.node);
        let timeout = self.timeout;
        async move {
            let call = Call {
                script: node.scripts.sending(what),
                cmd: std::borrow::Cow::Borrowed(cmd),
            };
            let sent = patient(
                timeout,
                node.call::<redis::Value>(&call, Lane::Requests, false),
            );
            match sent.await {
                Ok(Ok(value)) => Sent::Replied(value),
                // A slot on the move: nothing was decided, the ordinary path follows it.
                Ok(Err(Failure::Redirect { .. } | Failure::TryAgain)) => Sent::NotDecided(false),
                Ok(Err(Failure::Store(StoreError::Refused(message)))) if what.is_batch() => {
                    Sent::NotDecided(unsupported(&message))
                }
                Ok(Err(Failure::Store(e))) => Sent::Failed(e),
                Err(_) => Sent::Failed(StoreError::Timeout(timeout)),
            }
        }
    }
}
