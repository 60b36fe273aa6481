//! One limit across several gateway processes: three `turnstile` binaries share one Redis
//! (or a Redis Cluster; Sentinel: `redis_transport.rs`) and a client's requests are spread
//! over them in parallel. Exactly the limit is admitted, every run — decisions arriving
//! while another call is in flight go as batches, and every one is still made exactly once.
//! With an in-process store per instance the same traffic is admitted three times over —
//! which is why the shared store exists.

use crate::common;

use common::redis::{RedisCluster, RedisServer};
use common::{http, Gateway, Upstream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const KEY: &str = "distributed-key-0123456789";
pub const LIMIT: usize = 100;

pub fn config(upstream: &Upstream, store: &str) -> String {
    format!(
        r#"
{store}

[upstreams.orders]
servers = ["{addr}"]

[plans.daily]
# 100 per day, no burst beyond it: nothing refills during the test.
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = {LIMIT}, window = "1d" }}]

[[clients]]
id = "ada"
plan = "daily"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
"#,
        addr = upstream.addr()
    )
}

/// `total` requests from 50 threads, request i to gateway i % 3. Returns (admitted, 429s).
pub fn hammer(gateways: &[Gateway], total: usize) -> (usize, usize) {
    let ports: Arc<Vec<u16>> = Arc::new(gateways.iter().map(|g| g.port).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let limited = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let (ports, next, ok, limited) = (
                Arc::clone(&ports),
                Arc::clone(&next),
                Arc::clone(&ok),
                Arc::clone(&limited),
            );
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= total {
                    return;
                }
                let resp = http::get_with(ports[i % ports.len()], "/orders", &[("X-Api-Key", KEY)]);
                match resp.status {
                    200 => ok.fetch_add(1, Ordering::SeqCst),
                    429 => limited.fetch_add(1, Ordering::SeqCst),
                    other => panic!("unexpected {other}: {}", resp.text()),
                };
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (ok.load(Ordering::SeqCst), limited.load(Ordering::SeqCst))
}

fn redis_store(url: &str) -> String {
    format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"")
}

#[test]
fn three_gateways_sharing_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    // Heartbeats are EVALSHA calls too: let each instance make its first one, and no other
    // during the count.
    let store = format!("{}\nheartbeat_interval = \"1h\"", redis_store(&redis.url()));
    let text = config(&up, &store);
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    for gw in &gateways {
        common::wait_until("the first heartbeat", || {
            gw.metric("turnstile_live_instances", &[]) >= 1.0
        });
    }
    let before = redis.decision_calls();
    let (ok, limited) = hammer(&gateways, 600);
    assert_eq!((ok, limited), (LIMIT, 600 - LIMIT));
    let calls = redis.decision_calls() - before;
    // Decisions that arrived while another was in flight went as batches (one call each).
    let sum = |name: &str| -> u64 { gateways.iter().map(|g| g.metric(name, &[]) as u64).sum() };
    let batches = sum("turnstile_store_batches_total");
    let batched = sum("turnstile_store_batched_decisions_total");
    println!("{calls} script calls for 600 decisions: {batched} of them in {batches} batches");
    assert_eq!(
        calls - batches + batched,
        600,
        "every decision made exactly once: {calls} calls, {batches} of them batches of {batched}"
    );
}

/// A fleet mid-rollout: two gateways batching and one sending every decision as its own
/// `check.lua` call (`batch_max = 1`, as the versions before batching did — same keys, same
/// stored values) share the counts exactly.
#[test]
fn batching_and_unbatched_gateways_share_the_counts_exactly() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let batched = config(&up, &redis_store(&redis.url()));
    let alone = config(
        &up,
        &format!("{}\nbatch_max = 1", redis_store(&redis.url())),
    );
    let gateways = vec![
        Gateway::start(&batched),
        Gateway::start(&alone),
        Gateway::start(&batched),
    ];
    let (ok, limited) = hammer(&gateways, 600);
    assert_eq!((ok, limited), (LIMIT, 600 - LIMIT));
    assert_eq!(
        gateways[1].metric("turnstile_store_batches_total", &[]),
        0.0,
        "batch_max = 1 sends no batch"
    );
}

