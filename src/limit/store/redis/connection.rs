//! Connections to Redis: made lazily, inside the runtime that uses them (so a Redis that is
//! down at start does not stop the gateway), one multiplexed connection per lane, every
//! script loaded when a connection is made. The request lane's connection is repaired as
//! soon as it is known lost (`repair.rs`); single-node and Sentinel connections speak RESP3
//! unless the URL says `protocol=resp2`, so that a dropped connection reports itself. A
//! Cluster is handed to `cluster/`, node by node. Beside it: `link_sender.rs` (how its
//! batches are sent), `link_ping.rs` (the repair task's ping), `warmth.rs` (its warm-up).

use crate::limit::store::error::StoreError;
use crate::limit::store::redis::batch::{BatchCounts, BatchTotals, Batcher, Kind};
use crate::limit::store::redis::cluster::node::NodeStatus;
use crate::limit::store::redis::cluster::ClusterLink;
use crate::limit::store::redis::config::{RedisConfig, Topology};
use crate::limit::store::redis::landing::Landing;
use crate::limit::store::redis::making::{connect_bound, connection_timeout, Making};
use crate::limit::store::redis::native::Native;
use crate::limit::store::redis::repair::{repair_loop, LaneWatch, OnDisconnect};
use crate::limit::store::redis::scripts::{Call, Scripts};
use crate::limit::store::redis::sentinel::{self, SentinelLanes, Sentinels};
use crate::limit::store::redis::timeouts::{TimeoutRun, Verdict};
use crate::limit::store::redis::warmth::{warm_up, WarmUp, Warmth};
use crate::limit::store::redis::wire::{
    load, lost_connection, names_protocol, run_on, tls_certificates, with_auth, Lane, LATE_REPLY,
};
use crate::limit::store::shared_breaker::StoreBreaker;
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo, RedisError,
};
use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::OnceCell;

// One per process, created once and never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Nodes {
    Single {
        client: redis::Client,
        lanes: Lanes<ConnectionManager>,
    },
    /// Node by node, each with its own breaker (`cluster/`).
    Cluster(Arc<ClusterLink>),
    /// The primary the sentinels name; asked again when its connection fails or it turns
    /// out to be a replica (after a failover).
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        lanes: SentinelLanes,
    },
}

pub(super) struct Lanes<C> {
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
    pub(super) nodes: Nodes,
    /// The store timeout: a batch call's bound (and, through `making.rs`, what bounds making
    /// a connection).
    pub(super) store_timeout: Duration,
    /// Each lane's connection being made in a task of its own (single node, Sentinel).
    making: [Making; 2],
    pub(super) scripts: Arc<Scripts>,
    /// Whether this Redis decides with the module (single node, Sentinel: `native.rs`).
    pub(super) native: Native,
    /// Whether the request lane's connection is known lost (and being repaired).
    pub(super) watch: Arc<LaneWatch>,
    /// RESP3: the connections report a drop (single node, Sentinel).
    resp3: bool,
    /// The request lane's decisions (single node, Sentinel; a Cluster's are node by node).
    batcher: Arc<Batcher>,
    counts: Arc<BatchCounts>,
    /// The store's breaker (single node, Sentinel): each batch call reports to it once.
    pub(super) breaker: Option<Arc<StoreBreaker>>,
    /// Whether the request connection was made before requests needed it (`warmth.rs`).
    warmth: Warmth,
    /// Sentinel: calls that timed out since the last answered one.
    timeouts: TimeoutRun,
    pub(super) me: Weak<Link>,
}

