//! What happens after a decision, on the store that made it: a check that got no answer
//! releases the slots it may have taken; a shed request's units are given back ([`refund`]);
//! a response's reported cost is charged ([`charge`]); a finished request's concurrency
//! slots are freed ([`release`]).
//!
//! [`refund`]: Store::refund
//! [`charge`]: Store::charge
//! [`release`]: Store::release

use super::failure::divide;
use super::lease::LeaseKey;
use super::redis::{Landed, RedisStore, LATE_REPLY};
use super::request::DecideAt;
use super::{Backend, CheckRequest, Counted, Store, StoreError};
use crate::clock::Clock;
use crate::limit::Policy;
use std::sync::Arc;
use std::time::Duration;

/// How long the release of an unanswered check's slots waits for the call that may carry
/// the check to end: as long as a late reply is waited for.
const RELEASE_WAIT: Duration = LATE_REPLY;

impl<C: Clock + Clone> Store<C> {
    /// A check that took concurrency slots got no usable answer: it may still run (the call
    /// timed out while Redis stalled) or have run (its reply was lost), taking slots that
    /// nothing would release before their lease ends. Release them now: on the same
    /// connection, once no call can carry the check any more (`landed`: at once unless it
    /// queued for a batch), so Redis runs the release after the check (a release of slots
    /// never taken removes nothing). That wait is bounded by [`RELEASE_WAIT`]; the release,
    /// as every release (`redis/settlements.rs`).
    pub(super) fn release_unanswered(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
        landed: Landed,
    ) {
        let redis = Arc::clone(redis);
        let (client, route) = (Arc::clone(req.client), Arc::clone(req.route));
        let policies: Vec<Policy> = req
            .policies
            .iter()
            .filter(|p| p.is_concurrency())
            .cloned()
            .collect();
        let slot_id = req.slot_id.to_owned();
        tokio::spawn(async move {
            // Past the bound the release goes anyway: its slots would otherwise stay taken
            // until their lease ends.
            let _ = tokio::time::timeout(RELEASE_WAIT, landed.wait()).await;
            let released = redis.release(&client, &route, &policies, &slot_id).await;
            if let Err(e) = released {
                log::debug!("Redis refused the release of an unanswered check's slots: {e}");
            }
        });
    }

    /// Gives back what an admitted request counted (it was shed before reaching its
    /// upstream): to the store that counted it — this process's tables, Redis (one
    /// `refund.lua` call per slot), this instance's lease, or the local fallback. Best effort
    /// and bounded by the store timeout: units that cannot be given back stay counted (the
    /// client is then held to slightly less than its limit, never more).
    pub async fn refund(&self, taken: &Counted) {
        let req = taken.request();
        if taken.fallback {
            self.fallback.refund(&req, taken.at_ms);
            return;
        }
        match &self.backend {
            Backend::Memory(m) => m.refund(&req, taken.at_ms),
            Backend::Redis(_) if taken.from_lease => {
                let key = LeaseKey {
                    client: Arc::clone(&taken.client),
                    route: Arc::clone(&taken.route),
                };
                let now = self.clock.now_ms();
                self.leases
                    .refund(&key, &taken.policies, taken.cost, taken.at_ms, now);
            }
            Backend::Redis(r) => {
                if let Err(e) = r.refund(&req, taken.at_ms).await {
                    log::debug!("giving back the units of a shed request failed: {e}");
                }
            }
        }
    }

    /// Charges what a request admitted earlier turned out to cost: `deltas` (index into
    /// `taken.policies`, units more or less than counted), now, on the store that counted
    /// it. A leased request is not charged (plans that lease cannot charge from responses).
    pub async fn charge(&self, taken: &Counted, deltas: &[(usize, i64)]) -> Result<(), StoreError> {
        let req = CheckRequest {
            at: DecideAt::StoreClock,
            ..taken.request()
        };
        if taken.fallback {
            self.fallback.charge(&req, taken.at_ms, deltas);
            return Ok(());
        }
        match &self.backend {
            Backend::Memory(m) => {
                m.charge(&req, taken.at_ms, deltas);
                Ok(())
            }
            Backend::Redis(_) if taken.from_lease => Ok(()),
            Backend::Redis(r) => r.charge(&req, taken.at_ms, deltas).await,
        }
    }

    /// A request admitted with concurrency policies ended: free its slots. `fallback`: it was
    /// admitted by the local fallback (whose slots are in this process).
    pub async fn release(
        &self,
        client: &Arc<str>,
        route: &Arc<str>,
        policies: &[Policy],
        slot_id: &str,
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
                // Runs as a task of its own (the request is over). Each attempt is bounded as
                // a decision is; one that fails is sent again while the slot would live
                // (`redis/settlements.rs`).
                let released = r.release(client, route, policies, slot_id).await;
                if let Err(e) = released {
                    log::debug!(
                        "Redis refused a release of concurrency slots (they expire with their lease): {e}"
                    );
                }
            }
        }
    }
}