/// The same exactness with per-thread event loops (`work_stealing = false`, Pingora's
/// no-steal runtime): two threads per gateway, each driving its own connections.
#[test]
fn gateways_without_work_stealing_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(&up, &redis_store(&redis.url()));
    let gateways: Vec<Gateway> = (0..3)
        .map(|_| Gateway::start_with("work_stealing = false", &text))
        .collect();
    let shown: serde_json::Value =
        serde_json::from_str(&gateways[0].admin("/config").text()).expect("/config is JSON");
    assert_eq!(
        shown["config"]["server"]["work_stealing"],
        serde_json::json!(false),
        "/config shows the setting"
    );
    let (ok, limited) = hammer(&gateways, 600);
    assert_eq!((ok, limited), (LIMIT, 600 - LIMIT));
}

#[test]
fn three_gateways_with_their_own_memory_store_admit_three_times_the_limit() {
    let up = Upstream::start("a");
    let text = config(&up, "[store]\nkind = \"memory\"");
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    // Each instance sees 200 requests and admits its own 100: a local limit multiplies by
    // the number of instances.
    let (ok, _) = hammer(&gateways, 600);
    assert_eq!(ok, 3 * LIMIT);
}

#[test]
fn three_gateways_sharing_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("a");
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    );
    let text = config(&up, &store);
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    let (ok, limited) = hammer(&gateways, 600);
    assert_eq!((ok, limited), (LIMIT, 600 - LIMIT));
}

#[test]
fn the_429_contract_holds_with_the_redis_store() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let store = redis_store(&redis.url());
    let text = format!(
        r#"
{store}

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [
  {{ name = "per-minute", algorithm = "sliding_log", limit = 2, window = "1m" }},
  {{ name = "per-hour", algorithm = "fixed_window", limit = 100, window = "1h" }},
]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
"#,
        addr = up.addr()
    );
    let gw = Gateway::start(&text);
    let first = gw.get_with("/orders", &[("X-Api-Key", KEY)]);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""per-minute";q=2;w=60, "per-hour";q=100;w=3600"#)
    );
    let rl = first.header("ratelimit").unwrap();
    assert!(
        rl.starts_with(r#""per-minute";r=1;t=60, "per-hour";r=99;t="#),
        "{rl}"
    );
    assert_eq!(gw.get_with("/orders", &[("X-Api-Key", KEY)]).status, 200);
    let rejected = gw.get_with("/orders", &[("X-Api-Key", KEY)]);
    assert_eq!(rejected.status, 429);
    // The first entry expires 60 s after it was written: Retry-After is 59 or 60 s.
    let retry: u64 = rejected.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    let rl = rejected.header("ratelimit").unwrap();
    assert!(
        rl.starts_with(r#""per-minute";r=0;t="#) && rl.contains(r#""per-hour";r=98;"#),
        "{rl}"
    );
    assert_eq!(
        rejected.json()["violated-policies"],
        serde_json::json!(["per-minute"])
    );
    // The keys are the client's, under the default prefix, each with a TTL (besides them,
    // only the instances' heartbeat set, what they say of themselves and — once a heartbeat
    // followed the 429 — who they refused lately, with TTLs too).
    // (A first heartbeat that timed out while the machine was busy starting gateways is
    // followed by the next one, an interval later.)
    common::wait_until("the heartbeat's keys", || {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
        keys.iter().any(|k| k == "{turnstile:instances}:info")
    });
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let heartbeat = [
        "turnstile:instances",
        "{turnstile:instances}:info",
        "{turnstile:instances}:limited",
    ];
    for key in heartbeat {
        let present = keys.iter().any(|k| k == key);
        assert!(present || key.ends_with(":limited"), "{keys:?}");
        if present {
            let ttl: i64 = redis.cmd(&["PTTL", key]);
            assert!(ttl > 0, "{key}: {ttl}");
        }
    }
    let keys: Vec<String> = keys
        .into_iter()
        .filter(|k| !heartbeat.contains(&k.as_str()))
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in keys {
        assert!(key.starts_with("turnstile:{ada}:orders:"), "{key}");
        let ttl: i64 = redis.cmd(&["PTTL", &key]);
        assert!(ttl > 0, "{key}: {ttl}");
    }
}