impl Link {
    /// Parses the addresses and reads the TLS files; does not connect (the first call does).
    /// `breakers`: a Cluster node's breaker settings; the store's breaker, to which a single
    /// node's or Sentinel primary's batches report.
    pub fn new(
        config: &RedisConfig,
        scripts: Arc<Scripts>,
        (breaker, shared): ((u32, Duration), Option<Arc<StoreBreaker>>),
    ) -> Result<Arc<Link>, StoreError> {
        let store_timeout = config.timeout;
        let counts = Arc::new(BatchCounts::default());
        let batching = (
            (config.batch_max, config.batch_in_flight),
            Arc::clone(&counts),
        );
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
            Topology::Cluster(seeds) => Nodes::Cluster(ClusterLink::new(
                seeds,
                &config.auth,
                certs,
                Arc::clone(&scripts),
                breaker,
                store_timeout,
                batching.clone(),
            )?),
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
        let batcher = Arc::new(Batcher::new(
            scripts.batch.get_hash(),
            batching.0,
            batching.1,
        ));
        Ok(Arc::new_cyclic(|me| Link {
            nodes,
            store_timeout,
            scripts,
            native: Native::new(config.decide_with),
            watch: Arc::new(LaneWatch::default()),
            resp3,
            making: Default::default(),
            batcher,
            counts,
            breaker: shared,
            warmth: Warmth::new(config.startup_grace),
            timeouts: TimeoutRun::default(),
            me: me.clone(),
        }))
    }

    /// Warm, or the grace is over: decisions need not wait (one atomic load).
    pub fn settled(&self) -> bool {
        self.warmth.settled()
    }

    /// Between the start of the warm-up and its end: `/readyz` says not ready.
    pub fn warming(&self) -> bool {
        self.warmth.warming()
    }

    /// Warms the store (`warmth.rs`) in the runtime it is called from — the one serving
    /// requests, whose connection this makes — unless a warm-up began already; returns once
    /// it is warm, or the grace is over.
    pub async fn warm(self: Arc<Link>) {
        if self.warmth.begin() {
            warm_up(&*self).await;
        } else {
            self.warmth.done().await;
        }
    }

    /// For a decision that found the store not warm yet: starts the warm-up if nobody did
    /// (a store used before the gateway warmed it), then waits for its next outcome, at
    /// most until the grace ends.
    pub async fn warmed(&self) {
        if self.warmth.begin() {
            if let Some(me) = self.me.upgrade() {
                tokio::spawn(async move { warm_up(&*me).await });
            }
        }
        self.warmth.next_outcome().await;
    }

    /// Makes the request lane's connection (every primary's, on a Cluster), scripts loaded.
    async fn request_lane(&self) -> Result<(), StoreError> {
        if self.watch.start() {
            tokio::spawn(repair_loop(self.me.clone(), Arc::clone(&self.watch)));
        }
        match &self.nodes {
            Nodes::Single { lanes, .. } => self.single(lanes, Lane::Requests).await.map(drop)?,
            Nodes::Sentinel { lanes, .. } => {
                self.sentinel(lanes, Lane::Requests).await.map(drop)?
            }
            Nodes::Cluster(cluster) => cluster.warm_up().await?,
        }
        Ok(())
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

    /// Sentinel: the questions asked after timeouts, and how many found the primary moved
    /// (`sentinel.rs`).
    pub fn sentinel_questions(&self) -> Option<(u64, u64)> {
        match &self.nodes {
            Nodes::Sentinel { lanes, .. } => Some(lanes.questions()),
            _ => None,
        }
    }

    /// A call on this lane timed out. On Sentinel the primary may be frozen while the
    /// sentinels have promoted a replica: as `timeouts.rs` says, they are asked where the
    /// primary is (a second timeout in a row of a running process), or the connection is
    /// left and the next call asks them (nothing answered for a second).
    pub fn timed_out(&self) {
        if let Nodes::Sentinel { .. } = &self.nodes {
            match self.timeouts.timed_out() {
                Verdict::Stay => {}
                Verdict::Ask => {
                    if let Some(me) = self.me.upgrade() {
                        sentinel::ask(me);
                    }
                }
                Verdict::Leave => self.leave(),
            }
        }
    }

    /// A call on this lane was answered: the timeouts in a row start again from none.
    pub(super) fn answered(&self) {
        self.timeouts.answered();
    }

    /// Runs a script call on `lane`'s connection, making it first if needed (then
    /// loading every script, so steady state is one EVALSHA per call). Not bounded in time:
    /// callers bound it. If Redis is unreachable, the next call tries again.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
    ) -> Result<T, StoreError> {
        self.invoke_as(call, lane, true).await
    }

