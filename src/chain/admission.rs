//! [3] and [5] of the chain: whether the limits admit a request. The per-IP bucket first (in
//! process, before any key lookup), then — for an authenticated client — the plan's limits
//! and the route's concurrency limit in the store, with the route's failure mode when the
//! store cannot decide.
//!
//! Each step adds what it decided to an [`Admission`]: the outcome (for the access log), the
//! `RateLimit` header parts, the dry-run limits that would have rejected, and the concurrency
//! slots the request holds until it ends. Per-policy outcomes go to a `record` callback (the
//! caller counts them), so nothing here knows about metrics or Pingora.

use crate::chain::auth::Client;
use crate::chain::headers::{policy_header, LimitStatus};
use crate::chain::reject::Reject;
use crate::limit::ip::{IpKey, IpLimiter};
use crate::limit::store::request::{CheckRequest, DecideAt};
use crate::limit::store::{FailureMode, Store};
use crate::limit::{Policy, IP_POLICY_NAME};
use http::HeaderValue;
use std::borrow::Cow;
use std::sync::Arc;

/// How a limiter step ended: per policy (counted in `turnstile_limiter_decisions_total`), and
/// for the request as a whole (the access log's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// No limit applies to the request (or none was reached: it was refused before).
    #[default]
    NotLimited,
    /// Refused by authentication, before any limit.
    Unauthorized,
    Allowed,
    Rejected,
    /// Store failed, route fails open: admitted without a decision.
    DegradedOpen,
    /// Store failed, route fails closed: 503.
    DegradedClosed,
    /// Store failed, decided by the in-process fallback.
    LocalFallback,
    /// A dry-run (shadow) limit that would have rejected the request.
    ShadowRejected,
}

impl Outcome {
    /// The outcomes of a limit's decision (what metrics count per policy).
    pub const DECISIONS: [Outcome; 6] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::DegradedOpen,
        Outcome::DegradedClosed,
        Outcome::LocalFallback,
        Outcome::ShadowRejected,
    ];

    /// This outcome's place in [`DECISIONS`](Self::DECISIONS), if it is a decision's.
    pub fn decision_index(self) -> Option<usize> {
        Outcome::DECISIONS.iter().position(|o| *o == self)
    }

    /// The outcome of one limit's decision.
    pub fn of(allowed: bool, shadow: bool) -> Outcome {
        match (allowed, shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Rejected,
            (false, true) => Outcome::ShadowRejected,
        }
    }

    /// What the route's failure mode made of a decision the store could not take.
    pub fn degraded(mode: FailureMode) -> Outcome {
        match mode {
            FailureMode::FailOpen => Outcome::DegradedOpen,
            FailureMode::FailClosed => Outcome::DegradedClosed,
            FailureMode::Local => Outcome::LocalFallback,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::NotLimited => "not_limited",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Allowed => "allowed",
            Outcome::Rejected => "rejected",
            Outcome::DegradedOpen => "degraded_open",
            Outcome::DegradedClosed => "degraded_closed",
            Outcome::LocalFallback => "local_fallback",
            Outcome::ShadowRejected => "shadow_rejected",
        }
    }
}

/// What admission needs of one route, built once per snapshot.
pub struct RouteRules {
    pub name: Arc<str>,
    /// Units one request costs against the plan's limits.
    pub cost: u64,
    /// Every limit of the route is a dry run.
    pub shadow: bool,
    pub on_store_error: FailureMode,
    /// The per-IP table the route uses, if any.
    pub ip: Option<IpRule>,
    /// The route's own per-client concurrency limit, with its `RateLimit-Policy`.
    pub concurrency: Option<(Policy, HeaderValue)>,
}

/// A per-IP table and its `RateLimit-Policy`, rendered once.
pub struct IpRule {
    pub limiter: Arc<IpLimiter>,
    pub policy_header: HeaderValue,
}

