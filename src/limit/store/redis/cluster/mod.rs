//! Redis Cluster, node by node: each call goes to the primary serving its keys' hash slot
//! (one script call's keys share the client's hash tag), through that node's own connection
//! and circuit breaker ([`node`]), so a frozen or dead shard fails only its own clients.
//!
//! - **The slot map** ([`slots`]) is read with `CLUSTER SLOTS` from every node known (seeds,
//!   primaries, replicas) at once, each asked within a bound; the map most of them report
//!   wins (a frozen node does not answer, a thawed former primary is outvoted). It is read
//!   again when a node stalls or fails (a failover promotes its replica: the next map names
//!   it, typically within a second of the promotion), after a `MOVED`, and every
//!   [`REFRESH_EVERY`] — never more often than every [`REFRESH_GAP`].
//! - **Redirects** are followed for the call in hand, once: `MOVED` to the node named (and the
//!   map read again in the background), `ASK` with `ASKING` to the node importing the slot.
//!   `TRYAGAIN` (a multi-key call while its slot's keys are half moved) is tried again after
//!   [`TRY_AGAIN_PAUSE`]. All within the caller's `store.timeout`.

pub mod node;
pub mod slots;

use self::node::{Failure, Node, NodeStatus};
use self::slots::{key_slot, parse_slots, SlotRange, SlotTable};
use crate::limit::store::error::StoreError;
use crate::limit::store::redis::batch::{BatchCounts, Kind};
use crate::limit::store::redis::config::RedisAuth;
use crate::limit::store::redis::landing::Landing;
use crate::limit::store::redis::scripts::{Call, Scripts};
use crate::limit::store::redis::wire::{with_auth, Lane};
use arc_swap::ArcSwapOption;
use redis::{ConnectionAddr, ConnectionInfo, FromRedisValue, IntoConnectionInfo, TlsCertificates};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// The least time between two readings of the slot map.
pub const REFRESH_GAP: Duration = Duration::from_millis(100);
/// The slot map is read at least this often.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// Pause before a call answered `TRYAGAIN` is sent again.
pub const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(5);

type Table = SlotTable<Arc<Node>>;

/// Redirects followed, by kind (`moved`, `ask`), for the metrics.
#[derive(Default)]
pub struct Redirects {
    pub moved: AtomicU64,
    pub ask: AtomicU64,
}

pub struct ClusterLink {
    /// A seed's connection settings (scheme, credentials): every node is reached like it.
    template: ConnectionInfo,
    certs: Option<TlsCertificates>,
    seeds: Vec<String>,
    /// Every node met so far, by address (seeds, primaries, replicas, redirect targets).
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    table: ArcSwapOption<Table>,
    /// Wakes the refresh task: a node stalled or failed, a `MOVED` came, or no map yet.
    wanted: Arc<Notify>,
    /// A map was read (or the attempt failed): wakes calls waiting for the first one.
    refreshed: Notify,
    last_refresh_error: Mutex<String>,
    started: AtomicBool,
    scripts: Arc<Scripts>,
    breaker: (u32, Duration),
    store_timeout: Duration,
    /// Each node's batches: their size cap, and the counts every node adds to.
    batching: ((usize, usize), Arc<BatchCounts>),
    pub redirects: Redirects,
    me: Weak<ClusterLink>,
}

