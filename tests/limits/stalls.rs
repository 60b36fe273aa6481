//! Redis stalling for longer than `store.timeout` (`CLIENT PAUSE … ALL` on a real
//! redis-server): the calls the gateway gave up on still run when Redis wakes up. They must
//! not leave state behind — concurrency slots nobody releases, leased units nobody spends —
//! and `/readyz` must say when Redis answers only with errors.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const KEY: &str = "stall-key-0123456789abcdef";

fn config(up: &Upstream, redis: &RedisServer, store_extra: &str, plan: &str) -> String {
    let route = |name: &str, mode: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"/echo/{name}\"\nupstream = \"orders\"\nauth = \"api_key\"\non_store_error = \"{mode}\"\n"
        )
    };
    format!(
        r#"
[store]
kind = "redis"
url = "{url}"
timeout = "50ms"
# The breaker stays closed: every request reaches Redis (and times out) during a stall.
breaker_failures = 100000
heartbeat_interval = "10s"
{store_extra}

[upstreams.orders]
servers = ["{addr}"]

[plans.p]
{plan}

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

{open}
{closed}
"#,
        url = redis.url(),
        addr = up.addr(),
        open = route("open", "fail_open"),
        closed = route("closed", "fail_closed"),
    )
}

fn get(gw: &Gateway, path: &str) -> http::Response {
    gw.get_with(path, &[("X-Api-Key", KEY)])
}

/// Pauses every client of `redis` for `ms` (the test's own connection included).
fn pause(redis: &RedisServer, ms: u64) {
    let _: String = redis.cmd(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
}

/// Returns once the pause is over (a command of ours waits for it like every other).
fn wait_for_the_pause_to_end(redis: &RedisServer) {
    let _: String = redis.cmd(&["PING"]);
}

#[test]
fn calls_given_up_on_during_a_stall_leave_no_concurrency_slot_behind() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let plan = "limits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000, window = \"1h\" }]\nmax_concurrent = 2";
    // A slot that leaked would stay taken for 10 minutes: far longer than this test.
    let gw = Gateway::start(&config(&up, &redis, "concurrency_slot_ttl = \"10m\"", plan));
    assert_eq!(get(&gw, "/echo/open/warm").status, 200);
    for (route, during) in [("open", 200), ("closed", 503)] {
        let path = format!("/echo/{route}/x");
        pause(&redis, 1500);
        // Both time out: the route's failure mode answers. Their scripts run when Redis
        // wakes up, and take the client's two slots.
        assert_eq!(
            [get(&gw, &path).status, get(&gw, &path).status],
            [during; 2]
        );
        wait_for_the_pause_to_end(&redis);
        // The first request Redis decides again (it carries RateLimit headers; one that
        // still fell into the stall does not) finds both slots free: it holds the only one.
        let mut decided = None;
        wait_until(&format!("{route}: a request decided by Redis"), || {
            let resp = get(&gw, &path);
            let is_decided = resp.header("ratelimit").is_some();
            if is_decided {
                decided = Some(resp);
            }
            is_decided
        });
        let resp = decided.unwrap();
        assert_eq!(resp.status, 200, "{route}: {}", resp.text());
        let ratelimit = resp.header("ratelimit").unwrap();
        assert!(
            ratelimit.contains("\"concurrency\";r=1"),
            "{route}: slots leaked by the stalled calls: {ratelimit}"
        );
    }
    // And every slot is back once the requests are over.
    wait_until("every slot released", || {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*{ada}*concurrency*"]);
        keys.iter().all(|k| redis.cmd::<i64>(&["ZCARD", k]) == 0)
    });
}

