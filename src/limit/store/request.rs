//! The one question every store answers (the memory store, Redis, the local fallback).

use crate::limit::{Policy, Verdict};
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
    /// `costs[i]`: the units policy `i` asks when not `cost` (a limit charged from the
    /// response reserves its own; missing = `cost`).
    pub costs: &'a [u64],
    /// Names the concurrency slots the request takes, if it has concurrency policies
    /// ("" otherwise); releasing them names it again.
    pub slot_id: &'a str,
    pub at: DecideAt,
    /// Decide from a quota lease of at most this many units (Redis stores; every policy a
    /// fixed or sliding window, none shadow). `None`: one store call per request.
    pub lease: Option<u64>,
    /// Giving back: `waits[i]`, how long policy `i` held the request (a leaky bucket's turn;
    /// missing = 0).
    pub waits: &'a [u64],
}

/// Whose count a policy is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Partition {
    /// The client's (plan limits, concurrency).
    Client,
    /// A keyed limit's: `k:` and a hash of the key parts (`chain::partition`), the same on every
    /// instance.
    Keyed(Arc<str>),
}

impl CheckRequest<'_> {
    /// The units policy `i` asks.
    pub fn cost_of(&self, i: usize) -> u64 {
        self.costs.get(i).copied().unwrap_or(self.cost)
    }

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
            costs: &[],
            slot_id: "",
            at: DecideAt::StoreClock,
            lease: None,
            waits: &[],
        }
    }
}

/// What an admitted request counted, kept so that it can be given back when the request is
/// not served after all (shed before it reached its upstream). Concurrency slots are not
/// in it: they are released when the request ends, served or not.
#[derive(Debug, Clone)]
pub struct Counted {
    pub client: Arc<str>,
    pub route: Arc<str>,
    /// The policies that counted the request, with their partitions.
    pub policies: Vec<Policy>,
    pub partitions: Vec<Partition>,
    /// `waits[i]`: how long policy `i` (a leaky bucket) held the request (0 for others).
    pub waits: Vec<u64>,
    pub cost: u64,
    /// `costs[i]`: what policy `i` counted (empty: `cost` for every one).
    pub costs: Vec<u64>,
    /// The time the store decided at (its clock; the lease table's for a lease).
    pub at_ms: u64,
    /// Spent from this instance's quota lease.
    pub from_lease: bool,
    /// Decided by the local fallback (`policies` are the divided ones it decided with).
    pub fallback: bool,
}

impl Counted {
    /// What `verdict` counted of `req` (decided with `policies`: the request's own, or the
    /// fallback's divided ones); `None` when nothing was.
    pub fn of(
        req: &CheckRequest<'_>,
        policies: &[Policy],
        verdict: &Verdict,
        fallback: bool,
    ) -> Option<Counted> {
        if !verdict.admitted {
            return None;
        }
        let counted: Vec<usize> = (0..policies.len())
            .filter(|&i| {
                !policies[i].is_concurrency() && verdict.decisions.get(i).is_some_and(|d| d.allowed)
            })
            .collect();
        if counted.is_empty() {
            return None;
        }
        Some(Counted {
            client: Arc::clone(req.client),
            route: Arc::clone(req.route),
            policies: counted.iter().map(|&i| policies[i].clone()).collect(),
            partitions: counted
                .iter()
                .map(|&i| req.partitions.get(i).cloned().unwrap_or(Partition::Client))
                .collect(),
            waits: counted
                .iter()
                .map(|&i| verdict.wait_of(policies, i))
                .collect(),
            cost: req.cost,
            costs: if req.costs.is_empty() {
                Vec::new()
            } else {
                counted.iter().map(|&i| req.cost_of(i)).collect()
            },
            at_ms: verdict.at_ms,
            from_lease: verdict.from_lease,
            fallback,
        })
    }

    /// The request as asked (enforced, at the time it was decided), to name its state.
    pub fn request(&self) -> CheckRequest<'_> {
        CheckRequest {
            partitions: &self.partitions,
            waits: &self.waits,
            costs: &self.costs,
            at: DecideAt::Fixed(self.at_ms),
            ..CheckRequest::new(&self.client, &self.route, &self.policies, self.cost)
        }
    }
}
