//! [3] and [5] of the chain: whether the limits admit a request. The per-IP bucket first (in
//! process, before any key lookup), then — for an authenticated client — the plan's limits
//! and the route's concurrency limit in the store, with the route's failure mode when the
//! store cannot decide.
//!
//! Each step adds what it decided to an [`Admission`]: the outcome (for the access log), the
//! `RateLimit` header parts, the dry-run limits that would have rejected, and the concurrency
//! slots the request holds until it ends. Per-policy outcomes go to a `record` callback (the
//! caller counts them), so nothing here knows about metrics or Pingora.

mod asked;
mod outcome;
mod rules;
mod slots;
#[cfg(test)]
mod tests;
mod waiting;

pub use outcome::Outcome;
pub use rules::{IpRule, KeyedLimit, RouteRules};
pub use slots::SlotGuard;
pub use waiting::{default_share, Full, Owner, Place};

use self::asked::{keyed_partitions, Asked};
use crate::chain::auth::Client;
use crate::chain::headers::{policy_header, LimitStatus};
use crate::chain::partition::KeyInputs;
use crate::chain::reject::Reject;
use crate::limit::ip::IpKey;
use crate::limit::store::held::HeldSlot;
use crate::limit::store::request::{CheckRequest, Counted, DecideAt, Partition};
use crate::limit::store::{FailureMode, Store};
use crate::limit::{Algorithm, Decision, Policy, Verdict, IP_POLICY_NAME};
use http::HeaderValue;
use std::sync::Arc;
use std::time::Instant;

