//! After the upstream's response header: charge the limits whose cost the response reports
//! (`cost_from_response`), as a task of its own, off the response's path. The store applies
//! it once however often it is sent, and sends it again after a timeout or an outage
//! (`limit/store/redis/settlements.rs`: a retry here, with no id of its own, was applied once
//! per attempt when the first had run late); a charge Redis refuses is counted
//! (`turnstile_response_costs_total{result="failed"}`) and logged — never silently dropped,
//! never holding the response.

use crate::chain::cost::Reported;
use crate::proxy::context::RequestCtx;
use pingora::http::ResponseHeader;
use std::sync::Arc;

pub fn charge_from_response(response: &ResponseHeader, ctx: &mut RequestCtx) {
    // The final response's header only, once (not a 100 Continue).
    if response.status.is_informational() || ctx.cost_charged {
        return;
    }
    ctx.cost_charged = true;
    let Some(client) = ctx.client.as_ref() else {
        return;
    };
    if client.plan.response_costs.is_empty() {
        return;
    }
    let Some((store, taken)) = ctx.admission.taken() else {
        return;
    };
    let metrics = &ctx.snapshot.metrics;
    let mut deltas = Vec::new();
    for charged in &client.plan.response_costs {
        // Not counted (exempt, not admitted by it): nothing to charge.
        let Some(i) = taken.policies.iter().position(|p| p.name == charged.limit) else {
            continue;
        };
        let reported = Reported::read(&response.headers, &charged.header, charged.max);
        metrics.response_cost(reported.as_str());
        // What the limit counted at admission: the request's reservation of it.
        let reserved = taken.costs.get(i).copied().unwrap_or(taken.cost);
        let delta = reported.actual(reserved) as i64 - reserved as i64;
        if delta != 0 {
            deltas.push((i, delta));
        }
    }
    if deltas.is_empty() {
        return;
    }
    let (store, taken, metrics) = (Arc::clone(store), taken.clone(), Arc::clone(metrics));
    tokio::spawn(async move {
        if let Err(e) = store.charge(&taken, &deltas).await {
            metrics.response_cost("failed");
            log::warn!(
                "charging a response's cost to client {} was refused, not counted: {e}",
                taken.client
            );
        }
    });
}
