//! What a client has left of its plan's limits on a route: the same state the limiter decides
//! with (Redis, or the memory store), asked with a cost of 0 — every algorithm then reports
//! its remaining units and reset without counting anything (`lua/*.lua` and
//! `limit/algorithm/` treat cost 0 as "only report"). Concurrency limits are not quotas and
//! are left out; with quota leasing, units other instances hold in a lease count as used.

use crate::chain::auth::Client;
use crate::limit::store::request::{CheckRequest, DecideAt};
use crate::limit::store::{Store, StoreError};
use crate::limit::{Decision, Policy};
use std::sync::Arc;

/// `(limit name, what it says now)` for each rate limit of `client`'s plan on `route`.
pub async fn usage(
    store: &Store,
    client: &Arc<Client>,
    route: &Arc<str>,
) -> Result<Vec<(Arc<str>, Decision)>, StoreError> {
    let policies: Vec<Policy> = client
        .plan
        .policies
        .iter()
        .zip(&client.plan.shadow)
        .filter(|(p, shadow)| !p.is_concurrency() && !**shadow)
        .map(|(p, _)| p.clone())
        .collect();
    if policies.is_empty() {
        return Ok(Vec::new());
    }
    let verdict = store
        .check(CheckRequest {
            client: &client.id,
            route,
            policies: &policies,
            partitions: &[],
            shadow: &[],
            cost: 0,
            slot_id: "",
            at: DecideAt::StoreClock,
            lease: None,
            waits: &[],
            costs: &[],
        })
        .await?;
    Ok(policies
        .iter()
        .map(|p| Arc::clone(&p.name))
        .zip(verdict.decisions)
        .collect())
}
