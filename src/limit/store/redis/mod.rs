//! The Redis store (`store.kind = "redis"`, `"redis_cluster"` or `"redis_sentinel"`): every
//! limit of a request is decided by one call of one Lua script (`lua/`), atomically, on
//! Redis's clock.
//!
//! - [`connection`]: one multiplexed connection per lane, made lazily, scripts loaded once
//!   and called by SHA (a `NOSCRIPT` reply after a Redis restart reloads them, [`wire`]); on
//!   Sentinel, the primary the sentinels name (asked again after a failover or a timeout).
//! - [`cluster`]: Redis Cluster node by node — the slot map, each node's connections and
//!   circuit breaker, redirects followed.
//! - `repair.rs`: the request connection made again as soon as it is known lost
//!   (`link_ping.rs`: its ping); `link_sender.rs`: a single node's or Sentinel primary's
//!   batches sent.
//! - `making.rs`: connections made in a task of their own, never cancelled by a request
//!   giving up at its timeout; `warmth.rs`: a new store's request connection made before
//!   requests need it (`/readyz` waits for it, within `store.startup_grace`).
//! - `patient.rs`: the bound of a call, which measures Redis, not this process.
//! - [`keys`]: key names, the client id as the Cluster hash tag.
//! - [`scripts`]: which Lua files make each script, the arguments of each call.
//! - `reply.rs`: the typed reading of each reply.
//! - `across.rs`, `groups.rs`: a request whose limits fall in several Cluster hash slots.
//!
//! Every call here is bounded by `store.timeout` of Redis's time (a renewal of a quota lease
//! is bounded by its caller, which may wait longer: see `lease/renewal.rs`); a decision's
//! wait for its turn on a busy connection is bounded apart (`batch.rs`).

mod across;
mod batch;
mod batch_call;
pub mod cluster;
pub mod config;
pub mod connection;
mod groups;
pub mod keys;
mod landing;
mod link_ping;
mod link_sender;
mod making;
pub mod native;
mod oversubscribed;
mod patient;
mod repair;
mod reply;
mod resend;
pub mod scripts;
mod sentinel;
pub mod settlements;
mod sources;
mod timeouts;
mod warmth;
pub mod wire;

pub use batch::BatchTotals;
pub use cluster::node::NodeStatus;
pub use config::{RedisAuth, RedisConfig, RedisTls, Topology};
pub use landing::{landing, Landed, Landing};
use scripts::Beat;
pub use scripts::LeaseCall;
pub use wire::LATE_REPLY;

use self::batch::Kind;
use self::connection::Link;
use self::groups::HashSlotGroups;
use self::reply::{parse_grant, parse_reply};
use self::scripts::Scripts;
use self::settlements::{Pending, SettlementTotals, Settlements, ONCE_HORIZON};
use self::wire::Lane;
use crate::limit::store::error::StoreError;
use crate::limit::store::held::Due;
use crate::limit::store::lease::Grant;
use crate::limit::store::request::CheckRequest;
use crate::limit::store::shared_breaker::StoreBreaker;
use crate::limit::{Policy, Verdict};
use futures::FutureExt;
use redis::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The most concurrency slots one renewal call carries.
pub const RENEW_BATCH: usize = 512;

pub struct RedisStore {
    config: RedisConfig,
    link: Arc<Link>,
    scripts: Arc<Scripts>,
    /// Charges, refunds and releases that failed, sent again (`settlements.rs`).
    settlements: Arc<Settlements>,
}

impl RedisStore {
    /// Parses the addresses; does not connect (that happens on the first call). A Cluster
    /// node's circuit breaker opens after the default number of outages.
    pub fn new(config: RedisConfig) -> Result<RedisStore, StoreError> {
        let defaults = crate::limit::store::failure::default_settings();
        RedisStore::with_breakers(config, &defaults, None)
    }

    /// As [`new`](Self::new), each Cluster node's breaker set as `failure` says; a single
    /// node's or Sentinel primary's batches report to `shared` (the store's breaker).
    pub fn with_breakers(
        config: RedisConfig,
        failure: &crate::limit::store::failure::FailureSettings,
        shared: Option<Arc<StoreBreaker>>,
    ) -> Result<RedisStore, StoreError> {
        let scripts = Arc::new(Scripts::new());
        let breaker = (failure.breaker_failures, failure.breaker_cooldown);
        let link = Link::new(&config, Arc::clone(&scripts), (breaker, shared))?;
        Ok(RedisStore {
            link,
            config,
            scripts,
            settlements: Arc::default(),
        })
    }

