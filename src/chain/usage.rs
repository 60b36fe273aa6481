//! What a client has left of its plan's limits on its routes: the same state the limiter
//! decides with (Redis, or the memory store), read without counting anything — every
//! algorithm asked at cost 0 reports its remaining units and reset (`lua/usage.lua` and
//! `limit/algorithm/` treat cost 0 as "only report"). Every route is asked in one store call
//! that writes nothing, and a client-wide limit is read once for all routes. Concurrency
//! limits are not quotas and are left out; with quota leasing, units other instances hold in
//! a lease count as used.

use crate::chain::auth::Client;
use crate::limit::store::{Store, StoreError};
use crate::limit::{Decision, Policy};
use std::sync::Arc;

/// For each of `routes`, `(limit name, what it says now)` for each rate limit of `client`'s
/// plan.
pub async fn usage(
    store: &Store,
    client: &Arc<Client>,
    routes: &[Arc<str>],
) -> Result<Vec<Vec<(Arc<str>, Decision)>>, StoreError> {
    let policies: Vec<&Policy> = client
        .plan
        .policies
        .iter()
        .zip(&client.plan.shadow)
        .filter(|(p, shadow)| !p.is_concurrency() && !**shadow)
        .map(|(p, _)| p)
        .collect();
    if policies.is_empty() {
        return Ok(routes.iter().map(|_| Vec::new()).collect());
    }
    let asks: Vec<(Arc<str>, Policy)> = routes
        .iter()
        .flat_map(|r| policies.iter().map(|p| (Arc::clone(r), (*p).clone())))
        .collect();
    let decisions = store.usage(&client.id, &asks).await?;
    Ok(decisions
        .chunks(policies.len())
        .map(|per_route| {
            policies
                .iter()
                .map(|p| Arc::clone(&p.name))
                .zip(per_route.iter().copied())
                .collect()
        })
        .collect())
}
