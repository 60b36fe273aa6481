//! Quota leasing end to end: three `turnstile` processes share one real Redis and spend
//! leased slices of each client's quota locally.
//!
//! The stated bound (src/limit/lease.rs): within one window the units a client is admitted on
//! a route (a plan's limits count per client and route) never exceed the limit, and fall
//! short of it by at most `lease` per instance (the slices left unspent) plus what one
//! request could not fit (`cost - 1`). Every run here sends about twice the limit to each of
//! two routes of different costs in random parallel traffic — random gateways, random
//! interleaving, a random number of threads — and checks both sides of the bound per route,
//! and that Redis was called far less than once per request.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const INSTANCES: u64 = 3;
const LIMIT: u64 = 300;
const LEASE: u64 = 10;
/// Routes (and costs) the traffic is spread over; 3 light requests for each heavy one sends
/// both the same units.
const ROUTES: [(&str, u64); 2] = [("/echo/light", 1), ("/echo/heavy", 3)];
const RUNS: usize = 6;

fn key(i: usize) -> String {
    format!("leasing-key-{i:02}-0123456789")
}

fn config(up: &Upstream, redis: &RedisServer) -> String {
    let clients: String = (0..RUNS + 1)
        .map(|i| {
            let plan = ["fixed", "sliding", "both"][i % 3];
            format!(
                "[[clients]]\nid = \"client-{i}\"\nplan = \"{plan}\"\napi_keys = [\"{}\"]\n\n",
                key(i)
            )
        })
        .collect();
    format!(
        r#"
[store]
kind = "redis"
url = "{url}"
timeout = "2s"
# Few heartbeats, so Redis's EVALSHA count is (nearly) the limiter's calls alone.
heartbeat_interval = "10s"

[upstreams.orders]
servers = ["{addr}"]

[plans.fixed]
limits = [{{ name = "daily", algorithm = "fixed_window", limit = {LIMIT}, window = "1d", lease = {LEASE} }}]

[plans.sliding]
limits = [{{ name = "daily", algorithm = "sliding_window", limit = {LIMIT}, window = "1d", lease = {LEASE} }}]

[plans.both]
limits = [
  {{ name = "daily", algorithm = "fixed_window", limit = {LIMIT}, window = "1d", lease = {LEASE} }},
  {{ name = "per-day", algorithm = "sliding_window", limit = {day}, window = "1d", lease = {LEASE} }},
]

{clients}
[[routes]]
name = "light"
path_prefix = "/echo/light"
upstream = "orders"
auth = "api_key"

[[routes]]
name = "heavy"
path_prefix = "/echo/heavy"
upstream = "orders"
auth = "api_key"
cost = 3
"#,
        url = redis.url(),
        addr = up.addr(),
        day = LIMIT + 100,
    )
}

/// A small deterministic generator (xorshift64*), seeded per run and printed on failure.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Milliseconds on Redis's clock (the clock the windows are aligned on).
fn redis_now_ms(redis: &RedisServer) -> u64 {
    let t: Vec<String> = redis.cmd(&["TIME"]);
    t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
}

/// Every limit here has a window of an hour or a day, aligned on the epoch: a run started
/// a minute or more before the hour ends inside one window of each.
fn away_from_a_window_edge(redis: &RedisServer) {
    let hour = 3_600_000;
    let left = hour - redis_now_ms(redis) % hour;
    if left < 60_000 {
        std::thread::sleep(Duration::from_millis(left + 100));
    }
}

struct Run {
    /// Per route, in `ROUTES` order.
    admitted_units: [u64; 2],
    requests: u64,
    limited: u64,
}