    /// As `invoke`; `native`: whether the Redis module may run the call where the node has
    /// it (`native.rs`), or only its script.
    pub async fn invoke_as<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
        native: bool,
    ) -> Result<T, StoreError> {
        if let Nodes::Cluster(cluster) = &self.nodes {
            // Each node's connections, breaker and repair are its own.
            return cluster.invoke(call, lane).await;
        }
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
        let result = self.invoke_now(call, lane, native).await;
        if let (Err(e), Lane::Requests) = (&result, lane) {
            if lost_connection(e) {
                self.watch.lost();
            }
        }
        Ok(result?)
    }

    /// Runs `call` — a `check.lua`, `charge.lua`, `refund.lua` or `release.lua` call;
    /// `member`: the keys it names and which of them it is — batched with the calls that
    /// arrive while another is in flight on the request lane (`batch.rs`), within `bound`
    /// of Redis's time (a wait for a turn on the connection is the gateway's own, bounded
    /// apart: `batch.rs`). `landing`: a check taking concurrency slots holds it while a
    /// call may carry it. `queued` is set while the call waits for, or rides in, a call made
    /// for the queue (which reports to the store's breaker itself).
    pub async fn batched(
        &self,
        call: Call<'_>,
        member: (usize, Kind),
        (landing, bound): (Option<Landing>, Duration),
        queued: &AtomicBool,
    ) -> Result<redis::Value, StoreError> {
        if let Nodes::Cluster(cluster) = &self.nodes {
            return cluster
                .batched(call, member, (landing, bound), queued)
                .await;
        }
        let sender = self.sender();
        let script = call.script;
        let alone = |cmd| Call {
            script,
            cmd: Cow::Owned(cmd),
        };
        let entered = self
            .batcher
            .enter(call.cmd.into_owned(), member, landing, &sender);
        let answer = entered
            .answer(queued, bound, |cmd| async move {
                self.invoke(&alone(cmd), Lane::Requests).await
            })
            .await;
        match &answer {
            Err(StoreError::Timeout(_)) => self.timed_out(),
            Ok(_) => self.answered(),
            Err(_) => {}
        }
        answer
    }

    /// What the batches carried so far.
    pub fn batches(&self) -> BatchTotals {
        self.counts.totals()
    }

    async fn invoke_now<T: redis::FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
        native: bool,
    ) -> Result<T, RedisError> {
        let native = (native, &self.native, &*self.scripts);
        Ok(match &self.nodes {
            Nodes::Single { lanes, .. } => {
                let conn = self.single(lanes, lane).await?;
                run_on(call, &mut conn.clone(), native).await?
            }
            // Sent by `invoke`, node by node.
            Nodes::Cluster(_) => {
                return Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "a Cluster call goes through its node",
                )))
            }
            Nodes::Sentinel { lanes, .. } => {
                let slot = lanes.pick(lane);
                let conn = self.sentinel(lanes, lane).await?;
                let result = run_on(call, &mut (*conn).clone(), native).await;
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
    pub(super) async fn single<'a>(
        &self,
        lanes: &'a Lanes<ConnectionManager>,
        lane: Lane,
    ) -> Result<&'a ConnectionManager, RedisError> {
        if let Some(conn) = lanes.pick(lane).get() {
            return Ok(conn);
        }
        // Boxed: rare, and its state would widen every call's future.
        Box::pin(self.made(lane)).await;
        lanes.pick(lane).get().ok_or_else(|| self.unmade(lane))
    }

    /// The Sentinel primary's connection for `lane`, made (with every script loaded) if
    /// needed.
    pub(super) async fn sentinel(
        &self,
        lanes: &SentinelLanes,
        lane: Lane,
    ) -> Result<Arc<MultiplexedConnection>, RedisError> {
        if let Some(conn) = lanes.pick(lane).load_full() {
            return Ok(conn);
        }
        Box::pin(self.made(lane)).await;
        lanes
            .pick(lane)
            .load_full()
            .ok_or_else(|| self.unmade(lane))
    }

    /// Waits for `lane`'s connection to be made by a task of its own (`making.rs`), starting
    /// one if none is under way.
    async fn made(&self, lane: Lane) {
        let ready = || match &self.nodes {
            Nodes::Single { lanes, .. } => lanes.pick(lane).get().is_some(),
            Nodes::Sentinel { lanes, .. } => lanes.pick(lane).load().is_some(),
            Nodes::Cluster(_) => true,
        };
        let start = || {
            let Some(me) = self.me.upgrade() else {
                let replaced = (redis::ErrorKind::Io, "the store was replaced");
                self.making[lane as usize].ended(Some(replaced.into()));
                return;
            };
            tokio::spawn(async move {
                // While the store warms, an attempt may take what is left of the grace (on a
                // busy machine a connection and its scripts take long): cut and begun again,
                // it would start from nothing each time.
                let bound = match me.warmth.warming() {
                    true => connect_bound(me.store_timeout).max(me.warmth.left()),
                    false => connect_bound(me.store_timeout),
                };
                let error = match tokio::time::timeout(bound, me.connect(lane)).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(_) => Some(RedisError::from((
                        redis::ErrorKind::Io,
                        "cannot connect to Redis",
                        format!("no connection within {bound:?}"),
                    ))),
                };
                me.making[lane as usize].ended(error);
            });
        };
        self.making[lane as usize].wait(ready, start).await;
    }

    /// Makes `lane`'s connection and loads every script (in the task `made` starts).
    async fn connect(&self, lane: Lane) -> Result<(), RedisError> {
        match &self.nodes {
            Nodes::Single { client, lanes } => {
                let make = || async {
                    let mut config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(connection_timeout(self.store_timeout)))
                        .set_response_timeout(Some(LATE_REPLY))
                        // One attempt per (re)connection: a retry after a backoff would
                        // turn a fast, telling failure (refused, wrong password) into a
                        // timeout. The next call connects again.
                        .set_number_of_retries(0)
                        .set_max_delay(Duration::from_secs(1));
                    if self.resp3 && matches!(lane, Lane::Requests) {
                        config = config.set_push_sender(OnDisconnect(self.me.clone()));
                    }
                    let mut conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                    load(&self.scripts, &mut conn, Some(&self.native)).await?;
                    Ok::<_, RedisError>(conn)
                };
                lanes.pick(lane).get_or_try_init(make).await.map(drop)
            }
            Nodes::Sentinel { client, lanes } => {
                let mut config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connection_timeout(self.store_timeout)))
                    .set_response_timeout(Some(LATE_REPLY));
                if matches!(lane, Lane::Requests) {
                    config = config.set_push_sender(OnDisconnect(self.me.clone()));
                }
                lanes
                    .connect(client, (lane, config), (&self.scripts, &self.native))
                    .await
                    .map(drop)
            }
            Nodes::Cluster(_) => Ok(()),
        }
    }

    /// Why `lane` has no connection after an attempt ended: the attempt's own error.
    fn unmade(&self, lane: Lane) -> RedisError {
        self.making[lane as usize]
            .last_error()
            .unwrap_or_else(|| (redis::ErrorKind::Io, "cannot connect to Redis").into())
    }
}