impl IpRule {
    pub fn new(limiter: Arc<IpLimiter>) -> IpRule {
        let header = policy_header(std::iter::once(&limiter.policy));
        IpRule {
            policy_header: HeaderValue::from_str(&header).expect("policy names are header-safe"),
            limiter,
        }
    }
}

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
        self.limits.push(&rule.limiter.policy, decision);
        self.limits.push_policy_header(rule.policy_header.clone());
        if decision.allowed {
            Ok(())
        } else {
            Err(Reject::TooManyRequests)
        }
    }

    /// [4] Authentication refused the request: no limit was reached.
    pub fn unauthorized(&mut self) {
        self.outcome = Outcome::Unauthorized;
    }

    /// [5] The client's plan limits and the route's concurrency limit, decided together in
    /// the store; the route's failure mode when the store cannot decide. `slot_id` names the
    /// slots the request takes if it has concurrency limits.
    pub async fn check_plan(
        &mut self,
        rules: &RouteRules,
        store: &Arc<Store>,
        client: &Arc<Client>,
        slot_id: impl FnOnce() -> String,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Result<(), Reject> {
        let (policies, shadow) = request_policies(rules, &client.plan);
        // Leasing needs the plan's own limits, all enforced: not on routes adding a
        // concurrency limit or dry-running everything.
        let lease = client
            .plan
            .lease
            .filter(|_| rules.concurrency.is_none() && !rules.shadow);
        let slot_id = if policies.iter().any(Policy::is_concurrency) {
            slot_id()
        } else {
            String::new()
        };
        let request = CheckRequest {
            client: &client.id,
            route: &rules.name,
            policies: &policies,
            shadow: &shadow,
            cost: rules.cost,
            slot_id: &slot_id,
            at: DecideAt::StoreClock,
            lease,
        };
        let (divided, verdict) = match store.check(request).await {
            Ok(verdict) => {
                for ((policy, d), is_shadow) in
                    policies.iter().zip(&verdict.decisions).zip(&*shadow)
                {
                    record(&policy.name, Outcome::of(d.allowed, *is_shadow));
                }
                self.outcome = if verdict.admitted {
                    Outcome::Allowed
                } else {
                    Outcome::Rejected
                };
                (None, verdict)
            }
            Err(error) => {
                let mode = rules.on_store_error;
                store.note_degraded(&error, mode.as_str());
                let outcome = Outcome::degraded(mode);
                for policy in policies.iter() {
                    record(&policy.name, outcome);
                }
                self.outcome = outcome;
                match mode {
                    FailureMode::FailOpen => return Ok(()),
                    FailureMode::FailClosed => return Err(Reject::Store(error)),
                    // The client is told the divided limits it is actually held to.
                    FailureMode::Local => {
                        let (divided, verdict) = store.check_fallback(request);
                        (Some(divided), verdict)
                    }
                }
            }
        };
        let fallback = divided.is_some();
        let told: &[Policy] = divided.as_deref().unwrap_or(&policies);
        self.show(rules, client, told, &shadow, fallback);
        for ((policy, d), is_shadow) in told.iter().zip(&verdict.decisions).zip(&*shadow) {
            if !*is_shadow {
                self.limits.push(policy, *d);
            } else if !d.allowed {
                self.would_limit.push(Arc::clone(&policy.name));
            }
        }
        if !verdict.admitted {
            return Err(Reject::TooManyRequests);
        }
        let held: Vec<Policy> = policies
            .iter()
            .zip(&verdict.decisions)
            .filter(|(p, d)| p.is_concurrency() && d.allowed)
            .map(|(p, _)| p.clone())
            .collect();
        if !held.is_empty() {
            self.slots = Some(SlotGuard {
                store: Arc::clone(store),
                client: Arc::clone(&client.id),
                route: Arc::clone(&rules.name),
                policies: held,
                slot_id,
                fallback,
            });
        }
        Ok(())
    }

    /// The `RateLimit-Policy` parts of a plan decision: the enforced limits only (dry runs
    /// are named in `X-Turnstile-Would-Limit`), none on a dry-run route; the divided limits
    /// when the local fallback decided.
    fn show(
        &mut self,
        rules: &RouteRules,
        client: &Client,
        told: &[Policy],
        shadow: &[bool],
        fallback: bool,
    ) {
        if rules.shadow {
            return;
        }
        if fallback {
            let enforced = told
                .iter()
                .zip(shadow)
                .filter(|(_, s)| !**s)
                .map(|(p, _)| p);
            let rendered = policy_header(enforced);
            self.limits.push_policy_header(
                HeaderValue::from_str(&rendered).expect("policy names are header-safe"),
            );
            return;
        }
        self.limits
            .push_policy_header(client.plan.policy_header.clone());
        if let Some((_, header)) = &rules.concurrency {
            self.limits.push_policy_header(header.clone());
        }
    }
}

/// The policies a request on `rules`' route is decided against, with their shadow flags: the
/// plan's (rate limits, client-wide concurrency), then the route's concurrency limit; on a
/// dry-run route every one of them is a dry run. Borrowed (no allocation) in the common case.
pub fn request_policies<'a>(
    rules: &RouteRules,
    plan: &'a crate::chain::auth::Plan,
) -> (Cow<'a, [Policy]>, Cow<'a, [bool]>) {
    if rules.concurrency.is_none() && !rules.shadow {
        return (Cow::Borrowed(&plan.policies), Cow::Borrowed(&plan.shadow));
    }
    let mut policies = plan.policies.clone();
    let mut shadow = plan.shadow.clone();
    if let Some((policy, _)) = &rules.concurrency {
        policies.push(policy.clone());
        shadow.push(false);
    }
    if rules.shadow {
        shadow.iter_mut().for_each(|s| *s = true);
    }
    (Cow::Owned(policies), Cow::Owned(shadow))
}