/// Leasing with two stalls in the middle of the traffic: grants Redis made for renewals the
/// gateway had stopped waiting for still become spendable units, so the client gets its whole
/// quota — where units used to be counted in Redis and never spent.
#[test]
fn leased_units_granted_during_a_stall_are_spent_not_lost() {
    const LIMIT: u64 = 3000;
    const LEASE: u64 = 200;
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let plan = format!(
        "limits = [{{ name = \"daily\", algorithm = \"fixed_window\", limit = {LIMIT}, window = \"1d\", lease = {LEASE} }}]"
    );
    let gw = Gateway::start(&config(&up, &redis, "", &plan));
    away_from_the_hour_edge(&redis);

    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let others = Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (admitted, stop, others) = (
                Arc::clone(&admitted),
                Arc::clone(&stop),
                Arc::clone(&others),
            );
            let port = gw.port;
            std::thread::spawn(move || {
                let mut quota_refusals = 0;
                // Until the quota is spent: a run of refusals (429) from the quota.
                while quota_refusals < 20 && !stop.load(Ordering::SeqCst) {
                    let resp = http::get_with(port, "/echo/closed/x", &[("X-Api-Key", KEY)]);
                    match resp.status {
                        200 => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                            quota_refusals = 0;
                        }
                        429 => quota_refusals += 1,
                        // fail_closed while Redis stalls: not admitted, not counted.
                        503 => quota_refusals = 0,
                        other => others.lock().unwrap().push(other),
                    }
                }
            })
        })
        .collect();
    for third in [1, 2] {
        wait_until(&format!("{third}/3 of the quota admitted"), || {
            admitted.load(Ordering::SeqCst) >= LIMIT * third / 3
        });
        pause(&redis, 300);
        wait_for_the_pause_to_end(&redis);
    }
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    assert!(others.lock().unwrap().is_empty(), "{:?}", others.lock());
    let admitted = admitted.load(Ordering::SeqCst);
    let keys: Vec<String> = redis.cmd(&["KEYS", "*{ada}*daily*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let counted: u64 = redis
        .cmd::<String>(&["HGET", &keys[0], "c"])
        .parse()
        .unwrap();
    // Never more than the limit, counted or admitted...
    assert!(
        counted <= LIMIT && admitted <= counted,
        "{admitted} of {counted}"
    );
    // ...and what Redis counted was spent: the stated bound (one lease per instance, and
    // a request of cost 1 always fits) holds across the stalls.
    assert!(
        counted - admitted <= LEASE && LIMIT - admitted <= LEASE,
        "admitted {admitted}, Redis counted {counted}, limit {LIMIT}: more than one lease ({LEASE}) lost"
    );
}

/// Windows of an hour are aligned on Redis's clock: start a minute or more before the edge.
fn away_from_the_hour_edge(redis: &RedisServer) {
    let t: Vec<String> = redis.cmd(&["TIME"]);
    let now = t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000;
    let left = 3_600_000 - now % 3_600_000;
    if left < 60_000 {
        std::thread::sleep(Duration::from_millis(left + 100));
    }
}

#[test]
fn readyz_tells_a_store_that_answers_only_with_errors() {
    let redis = RedisServer::start();
    // From now on this server wants a password (the harness is done talking to it).
    let _: String = redis.cmd(&["CONFIG", "SET", "requirepass", "right-password"]);
    let up = Upstream::start("a");
    let plan = "limits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000, window = \"1h\" }]";
    let wrong = format!("redis://:wrong-password@127.0.0.1:{}", redis.port);
    let text = config(&up, &redis, "", plan).replace(&redis.url(), &wrong);
    let gw = Gateway::start(&text);
    assert_eq!(get(&gw, "/echo/open/x").status, 200);
    // The status is the latest call's (the heartbeat's too): on a busy machine a call can
    // also time out, so look until a refused request and the status agree.
    wait_until("a refused call reported as refusing", || {
        get(&gw, "/echo/closed/x").status == 503 && store_status(&gw) == "refusing"
    });
    assert_eq!(gw.admin("/readyz").json()["store"]["reachable"], false);
    assert!(
        !gw.admin("/config").text().contains("wrong-password"),
        "the password stays out of /config"
    );

    // Out of memory: Redis answers, but refuses every write.
    let redis = RedisServer::start();
    let gw = Gateway::start(&config(&up, &redis, "", plan));
    wait_until("an answered call reported as ok", || {
        get(&gw, "/echo/closed/x").status == 200 && store_status(&gw) == "ok"
    });
    let _: String = redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: String = redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    wait_until("a refused write reported as refusing", || {
        get(&gw, "/echo/closed/y").status == 503 && store_status(&gw) == "refusing"
    });
    let ready = gw.admin("/readyz").json();
    assert_eq!(ready["store"]["reachable"], false, "{ready}");
    // The gateway itself stays ready: every route knows what to do without the store.
    assert_eq!(ready["ready"], true);
}

fn store_status(gw: &Gateway) -> String {
    gw.admin("/readyz").json()["store"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}