impl ClusterLink {
    /// Reads the seeds' addresses; connects to nothing yet.
    pub fn new(
        seeds: &[String],
        auth: &RedisAuth,
        certs: Option<TlsCertificates>,
        scripts: Arc<Scripts>,
        breaker: (u32, Duration),
        store_timeout: Duration,
        batching: ((usize, usize), Arc<BatchCounts>),
    ) -> Result<Arc<ClusterLink>, StoreError> {
        let unusable = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        let mut infos = Vec::new();
        for seed in seeds {
            infos.push(seed.as_str().into_connection_info().map_err(unusable)?);
        }
        let first = infos
            .first()
            .ok_or_else(|| StoreError::Unavailable("a Redis Cluster needs a seed node".into()))?;
        let redis = with_auth(first.redis_settings().clone(), auth);
        let template = first.clone().set_redis_settings(redis);
        let seeds = infos
            .iter()
            .filter_map(|i| match i.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Some(slots::address(host, *port))
                }
                _ => None,
            })
            .collect();
        let link = Arc::new_cyclic(|me| ClusterLink {
            template,
            certs,
            seeds,
            nodes: Mutex::new(HashMap::new()),
            table: ArcSwapOption::empty(),
            wanted: Arc::new(Notify::new()),
            refreshed: Notify::new(),
            last_refresh_error: Mutex::new(String::new()),
            started: AtomicBool::new(false),
            scripts,
            breaker,
            store_timeout,
            batching,
            redirects: Redirects::default(),
            me: me.clone(),
        });
        // Every node is reached as the first seed is: a seed that cannot make a client (its
        // TLS material) is a configuration error now, not a connection error later.
        if let Some(seed) = link.seeds.first() {
            link.client_for(seed).map_err(unusable)?;
        }
        Ok(link)
    }

    /// Runs `call` on the primary serving its keys, following one redirect. Not bounded in
    /// time: the caller bounds it.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
    ) -> Result<T, StoreError> {
        let slot = call_slot(call);
        let node = match self.table.load().as_ref() {
            Some(table) => Arc::clone(table.node(slot)),
            // Boxed: once per process (and after a map could not be read).
            None => Box::pin(self.first_table()).await?.node(slot).clone(),
        };
        let mut tries_left = 3;
        loop {
            let failure = match node.call(call, lane, false).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            match failure {
                Failure::Store(e) => return Err(e),
                Failure::Redirect { ask, to } => {
                    return Box::pin(self.redirected(call, lane, ask, &to)).await
                }
                Failure::TryAgain if tries_left > 0 => {
                    tries_left -= 1;
                    tokio::time::sleep(TRY_AGAIN_PAUSE).await;
                }
                Failure::TryAgain => {
                    return Err(StoreError::Unavailable(format!(
                    "slot {slot} is being migrated and its keys are split between nodes (TRYAGAIN)"
                )))
                }
            }
        }
    }

    /// Runs `call` (a `check.lua`, `charge.lua`, `refund.lua` or `release.lua` call;
    /// `member`: the keys it names and which of them it is), batched on the node serving them
    /// with the calls that arrive while another is in flight there (`batch.rs`); a batch
    /// refused for a slot on the move sends its members the ordinary way, one by one.
    /// (`landing` and `queued` as on a single node; the node's breaker counts calls itself.)
    pub async fn batched(
        &self,
        call: Call<'_>,
        member: (usize, Kind),
        (landing, bound): (Option<Landing>, std::time::Duration),
        queued: &AtomicBool,
    ) -> Result<redis::Value, StoreError> {
        let slot = call_slot(&call);
        let node = match self.table.load().as_ref() {
            Some(table) => Arc::clone(table.node(slot)),
            None => Box::pin(self.first_table()).await?.node(slot).clone(),
        };
        let sender = node.sender(self.store_timeout);
        let script = call.script;
        let alone = |cmd| Call {
            script,
            cmd: std::borrow::Cow::Owned(cmd),
        };
        let entered = node
            .batcher
            .enter(call.cmd.into_owned(), member, landing, &sender);
        entered
            .answer(queued, bound, |cmd| async move {
                self.invoke(&alone(cmd), Lane::Requests).await
            })
            .await
    }

    /// Warms the request lane (`warmth.rs`): the slot map read, and the request connection of
    /// every primary it names made, scripts loaded. Bounded by the caller.
    pub async fn warm_up(&self) -> Result<(), StoreError> {
        let table = self.first_table().await?;
        let mut primaries: Vec<&Arc<Node>> = Vec::new();
        for node in &table.nodes {
            if !primaries.iter().any(|p| Arc::ptr_eq(p, node)) {
                primaries.push(node);
            }
        }
        let made = futures::future::join_all(primaries.iter().map(|n| n.warm_up())).await;
        made.into_iter().collect()
    }

    /// The call in hand sent where a `MOVED` or `ASK` said, once.
    async fn redirected<T: FromRedisValue>(
        &self,
        call: &Call<'_>,
        lane: Lane,
        ask: bool,
        to: &str,
    ) -> Result<T, StoreError> {
        if ask {
            self.redirects.ask.fetch_add(1, Ordering::Relaxed);
        } else {
            self.redirects.moved.fetch_add(1, Ordering::Relaxed);
            self.wanted.notify_one();
        }
        let target = self.node(to);
        match target.call(call, lane, ask).await {
            Ok(value) => Ok(value),
            Err(Failure::Store(e)) => Err(e),
            Err(Failure::Redirect { to: again, .. }) => Err(StoreError::Unavailable(format!(
                "redirected twice (to {to}, then to {again}) while the cluster's slots move"
            ))),
            Err(Failure::TryAgain) => Err(StoreError::Unavailable(
                "the slot is being migrated and its keys are split between nodes (TRYAGAIN)".into(),
            )),
        }
    }

    /// The node at `addr`, made (not connected) when first met.
    fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = lock(&self.nodes);
        if let Some(node) = nodes.get(addr) {
            return Arc::clone(node);
        }
        let node = Arc::new(Node::new(
            addr.to_owned(),
            self.client_for(addr),
            Arc::clone(&self.scripts),
            self.breaker,
            self.store_timeout,
            Arc::clone(&self.wanted),
            (self.batching.0, Arc::clone(&self.batching.1)),
        ));
        nodes.insert(addr.to_owned(), Arc::clone(&node));
        node
    }

    /// A client for `addr`, reached as the seed is (scheme, TLS, credentials).
    fn client_for(&self, addr: &str) -> Result<redis::Client, redis::RedisError> {
        let (host, port) = slots::split_address(addr);
        let at = match self.template.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let info = self.template.clone().set_addr(at);
        match &self.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
            None => redis::Client::open(info),
        }
    }

    /// Waits for the first slot map (the refresh task reads it).
    async fn first_table(&self) -> Result<Arc<Table>, StoreError> {
        let refreshed = self.refreshed.notified();
        tokio::pin!(refreshed);
        refreshed.as_mut().enable();
        if let Some(table) = self.table.load_full() {
            return Ok(table);
        }
        self.start();
        self.wanted.notify_one();
        refreshed.await;
        self.table.load_full().ok_or_else(|| {
            StoreError::Unavailable(format!(
                "cannot read the Redis Cluster's slot map: {}",
                lock(&self.last_refresh_error)
            ))
        })
    }

    /// Starts the refresh task (once, in the runtime of the first call).
    fn start(&self) {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(refresh_loop(self.me.clone(), Arc::clone(&self.wanted)));
        }
    }

    /// Reads the slot map from every known node at once and keeps the one most report.
    async fn refresh(&self) {
        let mut askable: Vec<String> = self.seeds.clone();
        for addr in lock(&self.nodes).keys() {
            if !askable.contains(addr) {
                askable.push(addr.clone());
            }
        }
        let bound = self
            .store_timeout
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        let asks = askable.iter().map(|addr| {
            let node = self.node(addr);
            async move {
                let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
                let reply = tokio::time::timeout(bound, node.command::<redis::Value>(&cmd)).await;
                match reply {
                    Ok(Ok(value)) => parse_slots(&value, &node.addr)
                        .map(|r| (r, slots::nodes_named(&value, &node.addr)))
                        .map_err(|e| format!("{}: {e}", node.addr)),
                    Ok(Err(e)) => Err(format!("{}: {e}", node.addr)),
                    Err(_) => Err(format!("{}: no answer within {bound:?}", node.addr)),
                }
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut errors = Vec::new();
        let mut votes: Vec<(Vec<SlotRange>, usize)> = Vec::new();
        for answer in answers {
            match answer {
                Ok((ranges, replicas)) => {
                    for addr in replicas {
                        self.node(&addr);
                    }
                    match votes.iter_mut().find(|(r, _)| *r == ranges) {
                        Some((_, n)) => *n += 1,
                        None => votes.push((ranges, 1)),
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        match votes.into_iter().max_by_key(|(_, n)| *n) {
            Some((ranges, _)) => self.install(&ranges),
            None => *lock(&self.last_refresh_error) = errors.join("; "),
        }
        self.refreshed.notify_waiters();
    }

    /// Makes `ranges` the map calls follow; logs which slots changed primary.
    fn install(&self, ranges: &[SlotRange]) {
        let old = self.table.load_full();
        if let Some(old) = &old {
            let moved: Vec<String> = ranges
                .iter()
                .filter(|r| old.node(r.first).addr != r.primary)
                .map(|r| format!("{}-{} to {}", r.first, r.last, r.primary))
                .collect();
            if moved.is_empty() {
                return;
            }
            log::info!("Redis Cluster slot map changed: slots {}", moved.join(", "));
        }
        let table = SlotTable::build(ranges, |addr| self.node(addr));
        self.table.store(Some(Arc::new(table)));
    }

    /// Every node met, with its breaker, health and the slots it serves now.
    pub fn status(&self) -> Vec<NodeStatus> {
        let table = self.table.load_full();
        let counts = table.as_ref().map(|t| t.slot_counts()).unwrap_or_default();
        let mut out: Vec<NodeStatus> = lock(&self.nodes)
            .values()
            .map(|node| {
                let slots = table
                    .as_ref()
                    .and_then(|t| t.nodes.iter().position(|n| Arc::ptr_eq(n, node)))
                    .map_or(0, |at| counts[at]);
                node.status(slots)
            })
            .collect();
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        out
    }

    /// Whether some node in the map answers a PING (bounded by the caller).
    pub async fn ping(&self) -> bool {
        let Ok(table) = self.first_table().await else {
            return false;
        };
        let node = Arc::clone(table.node(0));
        node.command::<()>(&redis::cmd("PING")).await.is_ok()
    }
}

/// Reads the slot map whenever asked (and every [`REFRESH_EVERY`]), at most every
/// [`REFRESH_GAP`], for as long as its owner lives.
async fn refresh_loop(owner: Weak<ClusterLink>, wanted: Arc<Notify>) {
    loop {
        let Some(link) = owner.upgrade() else { return };
        link.refresh().await;
        drop(link);
        tokio::time::sleep(REFRESH_GAP).await;
        let _ = tokio::time::timeout(REFRESH_EVERY, wanted.notified()).await;
    }
}

/// The hash slot of a script call: that of its first key (`EVALSHA sha numkeys key ...`);
/// every key of one call shares it.
fn call_slot(call: &Call<'_>) -> u16 {
    match call.cmd.args_iter().nth(3) {
        Some(redis::Arg::Simple(key)) => key_slot(key),
        _ => 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
