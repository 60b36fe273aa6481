//! Where per-client limiter state lives, chosen by `[store] kind`, and what happens when that
//! place fails (DESIGN.md §7).
//!
//! - `memory`: in this process; cannot fail.
//! - `redis` / `redis_cluster`: shared by every instance. Calls go through a
//!   [`CircuitBreaker`]: after consecutive outages it opens and calls fail at once with
//!   [`StoreError::CircuitOpen`] — no network, no waiting — until a single probe after the
//!   cool-down succeeds. Every call is bounded by `store.timeout`.
//! - The **local fallback** ([`Store::check_fallback`]) is an in-process store that decides
//!   with each limit divided by the number of live gateway instances, learned from heartbeats
//!   in Redis ([`Store::heartbeat`]) while it was up, or `expected_instances` when never known.
//!
//! The route's failure mode (fail open / closed / local) is applied by the request chain; the
//! store only reports the error, counts it and logs it (at most once per
//! [`DEGRADED_LOG_EVERY`]).

pub mod breaker;
pub mod lease;
pub mod memory;
pub mod redis;

use self::breaker::{BreakerState, CircuitBreaker, Permit, Transition};
use self::lease::{LeaseKey, LeaseTable, Take};
use self::memory::MemoryStore;
use self::redis::{LeaseCall, RedisConfig, RedisStore, StoreError, Topology};
use crate::clock::{Clock, MonotonicClock};
use crate::limit::{Policy, Verdict};
use crate::ops::metrics::Metrics;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to do when the store cannot decide, once the failure is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureSettings {
    /// Consecutive outages that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe call.
    pub breaker_cooldown: Duration,
    /// The instance count used by the local fallback before any heartbeat was seen.
    pub expected_instances: u64,
    /// How often instances announce themselves in Redis.
    pub heartbeat_interval: Duration,
}

/// Degraded decisions are logged at most this often (with how many happened meanwhile).
pub const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

// One per process (behind an Arc), never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Memory(MemoryStore<MonotonicClock>),
    Redis(Arc<RedisStore>),
}

pub struct Store {
    backend: Backend,
    failure: FailureSettings,
    breaker: CircuitBreaker,
    fallback: MemoryStore<MonotonicClock>,
    /// Quota leases held by this instance (Redis stores, plans with `lease`).
    leases: Arc<LeaseTable>,
    /// Live instances from the last successful heartbeat; 0 = never known.
    live_instances: AtomicU64,
    instance_id: String,
    metrics: Arc<Metrics>,
    /// `turnstile_store_calls_total` by result, resolved once: ok, then each error kind.
    results: [prometheus::IntCounter; 5],
    last_degraded_log_ms: AtomicU64,
    degraded_since_log: AtomicU64,
    /// How the latest store call (decision or heartbeat) went: a [`StoreHealth`].
    health: AtomicU8,
}

/// How the latest call to the store went, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHealth {
    /// No call yet.
    Unknown = 0,
    /// It answered.
    Ok = 1,
    /// It answered with an error: a wrong password, out of memory, a read-only replica...
    Refusing = 2,
    /// No answer: timed out, unreachable, or not called because the breaker is open.
    Unreachable = 3,
}

impl StoreHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreHealth::Unknown => "unknown",
            StoreHealth::Ok => "ok",
            StoreHealth::Refusing => "refusing",
            StoreHealth::Unreachable => "unreachable",
        }
    }

    fn of<T>(result: &Result<T, StoreError>) -> StoreHealth {
        match result {
            Ok(_) => StoreHealth::Ok,
            Err(StoreError::Refused(_) | StoreError::Protocol(_) | StoreError::Auth(_)) => {
                StoreHealth::Refusing
            }
            Err(_) => StoreHealth::Unreachable,
        }
    }
}

/// One request's question to the store.
pub struct CheckRequest<'a> {
    pub client: &'a Arc<str>,
    pub route: &'a Arc<str>,
    pub policies: &'a [Policy],
    /// `shadow[i]`: policy `i` decides and counts but never blocks (missing = enforced).
    pub shadow: &'a [bool],
    pub cost: u64,
    /// Names the request's concurrency slots, if it takes any.
    pub lease_id: &'a str,
    /// Replaces the store's clock: for deterministic tests only.
    pub now_ms: Option<u64>,
    /// Decide from a quota lease of at most this many units (Redis stores; every policy a
    /// fixed or sliding window, none shadow). `None`: one store call per request.
    pub lease: Option<u64>,
}

