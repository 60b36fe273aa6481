//! The Redis store against a real redis-server (and a real 3-node Redis Cluster), driven
//! through the library with explicit times where a scenario must be replayed exactly.

use crate::common;

use common::redis::{RedisCluster, RedisServer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use turnstile::chain::headers::retry_after;
use turnstile::limit::store::held::Due;
use turnstile::limit::store::redis::{LeaseCall, RedisConfig, RedisStore, Topology};
use turnstile::limit::store::request::{CheckRequest, DecideAt};
use turnstile::limit::store::StoreError;
use turnstile::limit::{Algorithm, Policy, Verdict};

/// A window boundary for 1 s windows, in explicit milliseconds.
const EDGE: u64 = 1_000_000_000_000;

/// One request of `cost` against enforced `policies`, at `at` (explicit ms) or Redis's clock.
async fn check_limits(
    s: &RedisStore,
    client: &str,
    route: &str,
    policies: &[Policy],
    cost: u64,
    at: Option<u64>,
) -> Result<Verdict, StoreError> {
    let (client, route): (Arc<str>, Arc<str>) = (client.into(), route.into());
    let request = CheckRequest {
        at: at.map_or(DecideAt::StoreClock, DecideAt::Fixed),
        ..CheckRequest::new(&client, &route, policies, cost)
    };
    s.check(&request).await
}

fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::new(RedisConfig {
        topology: Topology::Single(server.url()),
        auth: Default::default(),
        tls: Default::default(),
        prefix: prefix.into(),
        timeout: Duration::from_secs(5),
        slot_ttl: Duration::from_secs(60),
        batch_max: 64,
        batch_in_flight: 2,
        startup_grace: std::time::Duration::from_secs(5),
        decide_with: Default::default(),
    })
    .unwrap()
}

async fn run(store: &RedisStore, client: &str, policies: &[Policy], times: &[u64]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for &t in times {
        out.push(
            check_limits(store, client, "route", policies, 1, Some(t))
                .await
                .unwrap(),
        );
    }
    out
}

