//! Admission against the memory store (and a store that cannot answer).

use super::*;
use crate::chain::auth::Plan;
use crate::chain::partition::{KeyHasher, KeyPart, Missing};
use crate::limit::ip::IpLimiter;
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
        keyed: Vec::new(),
        keyed_header: None,
        hasher: Arc::new(KeyHasher::new(b"test")),
        exempt: Vec::new(),
        reserve_from: None,
    }
}

fn client(policies: Vec<Policy>, shadow: Vec<bool>) -> Arc<Client> {
    Arc::new(Client {
        id: "ada".into(),
        plan: Arc::new(Plan::with_shadow("p", policies, shadow)),
        groups: Vec::new(),
    })
}

fn per_minute(limit: u64) -> Policy {
    Policy::new("per-minute", Algorithm::FixedWindow, limit, 60_000, limit)
}

impl Admission {
    /// `check_limits` for an authenticated client, no keyed inputs.
    async fn check_limits_for(
        &mut self,
        rules: &RouteRules,
        store: &Arc<Store>,
        client: &Arc<Client>,
        slot_id: impl FnOnce() -> String,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Result<(), Reject> {
        let headers = http::HeaderMap::new();
        let inputs = KeyInputs {
            ip: Some(7),
            addr: None,
            client: Some(&client.id),
            route: &rules.name,
            headers: &headers,
            query: None,
            body: None,
            token: None,
            cert: None,
        };
        self.check_limits(rules, store, Some(client), &inputs, slot_id, record)
            .await
    }
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
            .check_limits_for(&r, &store, &c, String::new, &mut recorder(&mut recorded))
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
        .check_limits_for(&r, &store, &c, slot_id, &mut |_, _| {})
        .await
        .is_ok());
    assert!(first.slots.is_some());
    let mut second = Admission::default();
    let refused = second
        .check_limits_for(&r, &store, &c, slot_id, &mut |_, _| {})
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
            .check_limits_for(&r, &store, &c, slot_id, &mut |_, _| {})
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
        auth: Default::default(),
        tls: Default::default(),
        prefix: "t".into(),
        timeout: Duration::from_secs(5),
        slot_ttl: Duration::from_secs(60),
        batch_max: 64,
        batch_in_flight: 2,
        startup_grace: std::time::Duration::from_secs(5),
        decide_with: Default::default(),
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
            .check_limits_for(
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

fn keyed(name: &str, limit: u64, key: &[&str], missing: Missing) -> KeyedLimit {
    KeyedLimit {
        policy: per_minute(limit).renamed(name),
        shadow: false,
        key: key.iter().map(|k| KeyPart::parse(k).unwrap()).collect(),
        missing,
    }
}

fn login_rules(limits: Vec<KeyedLimit>) -> RouteRules {
    RouteRules {
        ip: None,
        keyed_header: KeyedLimit::header(&limits, false),
        keyed: limits,
        ..rules(false, FailureMode::FailClosed)
    }
}

async fn attempt(
    r: &RouteRules,
    store: &Arc<Store>,
    client: Option<&Arc<Client>>,
    ip: u128,
    body: &crate::chain::body::BodyFields,
) -> (Result<(), Reject>, Admission) {
    let headers = http::HeaderMap::new();
    let inputs = KeyInputs {
        ip: Some(ip),
        addr: None,
        client: client.map(|c| &*c.id),
        route: &r.name,
        headers: &headers,
        query: None,
        body: Some(body),
        token: None,
        cert: None,
    };
    let mut a = Admission::default();
    let result = a
        .check_limits(r, store, client, &inputs, String::new, &mut |_, _| {})
        .await;
    (result, a)
}

#[tokio::test]
async fn a_keyed_limit_counts_per_key_whoever_asks() {
    use crate::chain::body::BodyFields;
    let store = Arc::new(Store::memory(StoreMetrics::unregistered()));
    let r = login_rules(vec![keyed(
        "per-account",
        3,
        &["body:username"],
        Missing::Reject,
    )]);
    let ada = BodyFields::from_pairs([("username", "ada")]);
    let bob = BodyFields::from_pairs([("username", "bob")]);
    // Anonymous attempts for one account from three addresses share its count.
    let mut admitted = 0;
    for ip in 1..=5u128 {
        if attempt(&r, &store, None, ip, &ada).await.0.is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    let (refused, a) = attempt(&r, &store, None, 9, &ada).await;
    assert_eq!(refused, Err(Reject::TooManyRequests));
    assert_eq!(a.limits.violated(), ["per-account"]);
    let (_, policy) = &a.limits.headers(false)[0];
    assert_eq!(policy, "\"per-account\";q=3;w=60");
    // Another account is counted apart.
    assert!(attempt(&r, &store, None, 1, &bob).await.0.is_ok());
}

#[tokio::test]
async fn when_one_limit_rejects_the_others_count_nothing() {
    use crate::chain::body::BodyFields;
    let store = Arc::new(Store::memory(StoreMetrics::unregistered()));
    let r = login_rules(vec![keyed(
        "per-account",
        2,
        &["body:username"],
        Missing::Reject,
    )]);
    let c = client(vec![per_minute(100)], vec![false]);
    let ada = BodyFields::from_pairs([("username", "ada")]);
    for _ in 0..4 {
        let _ = attempt(&r, &store, Some(&c), 1, &ada).await;
    }
    // The plan's count moved only for the two admitted requests.
    let other = BodyFields::from_pairs([("username", "bob")]);
    let (ok, a) = attempt(&r, &store, Some(&c), 1, &other).await;
    assert!(ok.is_ok());
    let plan = a
        .limits
        .entries
        .iter()
        .find(|(p, _)| &*p.name == "per-minute");
    assert_eq!(plan.map(|(_, d)| d.remaining), Some(100 - 3));
}

#[tokio::test]
async fn a_missing_key_part_is_refused_skipped_or_shared_as_configured() {
    use crate::chain::body::BodyFields;
    let store = Arc::new(Store::memory(StoreMetrics::unregistered()));
    let nothing = BodyFields::default();
    let reject = login_rules(vec![keyed("a", 1, &["body:username"], Missing::Reject)]);
    let (refused, _) = attempt(&reject, &store, None, 1, &nothing).await;
    assert!(
        matches!(refused, Err(Reject::MissingKeyPart(_))),
        "{refused:?}"
    );
    let skip = login_rules(vec![keyed("b", 1, &["body:username"], Missing::Skip)]);
    for _ in 0..3 {
        let (ok, a) = attempt(&skip, &store, None, 1, &nothing).await;
        assert!(ok.is_ok());
        assert!(a.limits.is_empty(), "a skipped limit is not shown");
    }
    let shared = login_rules(vec![keyed("c", 1, &["body:username"], Missing::Shared)]);
    assert!(attempt(&shared, &store, None, 1, &nothing).await.0.is_ok());
    assert_eq!(
        attempt(&shared, &store, None, 2, &nothing).await.0,
        Err(Reject::TooManyRequests),
        "every request without the field shares one count"
    );
    let twice = BodyFields::parse(
        &[b"application/x-www-form-urlencoded"],
        b"username=ada&username=bob",
    );
    let (ambiguous, _) = attempt(&skip, &store, None, 1, &twice).await;
    assert!(
        matches!(ambiguous, Err(Reject::AmbiguousKeyPart(_))),
        "{ambiguous:?}"
    );
}

/// Every request's future holds the decision's: it is allocated (Pingora boxes each hook's
/// future) and partly copied on every request. A wrapper written as an `async fn` that takes
/// the future it awaits by value keeps it twice, and nesting such wrappers doubled the
/// decision's future at each level (17 KiB in a test build before; under 2 KiB now).
#[test]
fn a_decision_future_stays_small() {
    let store = failing_store();
    let c = client(vec![per_minute(4)], vec![false]);
    let r = rules(false, FailureMode::FailOpen);
    let mut a = Admission::default();
    let mut record = |_: &str, _: Outcome| {};
    let decision = a.check_limits_for(&r, &store, &c, String::new, &mut record);
    let size = std::mem::size_of_val(&decision);
    assert!(size <= 4096, "the decision's future is {size} bytes");
}