/// What the admission steps decided for one request.
#[derive(Default)]
pub struct Admission {
    /// The access log's `decision`: the last step's outcome.
    pub outcome: Outcome,
    /// The decisions that feed the response's `RateLimit` headers.
    pub limits: LimitStatus,
    /// Dry-run limits that would have rejected the request (`X-Turnstile-Would-Limit`).
    pub would_limit: Vec<Arc<str>>,
    /// Concurrency slots held until the request ends (released when dropped).
    pub slots: Option<SlotGuard>,
    /// What the store counted for the request, while it could still be given back.
    taken: Option<(Arc<Store>, Counted)>,
    /// Set by the caller to have the store call timed (a traced request).
    pub time_store: bool,
    /// The store call, when timed: started, ended, and its result (`ok` or the error kind).
    pub store_call: Option<(Instant, Instant, &'static str)>,
    /// The request's cost, when it declared one (`cost_from_request`); else the route's.
    pub cost: Option<u64>,
    /// How long an enforced leaky bucket holds the admitted request before it is forwarded
    /// (ms; 0: at once).
    pub delay_ms: u64,
    /// Set by the caller: the most requests leaky buckets may hold on this instance at once,
    /// and of them for one client (`server.max_delayed`, `max_delayed_per_client`; `None`: no
    /// bound).
    pub max_delayed: Option<(usize, usize)>,
    /// The request's place among them while it waits its turn.
    pub place: Option<Place>,
    /// For a refusal: the keyed limits that refused it, each with its partition as the
    /// store names it (`k:` and a hash, never the raw key). Empty otherwise.
    pub refused_keys: Vec<(Arc<str>, Arc<str>)>,
}

impl Admission {
    /// [3] The route's per-IP bucket for the client address `ip` (grouped). `Err` when an
    /// enforced bucket is empty; a dry-run route only notes it.
    pub fn check_ip(
        &mut self,
        rules: &RouteRules,
        ip: Option<IpKey>,
        now_ms: u64,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Result<(), Reject> {
        let (Some(rule), Some(ip)) = (&rules.ip, ip) else {
            // No per-IP limit, or not an IP connection (a Unix socket): nothing to key on.
            return Ok(());
        };
        let decision = rule.limiter.check(ip, now_ms);
        let outcome = Outcome::of(decision.allowed, rules.shadow);
        record(IP_POLICY_NAME, outcome);
        self.outcome = outcome;
        if rules.shadow {
            // A dry run: clients are not shown limits that are not enforced.
            if !decision.allowed {
                self.would_limit.push(Arc::from(IP_POLICY_NAME));
            }
            return Ok(());
        }
        self.enforce_ip(rule, decision)
    }

    /// [3] for a request outside any route (the quota endpoint): `rule`'s bucket, enforced.
    pub fn check_ip_rule(&mut self, rule: &IpRule, ip: IpKey, now_ms: u64) -> Result<(), Reject> {
        let decision = rule.limiter.check(ip, now_ms);
        self.enforce_ip(rule, decision)
    }

    fn enforce_ip(&mut self, rule: &IpRule, decision: Decision) -> Result<(), Reject> {
        self.limits.push(&rule.limiter.policy, decision);
        self.limits.push_policy_header(rule.policy_header.clone());
        if decision.allowed {
            Ok(())
        } else {
            Err(Reject::TooManyRequests)
        }
    }

    /// [6] The request was admitted and then shed (its upstream is overloaded): the access log
    /// says so, and what the store counted for it is given back — the client did nothing
    /// wrong. (Not the per-IP bucket: it guards the gateway, which did answer.) The refund
    /// runs as a task of its own; the slots are released when the request ends, as always.
    pub fn shed(&mut self) {
        self.outcome = Outcome::Shed;
        let Some((store, taken)) = self.taken.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { store.refund(&taken).await });
            }
            Err(_) => log::debug!("no runtime to give back a shed request's units"),
        }
    }

    /// The request will not be forwarded after all (it waited its turn and its client left,
    /// or too many wait): what the store counted is given back — its turn goes to the next.
    pub fn give_back(&mut self) {
        let Some((store, taken)) = self.taken.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { store.refund(&taken).await });
        }
    }

    /// What the store counted for the request (while it is held), and the store.
    pub fn taken(&self) -> Option<(&Arc<Store>, &Counted)> {
        self.taken.as_ref().map(|(store, counted)| (store, counted))
    }

    /// [4] Authentication refused the request: no limit was reached.
    pub fn unauthorized(&mut self) {
        self.outcome = Outcome::Unauthorized;
    }

    /// [5] Every limit that applies to the request, decided together in the store: the
    /// client's plan limits and the route's concurrency limit (for an authenticated client),
    /// and the route's keyed limits (with their keys made from `inputs`). Admitted only if
    /// all admit; nothing counted when one rejects. The route's failure mode when the store
    /// cannot decide. `slot_id` names the slots the request takes if it has concurrency
    /// limits.
    pub async fn check_limits(
        &mut self,
        rules: &RouteRules,
        store: &Arc<Store>,
        client: Option<&Arc<Client>>,
        inputs: &KeyInputs<'_>,
        slot_id: impl FnOnce() -> String,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Result<(), Reject> {
        let skips = crate::chain::exempt::skips(
            &rules.exempt,
            inputs.addr,
            client.map(|c| &*c.id),
            client.map_or(&[][..], |c| &c.plan.exempt_from),
        );
        let keyed = keyed_partitions(rules, inputs, &skips)?;
        if client.is_none() && keyed.is_empty() {
            return Ok(());
        }
        let asked = Asked::new(rules, client, &keyed, &skips, &mut *record);
        if asked.policies.is_empty() {
            // Everything that applied was exempt: no store call.
            if asked.exempted {
                self.outcome = Outcome::Exempt;
            }
            return Ok(());
        }
        // A request an enforced leaky bucket may hold needs a place before it is counted.
        let place = self.take_place(&asked, client, inputs)?;
        // Leasing spends the plan's own limits, all enforced: not on routes adding a
        // concurrency limit or keyed limits, or dry-running everything.
        let lease = client
            .and_then(|c| c.plan.lease)
            .filter(|_| rules.concurrency.is_none() && rules.keyed.is_empty() && !rules.shadow);
        let slot_id = if asked.policies.iter().any(Policy::is_concurrency) {
            slot_id()
        } else {
            String::new()
        };
        let costs = reservations(rules, client, &asked, inputs, self.cost)?;
        let anonymous = Arc::clone(&rules.name);
        let request = CheckRequest {
            client: client.map_or(&anonymous, |c| &c.id),
            route: &rules.name,
            policies: &asked.policies,
            partitions: &asked.partitions,
            shadow: &asked.shadow,
            cost: self.cost.unwrap_or(rules.cost),
            slot_id: &slot_id,
            at: DecideAt::StoreClock,
            lease,
            waits: &[],
            costs: &costs,
        };
        let Some((divided, verdict)) = self.decide(rules, store, request, &asked, record).await?
        else {
            return Ok(()); // fail_open
        };
        let fallback = divided.is_some();
        let told: &[Policy] = divided.as_deref().unwrap_or(&asked.policies);
        self.show(rules, client, &asked, told, fallback);
        self.keep(told, &verdict, &asked);
        if !verdict.admitted {
            self.refused_keys = refused_keys(told, &verdict, &asked);
            return Err(Reject::TooManyRequests);
        }
        // An admitted leaky bucket's retry-after is the request's turn (dry runs never hold).
        self.delay_ms = told
            .iter()
            .zip(&verdict.decisions)
            .zip(&*asked.shadow)
            .filter(|((p, _), shadow)| p.algorithm == Algorithm::LeakyBucket && !**shadow)
            .map(|((_, d), _)| d.retry_after_ms)
            .max()
            .unwrap_or(0);
        if self.delay_ms > 0 {
            self.place = place;
        }
        self.taken =
            Counted::of(&request, told, &verdict, fallback).map(|t| (Arc::clone(store), t));
        if let Some(client) = client {
            self.hold_slots(rules, store, client, &asked, &verdict, slot_id, fallback);
        }
        Ok(())
    }

    /// A place among the requests leaky buckets hold, when an enforced one may hold this
    /// request (`None` when none may, or there is no bound); refused when the instance's, or
    /// this client's share of them, are all taken.
    fn take_place(
        &mut self,
        asked: &Asked<'_>,
        client: Option<&Arc<Client>>,
        inputs: &KeyInputs<'_>,
    ) -> Result<Option<Place>, Reject> {
        let holds = asked.policies.iter().enumerate().any(|(i, p)| {
            p.algorithm == Algorithm::LeakyBucket && !asked.shadow.get(i).copied().unwrap_or(false)
        });
        let (true, Some((most, share))) = (holds, self.max_delayed) else {
            return Ok(None);
        };
        let owner = Owner::of(client.map(|c| &*c.id), inputs.ip);
        match Place::take(most, share, owner) {
            Ok(place) => Ok(Some(place)),
            Err(Full::Instance) => {
                self.outcome = Outcome::Shed;
                Err(Reject::TooManyWaiting)
            }
            Err(Full::Client) => {
                self.outcome = Outcome::Rejected;
                Err(Reject::WaitingShareTaken)
            }
        }
    }

    /// The store's decision on `request`, each policy's outcome recorded; when the store
    /// cannot decide, the route's failure mode: `Ok(None)` admits (`fail_open`), `Err`
    /// refuses (`fail_closed`), `local` decides by the divided limits it returns.
    async fn decide(
        &mut self,
        rules: &RouteRules,
        store: &Arc<Store>,
        request: CheckRequest<'_>,
        asked: &Asked<'_>,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Result<Option<(Option<Vec<Policy>>, Verdict)>, Reject> {
        let started = self.time_store.then(Instant::now);
        let checked = store.check(request).await;
        if let Some(started) = started {
            let result = checked.as_ref().map_or_else(|e| e.kind(), |_| "ok");
            self.store_call = Some((started, Instant::now(), result));
        }
        match checked {
            Ok(verdict) => {
                for ((policy, d), is_shadow) in asked
                    .policies
                    .iter()
                    .zip(&verdict.decisions)
                    .zip(&*asked.shadow)
                {
                    record(&policy.name, Outcome::of(d.allowed, *is_shadow));
                }
                self.outcome = if verdict.admitted {
                    Outcome::Allowed
                } else {
                    Outcome::Rejected
                };
                Ok(Some((None, verdict)))
            }
            Err(error) => {
                let mode = rules.on_store_error;
                store.note_degraded(&error, mode.as_str());
                let outcome = Outcome::degraded(mode);
                for policy in asked.policies.iter() {
                    record(&policy.name, outcome);
                }
                self.outcome = outcome;
                match mode {
                    FailureMode::FailOpen => Ok(None),
                    FailureMode::FailClosed => Err(Reject::Store(error)),
                    // The client is told the divided limits it is actually held to.
                    FailureMode::Local => {
                        let (divided, verdict) = store.check_fallback(request);
                        Ok(Some((Some(divided), verdict)))
                    }
                }
            }
        }
    }

    /// The enforced decisions feed the `RateLimit` headers; dry runs that would have
    /// refused are named.
    fn keep(&mut self, told: &[Policy], verdict: &Verdict, asked: &Asked<'_>) {
        for ((policy, d), is_shadow) in told.iter().zip(&verdict.decisions).zip(&*asked.shadow) {
            if !*is_shadow {
                self.limits.push(policy, *d);
            } else if !d.allowed {
                self.would_limit.push(Arc::clone(&policy.name));
            }
        }
    }

    /// The concurrency slots the admitted request took, held until it ends.
    #[allow(clippy::too_many_arguments)]
    fn hold_slots(
        &mut self,
        rules: &RouteRules,
        store: &Arc<Store>,
        client: &Arc<Client>,
        asked: &Asked<'_>,
        verdict: &Verdict,
        slot_id: String,
        fallback: bool,
    ) {
        let held: Vec<Policy> = asked
            .policies
            .iter()
            .zip(&verdict.decisions)
            .filter(|(p, d)| p.is_concurrency() && d.allowed)
            .map(|(p, _)| p.clone())
            .collect();
        if held.is_empty() {
            return;
        }
        let ticket = store.hold(HeldSlot {
            client: Arc::clone(&client.id),
            route: Arc::clone(&rules.name),
            policies: held,
            slot_id,
            fallback,
        });
        self.slots = Some(SlotGuard {
            store: Arc::clone(store),
            ticket: Some(ticket),
        });
    }

    /// The `RateLimit-Policy` parts of a decision: the enforced limits only (dry runs are
    /// named in `X-Turnstile-Would-Limit`), none on a dry-run route; rendered once per plan
    /// and route, except when the local fallback divided the limits or a keyed limit was
    /// skipped for lack of its key.
    fn show(
        &mut self,
        rules: &RouteRules,
        client: Option<&Arc<Client>>,
        asked: &Asked<'_>,
        told: &[Policy],
        fallback: bool,
    ) {
        if rules.shadow {
            return;
        }
        if fallback || asked.keyed_skipped {
            let enforced = told
                .iter()
                .zip(&*asked.shadow)
                .filter(|(_, s)| !**s)
                .map(|(p, _)| p);
            let rendered = policy_header(enforced);
            if !rendered.is_empty() {
                self.limits.push_policy_header(
                    HeaderValue::from_str(&rendered).expect("policy names are header-safe"),
                );
            }
            return;
        }
        if let Some(client) = client {
            self.limits
                .push_policy_header(client.plan.policy_header.clone());
            if let Some((_, header)) = &rules.concurrency {
                self.limits.push_policy_header(header.clone());
            }
        }
        if let Some(header) = &rules.keyed_header {
            self.limits.push_policy_header(header.clone());
        }
    }
}