/// Concurrency slots a request holds; dropping the guard (when the request's context is
/// dropped: response done, upstream failed, client gone) gives them back.
pub struct SlotGuard {
    store: Arc<Store>,
    client: Arc<str>,
    route: Arc<str>,
    policies: Vec<Policy>,
    slot_id: String,
    fallback: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let store = Arc::clone(&self.store);
        let (client, route) = (Arc::clone(&self.client), Arc::clone(&self.route));
        let policies = std::mem::take(&mut self.policies);
        let slot_id = std::mem::take(&mut self.slot_id);
        let fallback = self.fallback;
        let release = async move {
            store
                .release(&client, &route, &policies, &slot_id, fallback)
                .await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release);
            }
            // No runtime (shutdown): Redis slots expire with their TTL.
            Err(_) => log::debug!("no runtime to release concurrency slots"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::auth::Plan;
    use crate::limit::store::redis::{RedisConfig, Topology};
    use crate::limit::store::{FailureSettings, StoreMetrics};
    use crate::limit::{Algorithm, Scope, CONCURRENCY_POLICY_NAME};
    use std::time::Duration;

    fn rules(shadow: bool, mode: FailureMode) -> RouteRules {
        let ip = Policy::new(IP_POLICY_NAME, Algorithm::TokenBucket, 1, 60_000, 2);
        RouteRules {
            name: "orders".into(),
            cost: 1,
            shadow,
            on_store_error: mode,
            ip: Some(IpRule::new(Arc::new(IpLimiter::new(ip, 100)))),
            concurrency: None,
        }
    }

    fn client(policies: Vec<Policy>, shadow: Vec<bool>) -> Arc<Client> {
        Arc::new(Client {
            id: "ada".into(),
            plan: Arc::new(Plan::with_shadow("p", policies, shadow)),
        })
    }

    fn per_minute(limit: u64) -> Policy {
        Policy::new("per-minute", Algorithm::FixedWindow, limit, 60_000, limit)
    }

    /// Outcomes passed to `record`, as (policy, outcome).
    type Recorded = Vec<(String, Outcome)>;

    fn recorder(into: &mut Recorded) -> impl FnMut(&str, Outcome) + '_ {
        |policy, outcome| into.push((policy.to_owned(), outcome))
    }

    #[test]
    fn the_per_ip_bucket_rejects_past_its_burst_and_records_each_decision() {
        let r = rules(false, FailureMode::FailOpen);
        let mut recorded = Recorded::new();
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let mut a = Admission::default();
            let result = a.check_ip(&r, Some(7), 1_000, &mut recorder(&mut recorded));
            outcomes.push((result.is_ok(), a.outcome));
            assert_eq!(a.limits.entries.len(), 1, "the decision feeds the headers");
        }
        assert_eq!(
            outcomes,
            [
                (true, Outcome::Allowed),
                (true, Outcome::Allowed),
                (false, Outcome::Rejected)
            ]
        );
        assert_eq!(recorded.last(), Some(&("ip".to_owned(), Outcome::Rejected)));
        // No address (a Unix socket): nothing to key on, nothing decided.
        let mut a = Admission::default();
        assert!(a.check_ip(&r, None, 1_000, &mut |_, _| {}).is_ok());
        assert_eq!(a.outcome, Outcome::NotLimited);
    }

    #[test]
    fn a_dry_run_route_never_rejects_and_shows_no_limit() {
        let r = rules(true, FailureMode::FailOpen);
        let mut last = Admission::default();
        for _ in 0..3 {
            last = Admission::default();
            assert!(last.check_ip(&r, Some(7), 1_000, &mut |_, _| {}).is_ok());
        }
        assert_eq!(last.outcome, Outcome::ShadowRejected);
        assert!(last.limits.is_empty());
        assert_eq!(last.would_limit, [Arc::from("ip")]);
    }

    #[tokio::test]
    async fn plan_limits_decide_in_the_store_and_count_only_what_they_admit() {
        let store = Arc::new(Store::memory(StoreMetrics::unregistered()));
        let trial = Policy::new("trial", Algorithm::FixedWindow, 1, 60_000, 1);
        let c = client(vec![per_minute(2), trial], vec![false, true]);
        let r = rules(false, FailureMode::FailClosed);
        let mut results = Vec::new();
        let mut last = Admission::default();
        for _ in 0..3 {
            last = Admission::default();
            let mut recorded = Recorded::new();
            let result = last
                .check_plan(&r, &store, &c, String::new, &mut recorder(&mut recorded))
                .await;
            results.push((result, last.outcome));
            assert_eq!(recorded.len(), 2, "one outcome per policy: {recorded:?}");
        }
        assert_eq!(
            results,
            [
                (Ok(()), Outcome::Allowed),
                (Ok(()), Outcome::Allowed),
                (Err(Reject::TooManyRequests), Outcome::Rejected),
            ]
        );
        // The enforced limit is shown; the dry run is only named.
        assert_eq!(last.limits.violated(), ["per-minute"]);
        assert_eq!(last.would_limit, [Arc::from("trial")]);
        let (_, policy) = &last.limits.headers(false)[0];
        assert_eq!(policy, "\"per-minute\";q=2;w=60");
    }

    #[tokio::test]
    async fn concurrency_slots_are_held_by_the_admission_and_given_back_when_it_drops() {
        let store = Arc::new(Store::memory(StoreMetrics::unregistered()));
        let slots = Policy::concurrency(CONCURRENCY_POLICY_NAME, 1, 60_000, Scope::Client).unwrap();
        let c = client(vec![per_minute(100), slots], vec![false, false]);
        let r = rules(false, FailureMode::FailClosed);
        let slot_id = || "slot-1".to_owned();
        let mut first = Admission::default();
        assert!(first
            .check_plan(&r, &store, &c, slot_id, &mut |_, _| {})
            .await
            .is_ok());
        assert!(first.slots.is_some());
        let mut second = Admission::default();
        let refused = second
            .check_plan(&r, &store, &c, slot_id, &mut |_, _| {})
            .await;
        assert_eq!(refused, Err(Reject::TooManyRequests));
        assert_eq!(second.limits.violated(), ["concurrency"]);
        drop(first);
        // The release runs as a task; it is done after a few turns of the runtime.
        let mut admitted = false;
        for _ in 0..100 {
            tokio::task::yield_now().await;
            let mut again = Admission::default();
            if again
                .check_plan(&r, &store, &c, slot_id, &mut |_, _| {})
                .await
                .is_ok()
            {
                admitted = true;
                break;
            }
        }
        assert!(admitted, "the slot came back");
    }

    /// A Redis store on a port nobody listens on: every call fails at once.
    fn failing_store() -> Arc<Store> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = RedisConfig {
            topology: Topology::Single(format!("redis://127.0.0.1:{port}")),
            prefix: "t".into(),
            timeout: Duration::from_secs(5),
            slot_ttl: Duration::from_secs(60),
        };
        let failure = FailureSettings {
            breaker_failures: 1000,
            breaker_cooldown: Duration::from_secs(1),
            expected_instances: 2,
            heartbeat_interval: Duration::from_secs(1),
        };
        Arc::new(Store::redis(config, failure, StoreMetrics::unregistered()).unwrap())
    }

    #[tokio::test]
    async fn when_the_store_fails_the_route_decides_open_closed_or_locally() {
        let store = failing_store();
        let c = client(vec![per_minute(4)], vec![false]);
        let mut outcomes = Vec::new();
        for mode in [
            FailureMode::FailOpen,
            FailureMode::FailClosed,
            FailureMode::Local,
        ] {
            let mut a = Admission::default();
            let mut recorded = Recorded::new();
            let result = a
                .check_plan(
                    &rules(false, mode),
                    &store,
                    &c,
                    String::new,
                    &mut recorder(&mut recorded),
                )
                .await;
            assert_eq!(recorded, [("per-minute".to_owned(), a.outcome)]);
            outcomes.push((mode, result.map_err(|e| e.kind()), a.outcome));
            if mode == FailureMode::Local {
                // Two instances expected: each is held to half, and is told so.
                let (_, policy) = &a.limits.headers(false)[0];
                assert_eq!(policy, "\"per-minute\";q=2;w=60");
            }
        }
        use crate::chain::problem::Kind;
        assert_eq!(
            outcomes,
            [
                (FailureMode::FailOpen, Ok(()), Outcome::DegradedOpen),
                (
                    FailureMode::FailClosed,
                    Err(Kind::LimiterUnavailable),
                    Outcome::DegradedClosed
                ),
                (FailureMode::Local, Ok(()), Outcome::LocalFallback),
            ]
        );
    }

    #[test]
    fn one_mapping_from_a_decision_to_an_outcome() {
        assert_eq!(Outcome::of(true, false), Outcome::Allowed);
        assert_eq!(Outcome::of(true, true), Outcome::Allowed);
        assert_eq!(Outcome::of(false, false), Outcome::Rejected);
        assert_eq!(Outcome::of(false, true), Outcome::ShadowRejected);
        for (i, o) in Outcome::DECISIONS.iter().enumerate() {
            assert_eq!(o.decision_index(), Some(i));
        }
        assert_eq!(Outcome::NotLimited.decision_index(), None);
        assert_eq!(Outcome::Unauthorized.decision_index(), None);
    }
}