/// `requests` requests from `threads` threads, each to a random gateway and route.
fn traffic(gateways: &[Gateway], client: usize, requests: u64, threads: u64, seed: u64) -> Run {
    let ports: Arc<Vec<u16>> = Arc::new(gateways.iter().map(|g| g.port).collect());
    let sent = Arc::new(AtomicU64::new(0));
    let units = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let limited = Arc::new(AtomicU64::new(0));
    let odd = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (ports, sent, units, limited, odd) = (
                Arc::clone(&ports),
                Arc::clone(&sent),
                Arc::clone(&units),
                Arc::clone(&limited),
                Arc::clone(&odd),
            );
            let mut rng = Rng(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            std::thread::spawn(move || {
                let key = key(client);
                while sent.fetch_add(1, Ordering::SeqCst) < requests {
                    let port = ports[rng.below(ports.len() as u64) as usize];
                    let route = usize::from(rng.below(4) == 0);
                    let (path, cost) = ROUTES[route];
                    let resp = http::get_with(port, path, &[("X-Api-Key", &key)]);
                    match resp.status {
                        200 => {
                            units[route].fetch_add(cost, Ordering::SeqCst);
                        }
                        429 => {
                            limited.fetch_add(1, Ordering::SeqCst);
                            if resp.header("retry-after").is_none()
                                || resp.header("ratelimit-policy").is_none()
                            {
                                odd.lock().unwrap().push("429 without headers".to_owned());
                            }
                        }
                        other => odd
                            .lock()
                            .unwrap()
                            .push(format!("{other}: {}", resp.text())),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let odd = odd.lock().unwrap();
    assert!(odd.is_empty(), "unexpected responses: {odd:?}");
    Run {
        admitted_units: [
            units[0].load(Ordering::SeqCst),
            units[1].load(Ordering::SeqCst),
        ],
        requests,
        limited: limited.load(Ordering::SeqCst),
    }
}

#[test]
fn leased_limits_stay_within_the_stated_bound_over_randomized_runs() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(&up, &redis);
    let gateways: Vec<Gateway> = (0..INSTANCES).map(|_| Gateway::start(&text)).collect();
    let base_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let calls_before = redis.command_calls("evalsha");
    let mut requests = 0;
    for run in 0..RUNS {
        let seed = base_seed.wrapping_add(run as u64 * 7919);
        let mut rng = Rng(seed);
        let threads = 3 + rng.below(10);
        // About twice the limit in units on each route.
        let n = 2 * LIMIT * 4 / 3 + rng.below(100);
        away_from_a_window_edge(&redis);
        let r = traffic(&gateways, run, n, threads, seed);
        let plan = ["fixed", "sliding", "both"][run % 3];
        eprintln!(
            "run {run} ({plan}, seed {seed}, {threads} threads): units admitted per route {:?} of {LIMIT}, {} of {} requests limited",
            r.admitted_units, r.limited, r.requests
        );
        for ((path, cost), units) in ROUTES.iter().zip(r.admitted_units) {
            // Undershoot: one unspent lease per instance, and a request too costly to fit.
            let floor = LIMIT - INSTANCES * LEASE - (cost - 1);
            assert!(
                units <= LIMIT,
                "run {run} (seed {seed}) {path}: overshoot: {units} > {LIMIT}"
            );
            assert!(
                units >= floor,
                "run {run} (seed {seed}) {path}: {units} admitted, below the bound {floor}"
            );
        }
        requests += r.requests;
    }
    let calls = redis.command_calls("evalsha") - calls_before;
    let per_request = calls as f64 / requests as f64;
    eprintln!("{calls} EVALSHA for {requests} requests: {per_request:.3} per request");
    assert!(
        per_request < 0.25,
        "leasing should call Redis far less than once per request: {per_request:.3}"
    );
    let local: f64 = gateways
        .iter()
        .map(|g| g.metric("turnstile_lease_local_decisions_total", &[]))
        .sum();
    assert!(local > requests as f64 / 2.0, "local decisions: {local}");
}

#[test]
fn a_graceful_shutdown_gives_unspent_units_back() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        "grace_period = \"1s\"\ngraceful_shutdown_timeout = \"1s\"",
        &config(&up, &redis),
    );
    let count = || -> u64 {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*{client-0}*daily*"]);
        assert_eq!(keys.len(), 1, "{keys:?}");
        redis.cmd(&["HGET", &keys[0], "c"])
    };
    // Requests until this instance holds leased units it has not spent.
    let mut admitted = 0;
    for _ in 0..100 {
        let resp = gw.get_with("/echo/light", &[("X-Api-Key", &key(0))]);
        assert_eq!(resp.status, 200, "{}", resp.text());
        admitted += 1;
        if count() > admitted {
            break;
        }
    }
    let counted = count();
    assert!(
        counted > admitted,
        "no lease held after {admitted} requests"
    );
    assert!(counted - admitted <= LEASE);
    gw.proc.signal("TERM");
    let mut gw = gw;
    wait_until("the gateway exits", || gw.proc.has_exited());
    assert_eq!(count(), admitted, "unspent units were not given back");
    assert!(gw.proc.log_text().contains("gave back"));
}
