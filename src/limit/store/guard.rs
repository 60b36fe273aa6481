//! Every store call through the circuit breaker: timed, counted by result, its health
//! recorded, the breaker told (`shared_breaker.rs` logs and exports its state changes). A
//! connection repaired in the background (`redis/repair.rs`) closes an open breaker.

use super::breaker::{Attempt, BreakerState, Transition};
use super::{Backend, Store, StoreError, StoreHealth};
use crate::clock::Clock;
use futures::future::{self, Either, FutureExt};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

impl<C: Clock + Clone> Store<C> {
    /// One store call through the circuit breaker, timed and counted by result.
    ///
    /// A plain function returning a combinator, not an `async fn`: an `async fn` keeps the
    /// future it is given twice in its own state (as the argument and as what it awaits), and
    /// every decision passes through here, nested in the request's future.
    ///
    /// `queued`: set by a decision that queued for a batch (`redis/batch.rs`) — the call
    /// carrying it reports to the breaker itself, once for the whole batch, so the
    /// decision's own outcome (its batch's error, or its own timeout while it waited) is not
    /// counted again.
    pub(super) fn guarded<'a, T: 'a>(
        &'a self,
        call: impl Future<Output = Result<T, StoreError>> + 'a,
        queued: Option<&'a AtomicBool>,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        let (mut attempt, transition) = match self.node_breakers {
            // Each Cluster node's own breaker is asked inside the call.
            true => (Attempt::Call, None),
            false => self.breaker.breaker().attempt(self.clock.now_ms()),
        };
        self.on_transition(transition);
        if attempt == Attempt::Reject && self.answers_again() {
            // The request connection was repaired since the breaker opened.
            self.on_transition(self.breaker.breaker().close());
            attempt = Attempt::Call;
        }
        if attempt == Attempt::Reject {
            self.metrics.short_circuits.inc();
            self.health.set(StoreHealth::Unreachable);
            return Either::Left(future::ready(Err(StoreError::CircuitOpen)));
        }
        let started = Instant::now();
        Either::Right(call.map(move |result| {
            // A probe is always its own (the breaker waits for its answer).
            let batched =
                attempt == Attempt::Call && queued.is_some_and(|q| q.load(Ordering::Relaxed));
            self.record(attempt, started, &result, batched);
            result
        }))
    }
    /// Counts, times and reports one finished call to the breaker (unless a batch reported
    /// it: `batched`) and the health cell.
    fn record<T>(
        &self,
        attempt: Attempt,
        started: Instant,
        result: &Result<T, StoreError>,
        batched: bool,
    ) {
        if let Err(StoreError::CircuitOpen) = result {
            // A Cluster node's open breaker: not called.
            self.metrics.short_circuits.inc();
            self.health.set(StoreHealth::Unreachable);
            return;
        }
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        let slot = match result {
            Ok(_) => 0,
            Err(StoreError::Timeout(_)) => 1,
            Err(StoreError::Unavailable(_) | StoreError::CircuitOpen) => 2,
            Err(StoreError::Refused(_) | StoreError::Auth(_)) => 3,
            Err(StoreError::Protocol(_)) => 4,
        };
        self.metrics.calls[slot].inc();
        self.health.record(result);
        if self.node_breakers || batched {
            return;
        }
        let outcome = result.as_ref().map(|_| ());
        if self.breaker.ended(attempt, outcome, self.clock.now_ms()) {
            self.connection_lost();
        }
    }
    pub(super) fn on_transition(&self, transition: Option<Transition>) {
        if self.breaker.announce(transition) {
            self.connection_lost();
        }
    }
    /// The breaker opened: the request connection is repaired in the background, and once
    /// Redis answers the breaker closes.
    fn connection_lost(&self) {
        if let Backend::Redis(r) = &self.backend {
            r.connection_lost();
        }
    }
    /// Whether the store's request connection has been repaired (Redis answered a ping)
    /// since it was last marked lost — as it is whenever the breaker opens.
    fn answers_again(&self) -> bool {
        match &self.backend {
            Backend::Redis(r) => r.connection_up(),
            Backend::Memory(_) => false,
        }
    }
    /// The store's breaker; on a Cluster, the worst of its nodes' (open, then half-open).
    pub fn breaker_state(&self) -> BreakerState {
        if !self.node_breakers {
            return self.breaker.breaker().state();
        }
        let states: Vec<BreakerState> = self.nodes().iter().map(|n| n.breaker).collect();
        [BreakerState::Open, BreakerState::HalfOpen]
            .into_iter()
            .find(|s| states.contains(s))
            .unwrap_or(BreakerState::Closed)
    }

    /// Redis Cluster: `MOVED` and `ASK` redirects followed so far.
    pub fn redirects(&self) -> (u64, u64) {
        match &self.backend {
            Backend::Redis(r) => r.redirects(),
            Backend::Memory(_) => (0, 0),
        }
    }

    /// Redis: what decides now, "module" or "lua" (`None`: the memory store).
    pub fn decides_with(&self) -> Option<&'static str> {
        match &self.backend {
            Backend::Redis(r) => Some(r.decides_with()),
            Backend::Memory(_) => None,
        }
    }

    /// Redis: what the batch calls carried, and the members sent alone after a refused batch.
    pub fn batches(&self) -> super::redis::BatchTotals {
        match &self.backend {
            Backend::Redis(r) => r.batches(),
            Backend::Memory(_) => Default::default(),
        }
    }

    /// Redis: charges, refunds and releases sent again, and given up.
    pub fn settlements(&self) -> super::redis::settlements::SettlementTotals {
        match &self.backend {
            Backend::Redis(r) => r.settlements(),
            Backend::Memory(_) => Default::default(),
        }
    }

    /// Redis Cluster: every node met, with its own breaker and health (empty otherwise).
    pub fn nodes(&self) -> Vec<super::redis::NodeStatus> {
        match &self.backend {
            Backend::Redis(r) => r.nodes(),
            Backend::Memory(_) => Vec::new(),
        }
    }
    /// How the latest call went (the memory store always answers).
    pub fn health(&self) -> StoreHealth {
        match self.backend {
            Backend::Memory(_) => StoreHealth::Ok,
            Backend::Redis(_) => self.health.get(),
        }
    }
    /// Counts a degraded decision and logs, at most once per
    /// [`failure::DEGRADED_LOG_EVERY`], how many there were and why.
    pub fn note_degraded(&self, error: &StoreError, mode: &str) {
        if let Some(count) = self.degraded.note(self.clock.now_ms()) {
            log::warn!(
                "limiter store failing ({error}); {count} degraded decision(s) since the last report, latest handled as {mode}"
            );
        }
    }
}