fn admitted(verdicts: &[Verdict]) -> usize {
    verdicts.iter().filter(|v| v.admitted).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_admits_a_double_burst_across_the_edge_the_others_do_not() {
    let server = RedisServer::start();
    let s = store(&server, "edges");
    let burst: Vec<u64> = [vec![EDGE - 1; 10], vec![EDGE; 10]].concat();

    let fixed = [Policy::new("fw", Algorithm::FixedWindow, 10, 1000, 10)];
    assert_eq!(
        admitted(&run(&s, "fixed", &fixed, &burst).await),
        20,
        "fixed window: 2x at the edge"
    );

    let sliding = [Policy::new("sw", Algorithm::SlidingWindow, 10, 1000, 10)];
    let v = run(&s, "sliding", &sliding, &burst).await;
    assert_eq!(admitted(&v), 10);
    // First rejection, at the edge: the previous window weighs 1000/1000; one unit fits when
    // 10·(1000 - e) <= 9·1000, i.e. after 100 ms. Retry-After rounds that up to 1 s.
    let first = &v[10].decisions[0];
    assert!(!first.allowed);
    assert_eq!(first.retry_after_ms, 100);
    assert_eq!(retry_after(first.retry_after_ms), 1);
    // Later in the window the previous window's weight has released its share: at +500 ms
    // it weighs half, so 5 of the previous 10 are forgiven.
    let later = run(&s, "sliding", &sliding, &[EDGE + 500; 6]).await;
    assert_eq!(admitted(&later), 5);

    let bucket = [Policy::new("tb", Algorithm::TokenBucket, 10, 1000, 10)];
    let v = run(&s, "bucket", &bucket, &burst).await;
    assert_eq!(
        admitted(&v),
        10,
        "token bucket: 1 ms refills 1/100 of a token"
    );
    assert_eq!(v[10].decisions[0].retry_after_ms, 99);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_one_call_that_commits_only_if_all_admit() {
    let server = RedisServer::start();
    let s = store(&server, "multi");
    let policies = [
        Policy::new("per-second", Algorithm::TokenBucket, 10, 1000, 10),
        Policy::new("per-day", Algorithm::SlidingWindow, 3, 86_400_000, 3),
        Policy::new("per-minute", Algorithm::SlidingLog, 5, 60_000, 5),
        Policy::new("per-hour", Algorithm::FixedWindow, 50, 3_600_000, 50),
    ];
    let before = server.decision_calls();
    let v = run(&s, "ada", &policies, &[EDGE, EDGE + 1, EDGE + 2, EDGE + 3]).await;
    let after = server.decision_calls();
    assert_eq!(
        after - before,
        4,
        "one script call per decision, whatever the number of limits"
    );
    assert_eq!(admitted(&v), 3);
    let rejected = &v[3];
    assert!(!rejected.decisions[1].allowed);
    // The others admitted but nothing was written: they report their state as it stays.
    assert_eq!(rejected.decisions[0].remaining, 7);
    assert_eq!(rejected.decisions[2].remaining, 2);
    assert_eq!(rejected.decisions[3].remaining, 47);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_written_key_has_a_ttl() {
    let server = RedisServer::start();
    let s = store(&server, "ttl");
    let policies = [
        Policy::new("tb", Algorithm::TokenBucket, 10, 60_000, 10),
        Policy::new("fw", Algorithm::FixedWindow, 10, 60_000, 10),
        Policy::new("sw", Algorithm::SlidingWindow, 10, 60_000, 10),
        Policy::new("sl", Algorithm::SlidingLog, 10, 60_000, 10),
    ];
    for client in ["a", "b", "c"] {
        for _ in 0..3 {
            // Redis's own clock here (no explicit time).
            assert!(
                check_limits(&s, client, "route", &policies, 1, None)
                    .await
                    .unwrap()
                    .admitted
            );
        }
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "ttl:*"]);
    assert_eq!(keys.len(), 12, "{keys:?}");
    for key in keys {
        // At most the longest relevance (a sliding window: two windows) plus the grace.
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(ttl > 0 && ttl <= 120_000 + 1_000, "{key} has PTTL {ttl}");
    }
}

/// A rolling upgrade from the buckets' first form (a HASH at `…@tb<limit>/…`, `…@lb<limit>/…`)
/// to their second (a STRING at `…@tb2:<limit>/…`, `…@lb2:<limit>/…`): the two versions never
/// share a key, so neither meets a key of the other's type (a WRONGTYPE error would fail the
/// request by its route's failure mode). Each counts apart — the allowance CHANGELOG states: a
/// client the old gateways emptied (token bucket) or filled (leaky bucket) starts afresh on
/// the new ones — and the old key is left as it is, for the old gateways still serving, until
/// its TTL ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_of_the_first_form_is_left_to_the_gateways_that_wrote_it() {
    let server = RedisServer::start();
    let s = store(&server, "up");
    let edge = EDGE.to_string();
    let token = Policy::new("per-second", Algorithm::TokenBucket, 10, 1000, 10);
    let leaky = Policy::leaky_bucket("smooth", 10, 1000, 10, 0).unwrap();
    // What gateways of the first form leave: a token bucket emptied (level 0) and a leaky
    // bucket whose backlog (10 requests) holds the next request for a second, both at EDGE.
    let cases = [
        (
            token,
            "up:{ada}:route:per-second@tb10/1000/10",
            "0",
            "up:{ada}:route:per-second@tb2:10/1000/10",
        ),
        (
            leaky,
            "up:{ada}:route:smooth@lb10/1000/10/0",
            "10000",
            "up:{ada}:route:smooth@lb2:10/1000/10/0",
        ),
    ];
    for (policy, old, level, named) in cases {
        let _: i64 = server.cmd(&["HSET", old, "l", level, "t", &edge]);
        let _: i64 = server.cmd(&["PEXPIRE", old, "600000"]);
        let policies = [policy];
        let v = run(&s, "ada", &policies, &[EDGE; 10]).await;
        assert_eq!(admitted(&v), 10, "{old}: the second form counts apart");
        assert_eq!(
            v[0].wait_of(&policies, 0),
            0,
            "{old}: at once, as an empty backlog"
        );
        let new = s.key("ada", "route", &policies[0]);
        assert_eq!(new, named);
        assert_eq!(server.cmd::<String>(&["TYPE", &new]), "string");
        // The first form's key is untouched, TTL and all.
        assert_eq!(server.cmd::<String>(&["TYPE", old]), "hash");
        let fields: Vec<String> = server.cmd(&["HMGET", old, "l", "t"]);
        assert_eq!(fields, [level.to_owned(), edge.clone()]);
        assert!(server.cmd::<i64>(&["PTTL", old]) > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_is_recovered_transparently() {
    // The scripts' own recovery: a Redis without the module, whatever the suite's run.
    let server = RedisServer::start_plain();
    let s = store(&server, "noscript");
    let p = [Policy::new("p", Algorithm::FixedWindow, 100, 60_000, 100)];
    assert!(
        check_limits(&s, "ada", "r", &p, 1, None)
            .await
            .unwrap()
            .admitted
    );
    let exists: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", s.script_sha()]);
    assert_eq!(exists, [1]);
    let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
    let exists: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", s.script_sha()]);
    assert_eq!(exists, [0]);
    let v = check_limits(&s, "ada", "r", &p, 1, None).await.unwrap();
    assert!(v.admitted);
    assert_eq!(v.decisions[0].remaining, 98, "the count survived the flush");
    let exists: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", s.script_sha()]);
    assert_eq!(exists, [1], "the script was loaded again");
}

/// What the scripts exist to prevent: read, then write, from many clients at once.
async fn naive_limiter(url: String, key: String, limit: u64, admitted: Arc<AtomicU64>) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let count: Option<u64> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The network between the read and the write: other clients read the same count meanwhile.
    tokio::time::sleep(Duration::from_millis(2)).await;
    if count.unwrap_or(0) < limit {
        let _: u64 = redis::cmd("INCR")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        admitted.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_then_write_over_admits_under_parallel_load_the_script_does_not() {
    let server = RedisServer::start();
    let limit = 50;
    let naive = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            tokio::spawn(naive_limiter(
                server.url(),
                "naive".into(),
                limit,
                Arc::clone(&naive),
            ))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let naive = naive.load(Ordering::SeqCst);
    assert!(
        naive > limit,
        "naive GET+INCR admitted {naive} (limit {limit})"
    );

    let s = Arc::new(store(&server, "atomic"));
    let p = Arc::new([Policy::new(
        "p",
        Algorithm::FixedWindow,
        limit,
        3_600_000,
        limit,
    )]);
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let (s, p) = (Arc::clone(&s), Arc::clone(&p));
            tokio::spawn(async move {
                check_limits(&s, "ada", "r", &p[..], 1, None)
                    .await
                    .unwrap()
                    .admitted
            })
        })
        .collect();
    let mut atomic = 0;
    for t in tasks {
        if t.await.unwrap() {
            atomic += 1;
        }
    }
    // The only way across an hour boundary mid-test would be a second window: allow for it
    // explicitly rather than flake.
    assert!(
        atomic == limit || atomic == 2 * limit,
        "script admitted {atomic}"
    );
    println!("naive read-then-write admitted {naive}, the script {atomic}, limit {limit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keys_of_one_client_share_a_slot_and_the_limit_is_exact() {
    let cluster = RedisCluster::start();
    let s = Arc::new(
        RedisStore::new(RedisConfig {
            topology: Topology::Cluster(cluster.urls()),
            auth: Default::default(),
            tls: Default::default(),
            prefix: "cl".into(),
            timeout: Duration::from_secs(5),
            slot_ttl: Duration::from_secs(60),
            batch_max: 64,
            batch_in_flight: 2,
            startup_grace: std::time::Duration::from_secs(5),
            decide_with: Default::default(),
        })
        .unwrap(),
    );
    let policies = Arc::new(vec![
        Policy::new("burst", Algorithm::TokenBucket, 20, 86_400_000, 20),
        Policy::new("per-hour", Algorithm::SlidingLog, 1000, 3_600_000, 1000),
    ]);
    let clients: Vec<String> = (0..12).map(|i| format!("client-{i}")).collect();
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..60 {
            let (s, p, c) = (Arc::clone(&s), Arc::clone(&policies), client.clone());
            tasks.push(tokio::spawn(async move {
                (
                    c.clone(),
                    check_limits(&s, &c, "r", &p, 1, None)
                        .await
                        .unwrap()
                        .admitted,
                )
            }));
        }
    }
    let mut per_client = std::collections::HashMap::<String, usize>::new();
    for t in tasks {
        let (c, ok) = t.await.unwrap();
        if ok {
            *per_client.entry(c).or_default() += 1;
        }
    }
    for c in &clients {
        assert_eq!(per_client.get(c), Some(&20), "{c}: {per_client:?}");
    }
    let keys = cluster.all_keys();
    assert_eq!(keys.len(), clients.len() * 2);
    let slot = |key: &str| -> i64 { cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]) };
    let mut nodes_used = std::collections::HashSet::new();
    for c in &clients {
        let mine: Vec<&(u16, String)> = keys
            .iter()
            .filter(|(_, k)| k.contains(&format!("{{{c}}}")))
            .collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(
            slot(&mine[0].1),
            slot(&mine[1].1),
            "{c}'s keys are in different slots"
        );
        assert_eq!(mine[0].0, mine[1].0);
        nodes_used.insert(mine[0].0);
        for (port, key) in mine {
            let node = cluster.nodes.iter().find(|n| n.port == *port).unwrap();
            let ttl: i64 = node.cmd(&["PTTL", key]);
            assert!(ttl > 0, "{key}: {ttl}");
        }
    }
    assert!(
        nodes_used.len() > 1,
        "clients should spread over the cluster's nodes"
    );
}

fn lease_call<'a>(
    policies: &'a [Policy],
    need: u64,
    want: u64,
    give_back: (u64, &'a [u64]),
    now: u64,
) -> LeaseCall<'a> {
    LeaseCall {
        client: "lessee",
        route: "route",
        policies,
        need,
        want,
        give_back: give_back.0,
        give_back_starts: give_back.1,
        at: DecideAt::Fixed(now),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_takes_the_same_slice_of_every_limit_in_the_keys_requests_use() {
    let server = RedisServer::start();
    let s = store(&server, "lease");
    let plan = [
        Policy::new("second", Algorithm::FixedWindow, 10, 1000, 10),
        Policy::new("minute", Algorithm::SlidingWindow, 25, 60_000, 25),
    ];
    let t = EDGE * 60 + 200;
    // Wants 8, every limit can spare it.
    let g = s.lease(lease_call(&plan, 1, 8, (0, &[]), t)).await.unwrap();
    assert_eq!((g.granted, g.rejected), (8, None));
    assert_eq!((g.windows[0].remaining, g.windows[1].remaining), (2, 17));
    assert_eq!(g.windows[0].reset_ms, 800);
    assert_eq!(g.windows[0].start, t - 200);
    // A per-request check sees the leased units as spent.
    let v = check_limits(&s, "lessee", "route", &plan, 1, Some(t))
        .await
        .unwrap();
    assert_eq!(v.decisions[0].remaining, 1);
    // Wants 8 again: the second-limit can spare only 1 — granted, as it covers the need.
    let g = s.lease(lease_call(&plan, 1, 8, (0, &[]), t)).await.unwrap();
    assert_eq!(g.granted, 1);
    // Nothing left: refused, naming the limit, with when it would fit; nothing written.
    let g = s.lease(lease_call(&plan, 1, 8, (0, &[]), t)).await.unwrap();
    assert_eq!((g.granted, g.rejected), (0, Some(0)));
    assert_eq!(g.windows[0].retry_after_ms, 800);
    assert_eq!(g.windows[1].remaining, 15);
    // Next seconds: the minute limit runs out first and is named.
    let g = s
        .lease(lease_call(&plan, 10, 10, (0, &[]), t + 1000))
        .await
        .unwrap();
    assert_eq!((g.granted, g.windows[1].remaining), (10, 5));
    let g = s
        .lease(lease_call(&plan, 10, 10, (0, &[]), t + 2000))
        .await
        .unwrap();
    assert_eq!((g.granted, g.rejected), (0, Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspent_units_go_back_to_their_window_and_lapse_after_it() {
    let server = RedisServer::start();
    let s = store(&server, "giveback");
    let fixed = [Policy::new("f", Algorithm::FixedWindow, 10, 1000, 10)];
    let sliding = [Policy::new("s", Algorithm::SlidingWindow, 10, 1000, 10)];
    let t = EDGE + 100;
    for plan in [&fixed, &sliding] {
        let g = s.lease(lease_call(plan, 1, 10, (0, &[]), t)).await.unwrap();
        assert_eq!(g.granted, 10);
        // Given back at shutdown, in the same window: 6 of the 10 come back.
        let back = s
            .give_back("lessee", "route", plan, &[EDGE], 6)
            .await
            .unwrap();
        assert_eq!(back, 6);
        let v = check_limits(&s, "lessee", "route", plan, 1, Some(t))
            .await
            .unwrap();
        assert_eq!(v.decisions[0].remaining, 5);
    }
    // One window later: the fixed window's units lapsed (once it counts a new window, there
    // is nothing to give back to); the sliding window still weighs the previous window, which
    // a renewal's give-back lightens.
    check_limits(&s, "lessee", "route", &fixed, 1, Some(EDGE + 1000))
        .await
        .unwrap();
    let fixed_back = s
        .give_back("lessee", "route", &fixed, &[EDGE], 5)
        .await
        .unwrap();
    assert_eq!(fixed_back, 0);
    let later = EDGE + 1000;
    let g = s
        .lease(lease_call(&sliding, 1, 10, (0, &[]), later))
        .await
        .unwrap();
    assert_eq!(
        g.granted,
        10 - 5,
        "the previous window's 5 weigh fully at its end"
    );
    let g = s
        .lease(lease_call(&sliding, 1, 10, (5, &[EDGE]), later + 1))
        .await
        .unwrap();
    assert!(g.granted >= 4, "{g:?}");
    // Two windows later nothing is given back.
    let back = s
        .give_back("lessee", "route", &sliding, &[EDGE - 1000], 5)
        .await
        .unwrap();
    assert_eq!(back, 0);
}

/// Takes a concurrency slot `slot_id` for `client`; returns the renewal entry for it.
async fn take_slot(s: &RedisStore, client: &str, policy: &Policy, slot_id: &str, id: u64) -> Due {
    let (c, r): (Arc<str>, Arc<str>) = (client.into(), "r".into());
    let policies = [policy.clone()];
    let request = CheckRequest {
        slot_id,
        ..CheckRequest::new(&c, &r, &policies, 1)
    };
    assert!(s.check(&request).await.unwrap().admitted);
    Due {
        id,
        client: c,
        route: r,
        policy: policy.clone(),
        slot_id: slot_id.to_owned(),
        ttl_ms: 60_000,
    }
}

/// The renewals of many requests' slots are one script call on one Redis, whatever the
/// number of requests and clients; on a Cluster one call per client (its hash tag), never a
/// CROSSSLOT. A slot already released is not taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slots_of_many_requests_are_renewed_in_one_call_per_redis_or_per_cluster_client() {
    let slot = Policy::new("cc", Algorithm::Concurrency, 100, 2_000, 100);
    let server = RedisServer::start();
    let s = store(&server, "renew");
    let mut due = Vec::new();
    for i in 0..60u64 {
        let client = format!("client-{}", i % 3);
        due.push(take_slot(&s, &client, &slot, &format!("slot-{i}"), i).await);
    }
    // One released before the renewal: not taken again.
    s.release(
        &due[0].client,
        &due[0].route,
        std::slice::from_ref(&slot),
        "slot-0",
    )
    .await
    .unwrap();
    let before = server.command_calls("evalsha");
    let failed = s.renew_slots(&due, Duration::from_secs(5)).await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(server.command_calls("evalsha") - before, 1, "one call");
    for client in ["client-0", "client-1", "client-2"] {
        let key = s.key(client, "r", &slot);
        let live: Vec<(String, f64)> = server.cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]);
        assert_eq!(
            live.len(),
            if client == "client-0" { 19 } else { 20 },
            "{client}"
        );
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(ttl > 2_000, "{key}: the key outlives its slots: {ttl}");
    }

    let cluster = RedisCluster::start();
    let c = RedisStore::new(RedisConfig {
        topology: Topology::Cluster(cluster.urls()),
        auth: Default::default(),
        tls: Default::default(),
        prefix: "renew".into(),
        timeout: Duration::from_secs(5),
        slot_ttl: Duration::from_secs(2),
        batch_max: 64,
        batch_in_flight: 2,
        startup_grace: std::time::Duration::from_secs(5),
        decide_with: Default::default(),
    })
    .unwrap();
    let mut due = Vec::new();
    for i in 0..40u64 {
        let client = format!("client-{}", i % 8);
        due.push(take_slot(&c, &client, &slot, &format!("slot-{i}"), i).await);
    }
    let failed = c.renew_slots(&due, Duration::from_secs(5)).await;
    assert!(failed.is_empty(), "{failed:?}");
    // Renewed: the slots outlive their first 2 s (still live by Redis's clock).
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let live: usize = cluster
        .all_keys()
        .iter()
        .map(|(port, key)| {
            let node = cluster.nodes.iter().find(|n| n.port == *port).unwrap();
            let time: Vec<String> = node.cmd(&["TIME"]);
            let now_ms =
                time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
            node.cmd::<i64>(&["ZCOUNT", key, &format!("({now_ms}"), "+inf"]) as usize
        })
        .sum();
    assert_eq!(live, 40);
}