impl Sentinels for Link {
    fn sentinels(&self) -> Option<(&tokio::sync::Mutex<SentinelClient>, &SentinelLanes)> {
        match &self.nodes {
            Nodes::Sentinel { client, lanes } => Some((client, lanes)),
            _ => None,
        }
    }

    fn question_bound(&self) -> Duration {
        connect_bound(self.store_timeout)
    }

    fn leave(&self) {
        if let Nodes::Sentinel { lanes, .. } = &self.nodes {
            lanes.requests.store(None);
            self.watch.lost();
        }
    }
}

impl WarmUp for Link {
    fn warmth(&self) -> &Warmth {
        &self.warmth
    }

    fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    fn attempt(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + '_ {
        self.request_lane()
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

impl Link {
    /// Redis Cluster: every node met, with its breaker and health (empty otherwise).
    pub fn nodes(&self) -> Vec<NodeStatus> {
        match &self.nodes {
            Nodes::Cluster(cluster) => cluster.status(),
            _ => Vec::new(),
        }
    }

    /// Redis Cluster: redirects followed so far (`MOVED`, `ASK`).
    pub fn redirects(&self) -> (u64, u64) {
        match &self.nodes {
            Nodes::Cluster(c) => (
                c.redirects.moved.load(std::sync::atomic::Ordering::Relaxed),
                c.redirects.ask.load(std::sync::atomic::Ordering::Relaxed),
            ),
            _ => (0, 0),
        }
    }
}