/// What each policy asks when the client's plan has limits charged from the response that
/// reserve other units than the request's cost (empty otherwise: every policy asks `cost`).
/// A bound the request states (`reserve_from`) but gives ambiguously is a 400, like a key.
fn reservations(
    rules: &RouteRules,
    client: Option<&Arc<Client>>,
    asked: &Asked<'_>,
    inputs: &KeyInputs<'_>,
    declared_cost: Option<u64>,
) -> Result<Vec<u64>, Reject> {
    use crate::chain::partition::whole_number;
    use crate::chain::partition::PartError;
    let Some(charged) = client
        .map(|c| &c.plan.response_costs)
        .filter(|charged| !charged.is_empty())
    else {
        return Ok(Vec::new());
    };
    if rules.reserve_from.is_none() && charged.iter().all(|c| c.reserve.is_none()) {
        return Ok(Vec::new());
    }
    let declared = match &rules.reserve_from {
        None => None,
        Some(part) => match whole_number(part, inputs) {
            Ok(n) => Some(n),
            Err(PartError::Missing(_)) => None,
            Err(PartError::Ambiguous(why)) => {
                return Err(Reject::AmbiguousKeyPart(format!(
                    "the bound this request reserves is not readable one way: {why}"
                )))
            }
        },
    };
    let cost = declared_cost.unwrap_or(rules.cost);
    // The plan's own limits only (a route's keyed limit of the same name is not charged).
    let plans = |i: usize| !matches!(asked.partitions.get(i), Some(Partition::Keyed(_)));
    Ok(asked
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| match charged.iter().find(|c| c.limit == p.name) {
            Some(c) if plans(i) => c.reservation(declared, cost),
            _ => cost,
        })
        .collect())
}
/// The keyed limits that refused a request, with their partitions (refusal path only).
fn refused_keys(
    told: &[Policy],
    verdict: &Verdict,
    asked: &Asked<'_>,
) -> Vec<(Arc<str>, Arc<str>)> {
    told.iter()
        .zip(&verdict.decisions)
        .zip(&*asked.partitions)
        .filter(|((_, d), _)| !d.allowed)
        .filter_map(|((p, _), part)| match part {
            Partition::Keyed(key) => Some((Arc::clone(&p.name), Arc::clone(key))),
            Partition::Client => None,
        })
        .collect()
}
