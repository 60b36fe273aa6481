//! Concurrency: requests in flight, in this process. Mirrors `lua/concurrency.lua` (which
//! keeps slots with an expiry instead of a count).

use crate::limit::{Decision, Policy};

/// Requests in flight (in one process; the Redis store keeps leases with an expiry instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Concurrency {
    pub in_flight: u64,
}

impl Concurrency {
    /// A request takes one slot whatever its cost; cost 0 only reports.
    pub fn decide(&self, policy: &Policy, cost: u64) -> (Decision, Concurrency) {
        let take = u64::from(cost > 0);
        if self.in_flight + take <= policy.limit {
            let in_flight = self.in_flight + take;
            let decision = Decision {
                allowed: true,
                limit: policy.limit,
                remaining: policy.limit - in_flight,
                reset_ms: 0,
                retry_after_ms: 0,
            };
            (decision, Concurrency { in_flight })
        } else {
            let decision = Decision {
                allowed: false,
                limit: policy.limit,
                remaining: 0,
                reset_ms: 0,
                retry_after_ms: 1000,
            };
            (decision, *self)
        }
    }
}