/// How long a renewal whose request gave up (the store timed out) may still be answered: its
/// grant, when it comes, becomes this instance's lease instead of units the store counted but
/// nobody can spend. Past this, the renewal is dropped (see README: a grant lost with it).
pub const LATE_RENEWAL: Duration = redis::LATE_REPLY;

/// A lease renewal in flight: it runs as a task of its own, so that it outlives a request
/// that stops waiting for it.
struct Renewal {
    redis: Arc<RedisStore>,
    leases: Arc<LeaseTable>,
    key: LeaseKey,
    policies: Vec<Policy>,
    ask: lease::Ask,
    now_ms: Option<u64>,
}

impl Renewal {
    /// Sends the renewal and waits at most `timeout` for its answer. On time: the answer
    /// (with the ask, to settle). Late: the request gets `Timeout` and gives its held units
    /// back; the task settles the grant when it arrives ([`LeaseTable::settle_late`]).
    async fn send(self, timeout: Duration) -> Result<(lease::Ask, lease::Grant), StoreError> {
        let (answer, mut wait) = tokio::sync::oneshot::channel();
        let (leases, key, ask) = (Arc::clone(&self.leases), self.key.clone(), self.ask.clone());
        tokio::spawn(self.run(answer));
        let outcome = match tokio::time::timeout(timeout, &mut wait).await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(_)) => None,
            Err(_) => {
                // Whatever arrived before this close is ours; anything later is the task's.
                wait.close();
                wait.try_recv().ok()
            }
        };
        match outcome {
            Some(Ok(grant)) => Ok((ask, grant)),
            Some(Err(e)) => {
                // Failed (not late): nothing was granted.
                leases.abandon(&key, &ask, MonotonicClock.now_ms());
                Err(e)
            }
            None => {
                leases.give_up(&key, &ask, MonotonicClock.now_ms());
                Err(StoreError::Timeout(timeout))
            }
        }
    }

    async fn run(self, answer: tokio::sync::oneshot::Sender<Result<lease::Grant, StoreError>>) {
        let call = self.redis.lease_unbounded(LeaseCall {
            client: &self.key.client,
            route: &self.key.route,
            policies: &self.policies,
            need: self.ask.need,
            want: self.ask.want,
            give_back: self.ask.give_back,
            give_back_starts: &self.ask.give_back_starts,
            now_ms: self.now_ms,
        });
        let result = match tokio::time::timeout(LATE_RENEWAL, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(LATE_RENEWAL)),
        };
        // Delivered to the request if it still waits; otherwise settled here.
        if let Err(result) = answer.send(result) {
            let now = MonotonicClock.now_ms();
            match result {
                Ok(grant) => {
                    self.leases
                        .settle_late(&self.key, &self.policies, &self.ask, &grant, now)
                }
                Err(e) => {
                    log::debug!("a late lease renewal failed too: {e}");
                    self.leases.end_renewal(&self.key);
                }
            }
        }
    }
}

/// Most (client, route) keys holding a quota lease at once; past it, requests of new keys
/// are decided by one store call each (exact, just not leased).
pub const MAX_LEASES: usize = 100_000;

impl Store {
    pub fn memory(metrics: Arc<Metrics>) -> Store {
        Store::new(
            Backend::Memory(MemoryStore::new(MonotonicClock)),
            default_failure(),
            metrics,
        )
    }

