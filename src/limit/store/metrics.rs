//! What the store counts, as plain Prometheus handles: `ops::metrics` registers them (the store
//! does not know the registry), and tests use unregistered ones.

use crate::limit::store::breaker::BreakerState;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

/// The result labels of `turnstile_store_calls_total`, in the order of [`StoreMetrics::calls`].
pub const CALL_RESULTS: [&str; 5] = ["ok", "timeout", "unavailable", "refused", "protocol"];

#[derive(Clone)]
pub struct StoreMetrics {
    /// Calls by result, in [`CALL_RESULTS`] order.
    pub calls: [IntCounter; 5],
    /// Duration of the calls that reached the store.
    pub duration: Histogram,
    /// Calls not made because the breaker was open.
    pub short_circuits: IntCounter,
    /// Decisions taken from a local quota lease (or a remembered refusal).
    pub lease_local: IntCounter,
    pub live_instances: IntGauge,
    /// One per state, in `BreakerState` order (closed, open, half-open): 1 for the current.
    pub breaker_state: [IntGauge; 3],
    /// Transitions by the state entered, in `BreakerState` order (closed, open, half-open).
    pub breaker_transitions: [IntCounter; 3],
}

impl StoreMetrics {
    /// Handles registered nowhere (for tests and tools).
    pub fn unregistered() -> StoreMetrics {
        let counter = || IntCounter::new("x", "x").expect("valid metric");
        let gauge = || IntGauge::new("x", "x").expect("valid metric");
        StoreMetrics {
            calls: std::array::from_fn(|_| counter()),
            duration: Histogram::with_opts(HistogramOpts::new("x", "x")).expect("valid metric"),
            short_circuits: counter(),
            lease_local: counter(),
            live_instances: gauge(),
            breaker_state: std::array::from_fn(|_| gauge()),
            breaker_transitions: std::array::from_fn(|_| counter()),
        }
    }

    /// The breaker entered `state`.
    pub fn breaker_changed(&self, state: BreakerState) {
        self.set_breaker_state(state);
        self.breaker_transitions[state as usize].inc();
    }

    /// The breaker is in `state` (1 on its gauge, 0 on the others).
    pub fn set_breaker_state(&self, state: BreakerState) {
        for (i, gauge) in self.breaker_state.iter().enumerate() {
            gauge.set(i64::from(i == state as usize));
        }
    }
}
