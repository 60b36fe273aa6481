//! The one question every store answers (the memory store, Redis, the local fallback).

use crate::limit::Policy;
use std::sync::Arc;

/// One request's question to the store: may it spend `cost` units of every policy on
/// `route`? Answered with a `Verdict` that commits only if every enforced policy admits.
#[derive(Debug, Clone, Copy)]
pub struct CheckRequest<'a> {
    /// The client whose plan limits are asked about (the [`Partition::Client`] policies).
    pub client: &'a Arc<str>,
    pub route: &'a Arc<str>,
    pub policies: &'a [Policy],
    /// `partitions[i]`: whose count policy `i` is (missing = the client's).
    pub partitions: &'a [Partition],
    /// `shadow[i]`: policy `i` decides and counts but never blocks (missing = enforced).
    pub shadow: &'a [bool],
    pub cost: u64,
    /// Names the concurrency slots the request takes, if it has concurrency policies
    /// ("" otherwise); releasing them names it again.
    pub slot_id: &'a str,
    pub at: DecideAt,
    /// Decide from a quota lease of at most this many units (Redis stores; every policy a
    /// fixed or sliding window, none shadow). `None`: one store call per request.
    pub lease: Option<u64>,
}

/// Whose count a policy is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Partition {
    /// The client's (plan limits, concurrency).
    Client,
    /// A keyed limit's: `k:` and a hash of the key parts (`chain::keys`), the same on every
    /// instance.
    Keyed(Arc<str>),
}

impl CheckRequest<'_> {
    /// The name of policy `i`'s partition: the client id, or the keyed partition.
    pub fn partition_of(&self, i: usize) -> &Arc<str> {
        match self.partitions.get(i) {
            Some(Partition::Keyed(key)) => key,
            _ => self.client,
        }
    }
}

/// The time a request is decided at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecideAt {
    /// The store's own clock: Redis `TIME`, or this process's monotonic clock for the memory
    /// store. Production always uses this.
    StoreClock,
    /// An explicit time in milliseconds: deterministic tests replaying window edges.
    Fixed(u64),
    /// The store's clock plus an offset in milliseconds: tests that jump ahead in time
    /// without drifting from the clock Redis expires keys by.
    StoreClockPlus(u64),
}

impl DecideAt {
    /// The time to decide at, given the store's clock reading.
    pub fn resolve(self, store_clock_ms: impl FnOnce() -> u64) -> u64 {
        match self {
            DecideAt::StoreClock => store_clock_ms(),
            DecideAt::Fixed(ms) => ms,
            DecideAt::StoreClockPlus(offset) => store_clock_ms() + offset,
        }
    }
}

impl<'a> CheckRequest<'a> {
    /// A request of `cost` against enforced limits only (no dry runs, no concurrency slots,
    /// no lease), decided at the store's clock; fields can be changed after.
    pub fn new(
        client: &'a Arc<str>,
        route: &'a Arc<str>,
        policies: &'a [Policy],
        cost: u64,
    ) -> CheckRequest<'a> {
        CheckRequest {
            client,
            route,
            policies,
            partitions: &[],
            shadow: &[],
            cost,
            slot_id: "",
            at: DecideAt::StoreClock,
            lease: None,
        }
    }
}