    pub fn redis(
        config: RedisConfig,
        failure: FailureSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Store, StoreError> {
        Ok(Store::new(
            Backend::Redis(Arc::new(RedisStore::new(config)?)),
            failure,
            metrics,
        ))
    }

    fn new(backend: Backend, failure: FailureSettings, metrics: Arc<Metrics>) -> Store {
        metrics.breaker_state.set(BreakerState::Closed as i64);
        let results = ["ok", "timeout", "unavailable", "refused", "protocol"]
            .map(|label| metrics.store_calls.with_label_values(&[label]));
        Store {
            results,
            backend,
            breaker: CircuitBreaker::new(
                failure.breaker_failures,
                failure.breaker_cooldown.as_millis() as u64,
            ),
            failure,
            fallback: MemoryStore::new(MonotonicClock),
            leases: Arc::new(LeaseTable::new(MAX_LEASES)),
            live_instances: AtomicU64::new(0),
            instance_id: instance_id(),
            metrics,
            last_degraded_log_ms: AtomicU64::new(0),
            degraded_since_log: AtomicU64::new(0),
            health: AtomicU8::new(StoreHealth::Unknown as u8),
        }
    }

    /// Decides one request against every policy, committing only if all admit it.
    pub async fn check(&self, req: CheckRequest<'_>) -> Result<Verdict, StoreError> {
        let redis = match &self.backend {
            Backend::Memory(m) => {
                return Ok(m.check(
                    req.client,
                    req.route,
                    req.policies,
                    req.shadow,
                    req.cost,
                    req.now_ms,
                ))
            }
            Backend::Redis(r) => r,
        };
        if let Some(cap) = req.lease {
            return self.check_leased(redis, &req, cap).await;
        }
        self.check_per_request(redis, &req).await
    }

    async fn check_per_request(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
    ) -> Result<Verdict, StoreError> {
        let result = self
            .guarded(redis.check(redis::Call {
                client: req.client,
                route: req.route,
                policies: req.policies,
                shadow: req.shadow,
                cost: req.cost,
                lease_id: req.lease_id,
                time: req.now_ms.into(),
            }))
            .await;
        if let Err(e) = &result {
            if !req.lease_id.is_empty() && !matches!(e, StoreError::CircuitOpen) {
                self.release_unanswered(redis, req);
            }
        }
        result
    }

    /// A check that took concurrency slots got no usable answer: it may still run (the call
    /// timed out while Redis stalled) or have run (its reply was lost), taking slots that
    /// nothing would release before their lease ends. Release them now: on the same
    /// connection, so Redis runs the release after the check (a release of slots never
    /// taken removes nothing).
    fn release_unanswered(&self, redis: &Arc<RedisStore>, req: &CheckRequest<'_>) {
        let redis = Arc::clone(redis);
        let (client, route) = (Arc::clone(req.client), Arc::clone(req.route));
        let policies: Vec<Policy> = req
            .policies
            .iter()
            .filter(|p| p.is_concurrency())
            .cloned()
            .collect();
        let lease_id = req.lease_id.to_owned();
        tokio::spawn(async move {
            let released = redis
                .release_within(&client, &route, &policies, &lease_id, LATE_RENEWAL)
                .await;
            if let Err(e) = released {
                log::debug!("releasing the slots of an unanswered check failed: {e}");
            }
        });
    }

    /// Decides from this instance's lease of the client's quota, renewing it from Redis when
    /// it is spent or its window ended ([`super::lease`]).
    async fn check_leased(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
        cap: u64,
    ) -> Result<Verdict, StoreError> {
        let key = LeaseKey {
            client: Arc::clone(req.client),
            route: Arc::clone(req.route),
        };
        let margin = redis.config().timeout.as_millis() as u64;
        // A request waits for at most two renewals of others before asking by itself.
        for _ in 0..3 {
            let now = MonotonicClock.now_ms();
            match self
                .leases
                .take(&key, req.policies, req.cost, cap, now, margin)
            {
                Take::Local(verdict) => {
                    self.metrics.lease_local.inc();
                    return Ok(verdict);
                }
                Take::Wait(renewal) => {
                    // Bounded: the renewal itself is bounded by the same timeout.
                    let _ = tokio::time::timeout(redis.config().timeout, renewal).await;
                }
                Take::Untracked => break,
                Take::Stalled => {
                    return Err(StoreError::Timeout(redis.config().timeout));
                }
                Take::Ask(ask) => {
                    let renewal = Renewal {
                        redis: Arc::clone(redis),
                        leases: Arc::clone(&self.leases),
                        key: key.clone(),
                        policies: req.policies.to_vec(),
                        ask,
                        now_ms: req.now_ms,
                    };
                    let timeout = redis.config().timeout;
                    return match self.guarded(renewal.send(timeout)).await {
                        Ok((ask, grant)) => Ok(self.leases.settle(
                            &key,
                            req.policies,
                            ask,
                            &grant,
                            MonotonicClock.now_ms(),
                        )),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        self.check_per_request(redis, req).await
    }

    /// One store call through the circuit breaker, timed and counted by result.
    async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let now = MonotonicClock.now_ms();
        let (permit, transition) = self.breaker.permit(now);
        self.on_transition(transition);
        if permit == Permit::Reject {
            self.metrics.store_short_circuits.inc();
            self.record_health(StoreHealth::Unreachable);
            return Err(StoreError::CircuitOpen);
        }
        let started = Instant::now();
        let result = call.await;
        self.metrics
            .store_duration
            .observe(started.elapsed().as_secs_f64());
        let slot = match &result {
            Ok(_) => 0,
            Err(StoreError::Timeout(_)) => 1,
            Err(StoreError::Unavailable(_) | StoreError::CircuitOpen) => 2,
            Err(StoreError::Refused(_) | StoreError::Auth(_)) => 3,
            Err(StoreError::Protocol(_)) => 4,
        };
        self.results[slot].inc();
        self.record_health(StoreHealth::of(&result));
        let transition = match &result {
            Err(e) if e.is_outage() => self.breaker.on_failure(permit, MonotonicClock.now_ms()),
            _ => self.breaker.on_success(permit),
        };
        self.on_transition(transition);
        result
    }

    /// Graceful shutdown: stops spending this instance's leases and gives their unspent
    /// units back to Redis, so other instances can use them in the same window. Best
    /// effort: what cannot be given back lapses with its window. Returns units given back.
    pub async fn give_back_leases(&self) -> u64 {
        let Backend::Redis(redis) = &self.backend else {
            return 0;
        };
        let mut back = 0;
        for unspent in self.leases.drain(MonotonicClock.now_ms()) {
            match redis
                .give_back(
                    &unspent.key.client,
                    &unspent.key.route,
                    &unspent.policies,
                    &unspent.starts,
                    unspent.units,
                )
                .await
            {
                Ok(units) => back += units,
                Err(e) => {
                    log::info!("giving back unspent leases stopped: {e}");
                    break;
                }
            }
        }
        back
    }

    /// The local fallback: the same limits divided by the number of live instances, decided
    /// in this process. Used by routes with `on_store_error = "local"` while the store fails.
    /// Returns the divided policies (what the client is told) with the verdict.
    pub fn check_fallback(&self, req: CheckRequest<'_>) -> (Vec<Policy>, Verdict) {
        let divided = divide(req.policies, self.divisor());
        let verdict = self.fallback.check(
            req.client, req.route, &divided, req.shadow, req.cost, req.now_ms,
        );
        (divided, verdict)
    }

    /// A request admitted with concurrency policies ended: free its slots. `fallback`: it was
    /// admitted by the local fallback (whose slots are in this process).
    pub async fn release(
        &self,
        client: &Arc<str>,
        route: &Arc<str>,
        policies: &[Policy],
        lease_id: &str,
        fallback: bool,
    ) {
        if fallback {
            self.fallback
                .release(client, route, &divide(policies, self.divisor()));
            return;
        }
        match &self.backend {
            Backend::Memory(m) => m.release(client, route, policies),
            Backend::Redis(r) => {
                // Runs as a task of its own (the request is over): it may wait for Redis as
                // long as a late reply is waited for, rather than be dropped unsent behind a
                // busy connection. A slot that cannot be released expires with its lease.
                let released = r
                    .release_within(client, route, policies, lease_id, LATE_RENEWAL)
                    .await;
                if let Err(e) = released {
                    log::debug!(
                        "releasing concurrency slots failed (they expire with their lease): {e}"
                    );
                }
            }
        }
    }

    /// The instance count the fallback divides by.
    pub fn divisor(&self) -> u64 {
        match self.live_instances.load(Ordering::Relaxed) {
            0 => self.failure.expected_instances.max(1),
            n => n,
        }
    }

    /// Live instances from the last heartbeat (0 when never known).
    pub fn live_instances(&self) -> u64 {
        self.live_instances.load(Ordering::Relaxed)
    }

    /// One heartbeat (Redis stores only): announces this instance and learns how many are
    /// alive. With `leave`, withdraws this instance (graceful shutdown).
    pub async fn heartbeat(&self, leave: bool) -> Result<u64, StoreError> {
        let Backend::Redis(redis) = &self.backend else {
            return Ok(1);
        };
        let liveness = self.failure.heartbeat_interval * 3;
        let result = redis.heartbeat(&self.instance_id, liveness, leave).await;
        self.record_health(StoreHealth::of(&result));
        let live = result?;
        if !leave {
            self.live_instances.store(live.max(1), Ordering::Relaxed);
            self.metrics.live_instances.set(live.max(1) as i64);
        }
        Ok(live)
    }

    pub fn heartbeat_interval(&self) -> Option<Duration> {
        match self.backend {
            Backend::Redis(_) => Some(self.failure.heartbeat_interval),
            Backend::Memory(_) => None,
        }
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// How the latest call went (the memory store always answers).
    pub fn health(&self) -> StoreHealth {
        if matches!(self.backend, Backend::Memory(_)) {
            return StoreHealth::Ok;
        }
        match self.health.load(Ordering::Relaxed) {
            1 => StoreHealth::Ok,
            2 => StoreHealth::Refusing,
            3 => StoreHealth::Unreachable,
            _ => StoreHealth::Unknown,
        }
    }

    fn record_health(&self, health: StoreHealth) {
        // Only a change writes: steady state leaves the cache line shared.
        if self.health.load(Ordering::Relaxed) != health as u8 {
            self.health.store(health as u8, Ordering::Relaxed);
        }
    }

    /// Counts a degraded decision and logs, at most once per [`DEGRADED_LOG_EVERY`], how many
    /// there were and why.
    pub fn note_degraded(&self, error: &StoreError, mode: &str) {
        self.degraded_since_log.fetch_add(1, Ordering::Relaxed);
        let now = MonotonicClock.now_ms();
        let last = self.last_degraded_log_ms.load(Ordering::Relaxed);
        if now >= last + DEGRADED_LOG_EVERY.as_millis() as u64
            && self
                .last_degraded_log_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let count = self.degraded_since_log.swap(0, Ordering::Relaxed);
            log::warn!(
                "limiter store failing ({error}); {count} degraded decision(s) since the last report, latest handled as {mode}"
            );
        }
    }

    fn on_transition(&self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        self.metrics.set_breaker_state(t.to);
        match t.to {
            BreakerState::Open => log::warn!(
                "limiter store circuit breaker opened ({} -> open): routes use their failure mode for {:?}",
                t.from.as_str(),
                self.failure.breaker_cooldown
            ),
            BreakerState::HalfOpen => log::info!("limiter store circuit breaker half-open: probing the store"),
            BreakerState::Closed => log::info!("limiter store circuit breaker closed: the store answers again"),
        }
    }

    /// Periodic housekeeping: drops idle in-process state. Returns entries dropped.
    pub fn sweep(&self) -> usize {
        let local = match &self.backend {
            Backend::Memory(m) => m.sweep(),
            Backend::Redis(_) => 0,
        };
        local + self.fallback.sweep() + self.leases.sweep(MonotonicClock.now_ms())
    }

    /// Entries held in process: (primary memory store, fallback store, leases).
    pub fn local_entries(&self) -> (usize, usize, usize) {
        let primary = match &self.backend {
            Backend::Memory(m) => m.keys(),
            Backend::Redis(_) => 0,
        };
        (primary, self.fallback.keys(), self.leases.len())
    }

    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(r) => match r.config().topology {
                Topology::Single(_) => "redis",
                Topology::Cluster(_) => "redis_cluster",
            },
        }
    }
}

fn default_failure() -> FailureSettings {
    FailureSettings {
        breaker_failures: 5,
        breaker_cooldown: Duration::from_secs(1),
        expected_instances: 1,
        heartbeat_interval: Duration::from_secs(1),
    }
}

/// Each limit (and burst) divided by `n`, never below 1.
pub fn divide(policies: &[Policy], n: u64) -> Vec<Policy> {
    policies
        .iter()
        .map(|p| Policy {
            limit: (p.limit / n).max(1),
            burst: (p.burst / n).max(1),
            ..p.clone()
        })
        .collect()
}

/// `<host>-<pid>-<random>`: unique per process, readable in `ZRANGE <prefix>:instances`.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{host}-{}-{:08x}", std::process::id(), h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    #[test]
    fn limits_are_divided_but_never_to_zero() {
        let p = [
            Policy::new("a", Algorithm::TokenBucket, 10, 1000, 20),
            Policy::new("b", Algorithm::FixedWindow, 1, 1000, 1),
        ];
        let d = divide(&p, 3);
        assert_eq!((d[0].limit, d[0].burst, d[1].limit), (3, 6, 1));
        assert_eq!(d[0].name, p[0].name);
    }

    #[tokio::test]
    async fn the_memory_store_never_fails_and_the_fallback_divides() {
        let store = Store::memory(Arc::new(Metrics::new()));
        let (c, r) = (Arc::from("c"), Arc::from("r"));
        let p = [Policy::new("p", Algorithm::FixedWindow, 4, 60_000, 4)];
        let req = || CheckRequest {
            client: &c,
            route: &r,
            policies: &p,
            shadow: &[],
            cost: 1,
            lease_id: "",
            now_ms: Some(1 << 40),
            lease: None,
        };
        assert!(store.check(req()).await.unwrap().allowed());
        assert_eq!(store.divisor(), 1);
        let admitted = (0..10)
            .filter(|_| store.check_fallback(req()).1.allowed())
            .count();
        assert_eq!(admitted, 4);
    }
}