    /// Charges, refunds and releases sent again, or given up, so far.
    pub fn settlements(&self) -> SettlementTotals {
        self.settlements.totals()
    }

    /// Warms the store in the runtime this is run in (the one serving requests): returns once
    /// its request connection is made and its scripts loaded, or its startup grace is over
    /// (`warmth.rs`).
    pub fn warm(&self) -> impl Future<Output = ()> + Send + 'static {
        Arc::clone(&self.link).warm()
    }

    /// Between the start of the warm-up and its end (`/readyz`: not ready).
    pub fn warming(&self) -> bool {
        self.link.warming()
    }

    /// Redis Cluster: every node met, with its own breaker and health.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        self.link.nodes()
    }

    /// Redis Cluster: `MOVED` and `ASK` redirects followed so far.
    pub fn redirects(&self) -> (u64, u64) {
        self.link.redirects()
    }

    /// What the batch calls carried so far (decisions, and charges, refunds, releases and
    /// quota questions), and the members sent alone after a refused batch.
    pub fn batches(&self) -> BatchTotals {
        self.link.batches()
    }

    /// What decides now: "module" (turnstile's Redis module, found at the last connect) or
    /// "lua" (always on a Cluster: `native.rs`).
    pub fn decides_with(&self) -> &'static str {
        self.link.native.path()
    }

    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The request connection is lost (the breaker opened): repair it in the background.
    pub fn connection_lost(&self) {
        self.link.lost();
    }

    /// Whether the request connection answers (not marked lost, or repaired since).
    pub fn connection_up(&self) -> bool {
        self.link.is_up()
    }

    /// Times the request connection was repaired after being lost.
    pub fn connection_repairs(&self) -> u64 {
        self.link.repairs()
    }

    /// Sentinel: where-is-the-primary questions asked after timeouts, and how many found
    /// it moved.
    pub fn sentinel_questions(&self) -> Option<(u64, u64)> {
        self.link.sentinel_questions()
    }

    /// The SHA1 the decision script is called by.
    pub fn script_sha(&self) -> &str {
        self.scripts.check.get_hash()
    }

    /// The Redis key of one limit of one client on one route.
    pub fn key(&self, client: &str, route: &str, policy: &Policy) -> String {
        keys::key(&self.config.prefix, client, route, policy)
    }

    /// Decides one request, within the timeout; the verdict's `at_ms` is the time (Redis's
    /// clock) the script decided at.
    ///
    /// One script call on one Redis. On Redis Cluster a request whose policies belong to
    /// several partitions (a plan's keys are tagged by the client, a keyed limit's by its key)
    /// touches several hash slots: see [`check_across_hash_slots`](Self::check_across_hash_slots).
    pub async fn check(&self, req: &CheckRequest<'_>) -> Result<Verdict, StoreError> {
        self.decide(req, &AtomicBool::new(false), None).await
    }

    /// As [`check`](Self::check); `queued` is set while the decision waits for, or rides
    /// in, a batch (`batch.rs`) — a call whose outcome the batch reports to the store's
    /// breaker, so the store does not count it again. `landing`: held while a call may carry
    /// a check taking concurrency slots (its release, should the request give up, waits for
    /// it: `batch.rs`).
    pub async fn decide(
        &self,
        req: &CheckRequest<'_>,
        queued: &AtomicBool,
        landing: Option<Landing>,
    ) -> Result<Verdict, StoreError> {
        if !self.link.settled() {
            // Boxed: only while the store warms (its first requests).
            Box::pin(self.link.warmed()).await;
        }
        let several_hash_slots = matches!(self.config.topology, Topology::Cluster(_))
            && (1..req.policies.len()).any(|i| req.partition_of(i) != req.partition_of(0));
        if several_hash_slots {
            // Boxed: this rare path's state would otherwise widen every request's future; and
            // its type erased, so proving a decision `Send` need not walk every node's
            // connection machinery (deeper than the compiler's default recursion limit).
            let across: Pin<Box<dyn Future<Output = _> + Send + '_>> =
                Box::pin(self.check_across_hash_slots(req, landing));
            return self.bounded(across).await;
        }
        self.check_one_hash_slot(req, queued, landing).await
    }

    async fn check_one_hash_slot(
        &self,
        req: &CheckRequest<'_>,
        queued: &AtomicBool,
        landing: Option<Landing>,
    ) -> Result<Verdict, StoreError> {
        let invocation = self.scripts.check_call(&self.config.prefix, req);
        let member = (req.policies.len(), Kind::Decide);
        let bound = (landing, self.config.timeout);
        let reply = self.link.batched(invocation, member, bound, queued).await?;
        let Value::BulkString(reply) = reply else {
            return Err(StoreError::Protocol(format!(
                "expected a string from check.lua, got {reply:?}"
            )));
        };
        parse_reply(&reply, req.policies)
    }

    /// What `client` has left of each `(route, policy)`, read in one `usage.lua` call that
    /// writes nothing — batched with the decisions on the request connection (a quota
    /// member); a key several pairs name (a client-wide limit) is read once. Bounded by the
    /// store timeout. `queued`: as [`decide`](Self::decide)'s.
    pub async fn usage(
        &self,
        client: &str,
        asks: &[(Arc<str>, Policy)],
        queued: &AtomicBool,
    ) -> Result<Vec<crate::limit::Decision>, StoreError> {
        let keys: Vec<String> = asks
            .iter()
            .map(|(route, p)| self.key(client, route, p))
            .collect();
        let mut read: Vec<usize> = Vec::new();
        let slot_of: Vec<usize> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| match read.iter().position(|&j| keys[j] == *k) {
                Some(at) => at,
                None => {
                    read.push(i);
                    read.len() - 1
                }
            })
            .collect();
        let policies: Vec<Policy> = read.iter().map(|&i| asks[i].1.clone()).collect();
        let invocation = self
            .scripts
            .usage_call(read.iter().map(|&i| (keys[i].as_str(), &asks[i].1)));
        let member = (read.len(), Kind::Usage);
        let bound = (None, self.config.timeout);
        let reply = self.link.batched(invocation, member, bound, queued).await?;
        let Value::BulkString(reply) = reply else {
            return Err(StoreError::Protocol(format!(
                "expected a string from usage.lua, got {reply:?}"
            )));
        };
        let verdict = parse_reply(&reply, &policies)?;
        Ok(slot_of.iter().map(|&at| verdict.decisions[at]).collect())
    }

    /// Gives back what `req` (every policy of it) counted at `at` (`lua/refund.lua`): per
    /// slot on Redis Cluster, each call batched with the decisions on its connection.
    pub async fn refund(&self, req: &CheckRequest<'_>, at: u64) -> Result<(), StoreError> {
        let groups = match self.config.topology {
            Topology::Cluster(_) => HashSlotGroups::of(req),
            _ => Vec::new(),
        };
        let subs: Vec<CheckRequest<'_>> = if groups.is_empty() {
            vec![*req]
        } else {
            groups.iter().map(|g| g.request(req)).collect()
        };
        let once = settlements::once_id();
        for sub in &subs {
            let prefix = &self.config.prefix;
            if let Some(call) = self.scripts.refund_call(prefix, sub, |_| true, (at, &once)) {
                self.settle(call, Kind::Refund, ONCE_HORIZON).await?;
            }
        }
        Ok(())
    }

    /// Charges `deltas` (policy index, units) of `req`, admitted at `at`: per Cluster slot,
    /// one `charge.lua` call each, batched with the decisions on its connection, each
    /// attempt bounded by the store timeout, applied once however often it is sent
    /// (`settlements.rs`).
    pub async fn charge(
        &self,
        req: &CheckRequest<'_>,
        at: u64,
        deltas: &[(usize, i64)],
    ) -> Result<(), StoreError> {
        let groups = match self.config.topology {
            Topology::Cluster(_) => HashSlotGroups::of(req),
            _ => Vec::new(),
        };
        let once = settlements::once_id();
        let at = (at, once.as_str());
        if groups.is_empty() {
            return self.charge_one(req, at, deltas).await;
        }
        for group in &groups {
            let sub = group.request(req);
            // This slot's deltas, by its policies' indices.
            let mine: Vec<(usize, i64)> = deltas
                .iter()
                .filter_map(|(i, d)| {
                    sub.policies
                        .iter()
                        .position(|p| *p == req.policies[*i])
                        .filter(|&j| sub.partition_of(j) == req.partition_of(*i))
                        .map(|j| (j, *d))
                })
                .collect();
            self.charge_one(&sub, at, &mine).await?;
        }
        Ok(())
    }

    /// One `charge.lua` call of `req` (one slot), if any of `deltas` names a limit to charge.
    async fn charge_one(
        &self,
        req: &CheckRequest<'_>,
        at: (u64, &str),
        deltas: &[(usize, i64)],
    ) -> Result<(), StoreError> {
        match self
            .scripts
            .charge_call(&self.config.prefix, req, at, deltas)
        {
            Some(call) => self.settle(call, Kind::Charge, ONCE_HORIZON).await,
            None => Ok(()),
        }
    }

    /// A charge, a refund or a release: batched with the decisions on the request connection
    /// (`batch.rs`: under load it rides in their batches rather than costing Redis a call of
    /// its own), bounded by the store timeout like a decision. One that fails for anything
    /// but Redis refusing it is sent again until `horizon` has passed (`settlements.rs`):
    /// `Ok` once acknowledged or queued, `Err` when Redis refused it. Its reply (a count of
    /// keys changed) is not needed.
    async fn settle(
        &self,
        call: scripts::Call<'_>,
        kind: Kind,
        horizon: Duration,
    ) -> Result<(), StoreError> {
        let member = (call.keys(), kind);
        let again = call.cmd.clone().into_owned();
        let queued = AtomicBool::new(false);
        let bound = (None, self.config.timeout);
        match self.link.batched(call, member, bound, &queued).await {
            Ok(_) => Ok(()),
            Err(e @ StoreError::Refused(_)) => Err(e),
            Err(_) => {
                self.send_again(Pending::new(again, (kind, member.0), horizon));
                Ok(())
            }
        }
    }

    /// Queues `pending` to be sent again; starts the task sending the queue if none runs.
    fn send_again(&self, pending: Pending) {
        if !self.settlements.push(pending) {
            return;
        }
        let (link, queue) = (Arc::downgrade(&self.link), Arc::clone(&self.settlements));
        tokio::spawn(resend::resend(link, queue, self.config.timeout));
    }

    /// Frees the concurrency slots `slot_id` holds: batched with the decisions on the request
    /// connection, as charges and refunds are; sent again while the slot would live.
    pub async fn release(
        &self,
        client: &str,
        route: &str,
        policies: &[Policy],
        slot_id: &str,
    ) -> Result<(), StoreError> {
        let prefix = &self.config.prefix;
        let Some(invocation) = self
            .scripts
            .release_call(prefix, client, route, policies, slot_id)
        else {
            return Ok(());
        };
        self.settle(invocation, Kind::Release, self.config.slot_ttl)
            .await
    }

    /// Renews the concurrency slots `due` (those still held live their time to live from
    /// now): one call on a single Redis or Sentinel (standalone Redis has no hash slot rule),
    /// one per client on Redis Cluster (its keys' hash tag), at most [`RENEW_BATCH`] slots a
    /// call, each call bounded by `within`. Returns the entries of the calls that failed.
    pub async fn renew_slots(&self, due: &[Due], within: Duration) -> Vec<u64> {
        let mut groups: Vec<Vec<&Due>> = Vec::new();
        match self.config.topology {
            Topology::Cluster(_) => {
                let mut by_client: std::collections::HashMap<&str, Vec<&Due>> =
                    std::collections::HashMap::new();
                for d in due {
                    by_client.entry(&d.client).or_default().push(d);
                }
                for (_, slots) in by_client {
                    groups.extend(slots.chunks(RENEW_BATCH).map(<[&Due]>::to_vec));
                }
            }
            _ => groups.extend(due.chunks(RENEW_BATCH).map(|c| c.iter().collect())),
        }
        let calls = groups.iter().map(|group| async move {
            let keys: Vec<String> = group
                .iter()
                .map(|d| self.key(&d.client, &d.route, &d.policy))
                .collect();
            let slots = keys
                .iter()
                .zip(group.iter())
                .map(|(k, d)| (k.as_str(), d.slot_id.as_str(), d.ttl_ms));
            let Some(invocation) = self.scripts.renew_call(slots) else {
                return true;
            };
            let call = self.link.invoke::<u64>(&invocation, Lane::Background);
            match tokio::time::timeout(within, call).await {
                Ok(Ok(_)) => true,
                Ok(Err(e)) => {
                    log::debug!("renewing concurrency slots failed (tried again): {e}");
                    false
                }
                Err(_) => false,
            }
        });
        let done = futures::future::join_all(calls).await;
        groups
            .iter()
            .zip(done)
            .filter(|(_, ok)| !ok)
            .flat_map(|(group, _)| group.iter().map(|d| d.id))
            .collect()
    }

    /// Asks for a lease: `want` units (at least `need`) of every policy (fixed or sliding
    /// windows), after giving back a lapsed lease. One call, within the timeout.
    pub async fn lease(&self, call: LeaseCall<'_>) -> Result<Grant, StoreError> {
        self.bounded(self.lease_unbounded(call)).await
    }

    /// [`lease`](Self::lease) without the timeout: the caller bounds it (a renewal outlives
    /// a request that stops waiting for it).
    pub async fn lease_unbounded(&self, call: LeaseCall<'_>) -> Result<Grant, StoreError> {
        let invocation = self.scripts.lease_call(&self.config.prefix, &call);
        let reply: Vec<Value> = self.link.invoke(&invocation, Lane::Requests).await?;
        parse_grant(&reply, call.policies)
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
        let invocation = self.scripts.give_back_call(
            &self.config.prefix,
            client,
            route,
            policies,
            starts,
            units,
        );
        self.bounded(self.link.invoke(&invocation, Lane::Background))
            .await
    }

    /// Announces `instance` saying `info` of itself and publishing `limited` (or, with
    /// `leave`, withdraws it) and returns how many instances have announced themselves within
    /// `liveness`. Bounded by the store timeout.
    pub async fn heartbeat(
        &self,
        instance: &str,
        liveness: Duration,
        leave: bool,
        (info, limited): (&str, &str),
    ) -> Result<u64, StoreError> {
        let beat = if leave {
            Beat::Leave
        } else {
            Beat::Alive { info, limited }
        };
        let invocation = self
            .scripts
            .heartbeat_call(&self.config.prefix, instance, liveness, beat);
        self.bounded(self.link.invoke(&invocation, Lane::Background))
            .await
    }

    /// The instances that announced themselves within `liveness`: id, milliseconds since
    /// their last heartbeat, what they said of themselves and who they refused most lately
    /// ("" for gateways from before).
    pub async fn fleet(
        &self,
        liveness: Duration,
    ) -> Result<Vec<(String, u64, String, String)>, StoreError> {
        let invocation = self
            .scripts
            .heartbeat_call(&self.config.prefix, "", liveness, Beat::List);
        self.bounded(self.link.invoke(&invocation, Lane::Background))
            .await
    }

    /// One operation of the client registry (`registry.lua`), bounded by `bound` (the
    /// registry's own timeout: a whole registry is more than a decision).
    pub async fn registry(
        &self,
        op: &scripts::RegistryOp<'_>,
        bound: Duration,
    ) -> Result<redis::Value, StoreError> {
        let invocation = self.scripts.registry_call(&self.config.prefix, op);
        match tokio::time::timeout(bound, self.link.invoke(&invocation, Lane::Background)).await {
            Ok(result) => result,
            Err(_) => {
                self.link.timed_out();
                Err(StoreError::Timeout(bound))
            }
        }
    }

    /// `call` within the store timeout. A combinator, not an `async fn`, which would keep
    /// `call` twice in its state (see `Store::guarded`).
    fn bounded<'a, T: 'a>(
        &'a self,
        call: impl Future<Output = Result<T, StoreError>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        self.within(self.config.timeout, call)
    }

    /// `call` within `timeout` (`patient.rs`); at the timeout, the link is told (see
    /// `Link::timed_out`).
    fn within<'a, T: 'a>(
        &'a self,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        let link = &self.link;
        patient::patient(timeout, call).map(move |result| {
            result.unwrap_or_else(|_| {
                link.timed_out();
                Err(StoreError::Timeout(timeout))
            })
        })
    }
}
