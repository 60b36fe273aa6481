//! Costs known after the response (an LLM API's tokens) and costs declared by the request,
//! through three real gateways on one real Redis: the sum charged is the sum the upstream
//! reported, admissions stop when the budget is spent and resume when it refills, a response
//! without a usable header leaves the estimate, and with Redis gone a charge is sent again
//! once it is back, applied once.

use crate::common;

use common::redis::RedisServer;
use common::{wait_until, Gateway, Upstream};

const KEY: &str = "llm-client-key-0123456789";

fn config(up: &Upstream, redis: &RedisServer) -> String {
    format!(
        r#"
[upstreams.llm]
servers = ["{addr}"]

[plans.llm]
limits = [
  {{ name = "tokens-per-hour", algorithm = "fixed_window", limit = 1000000, window = "1h", cost_from_response = "header:x-tokens-used" }},
  {{ name = "tokens", algorithm = "fixed_window", limit = 1000, window = "3s", cost_from_response = "header:x-tokens-used", max_response_cost = 500 }},
]

[[clients]]
id = "llm"
plan = "llm"
api_keys = ["{KEY}"]

[[routes]]
name = "complete"
path_prefix = "/echo"
upstream = "llm"
auth = "api_key"
on_store_error = "fail_open"

[[routes]]
name = "batch"
path_prefix = "/echo/batch"
upstream = "llm"
auth = "api_key"
cost_from_request = "header:x-cost"
max_cost = 10

[store]
kind = "redis"
url = "{url}"
timeout = "1s"
"#,
        addr = up.addr(),
        url = redis.url()
    )
}

/// The count of `client`'s limit `name` on `route` in Redis (0 when absent).
fn count(redis: &RedisServer, route: &str, name: &str) -> u64 {
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("turnstile:{{llm}}:{route}:{name}@*")]);
    keys.first().map_or(0, |k| {
        let c: Option<String> = redis.cmd(&["HGET", k, "c"]);
        c.and_then(|c| c.parse().ok()).unwrap_or(0)
    })
}

#[test]
fn three_gateways_charge_exactly_what_the_responses_report() {
    let up = Upstream::start("llm");
    let mut redis = RedisServer::start();
    let text = config(&up, &redis);
    let gws: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut reported = 0u64;
    let mut statuses = Vec::new();
    // Spend the 3-second budget of 1000 tokens with calls reporting 50 to 200 tokens each,
    // round robin over the gateways, until one is refused.
    for i in 0..100 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let tokens = 50 + rng % 151;
        let resp = gws[i % 3].get_with(&format!("/echo/x?tokens={tokens}"), &[("X-Api-Key", KEY)]);
        statuses.push(resp.status);
        if resp.status == 200 {
            reported += tokens;
        } else {
            assert_eq!(resp.status, 429, "{}", resp.text());
            break;
        }
    }
    assert_eq!(
        statuses.last(),
        Some(&429),
        "the budget ran out: {statuses:?}"
    );
    // Every admitted call's tokens, charged after its response, and only those.
    wait_until("every charge in Redis", || {
        count(&redis, "complete", "tokens-per-hour") == reported
    });
    assert!(
        reported >= 1000 - 200,
        "admitted while the budget had room for the estimate"
    );
    // It refills with the next window.
    wait_until("the next window", || {
        gws[0]
            .get_with("/echo/x?tokens=10", &[("X-Api-Key", KEY)])
            .status
            == 200
    });

    // The call that found the new window is charged after its response: wait for it, or
    // it could land after `before` is read.
    wait_until("the refill call's charge", || {
        count(&redis, "complete", "tokens-per-hour") == reported + 10
    });

    // No usable header: the estimate (the route's cost, 1) stands, and it is counted.
    let before = reported + 10;
    for path in ["/echo/x", "/echo/x?tokens=abc", "/echo/x?tokens=-5"] {
        assert_eq!(gws[1].get_with(path, &[("X-Api-Key", KEY)]).status, 200);
    }
    wait_until("the estimates", || {
        count(&redis, "complete", "tokens-per-hour") == before + 3
    });
    assert!(gws[1].metric("turnstile_response_costs_total", &[("result", "missing")]) >= 2.0);
    assert!(gws[1].metric("turnstile_response_costs_total", &[("result", "invalid")]) >= 4.0);
    // Above max_response_cost: the maximum is charged to that limit.
    let resp = gws[2].get_with("/echo/x?tokens=5000", &[("X-Api-Key", KEY)]);
    if resp.status == 200 {
        wait_until("the capped charge", || {
            gws[2].metric("turnstile_response_costs_total", &[("result", "capped")]) >= 1.0
        });
    }

    // A declared cost: 10 per request on the batch route, at most 10.
    let declare = |gw: &Gateway, cost: &str| {
        gw.get_with("/echo/batch/x", &[("X-Api-Key", KEY), ("X-Cost", cost)])
            .status
    };
    assert_eq!(declare(&gws[0], "11"), 400);
    assert_eq!(declare(&gws[0], "zero"), 400);
    assert_eq!(
        gws[0]
            .get_with("/echo/batch/x", &[("X-Api-Key", KEY)])
            .status,
        400
    );
    let before = count(&redis, "batch", "tokens-per-hour");
    assert_eq!(declare(&gws[0], "7"), 200);
    // The batch upstream reports nothing: the declared 7 stands.
    wait_until("the declared cost", || {
        count(&redis, "batch", "tokens-per-hour") == before + 7
    });

    // Redis goes away while a response is on its way: the request was counted at its
    // estimate, its charge cannot be made then — it is sent again once Redis is back (here
    // empty: a restart without persistence), and applied once, whatever its attempts.
    // (Requests admitted while Redis is down, failing open, counted nothing: nothing to
    // charge.)
    let port = gws[0].port;
    let slow = std::thread::spawn(move || {
        common::http::get_with(
            port,
            "/echo/x?tokens=100&delay_ms=1500",
            &[("X-Api-Key", KEY)],
        )
        .status
    });
    wait_until("the slow call admitted", || {
        up.served() > 0 && count(&redis, "complete", "tokens-per-hour") > 0
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    redis.kill();
    assert_eq!(slow.join().unwrap(), 200);
    std::thread::sleep(std::time::Duration::from_millis(500));
    redis.restart();
    // The estimate of 1 was counted before the restart (and lost with it): the charge adds
    // the 99 more the response reported, once.
    wait_until("the charge sent again once Redis is back", || {
        count(&redis, "complete", "tokens-per-hour") > 0
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(count(&redis, "complete", "tokens-per-hour"), 99);
    let retried = gws[0].metric(
        "turnstile_store_settlements_total",
        &[("kind", "charge"), ("result", "retried")],
    );
    assert!(retried >= 1.0, "{retried}");
}

/// A budget of 1000 tokens an hour, charged from the response, that every request reserves
/// from (the bound it states in `X-Max-Tokens`, or 100) on `store`, with `route_extra` on the
/// route.
fn reserving_config(up: &Upstream, store: &str, route_extra: &str) -> String {
    format!(
        r#"
[upstreams.llm]
servers = ["{addr}"]

[plans.llm]
limits = [
  {{ name = "tokens", algorithm = "fixed_window", limit = 1000, window = "1h", cost_from_response = "header:x-tokens-used", max_response_cost = 100, reserve = 100 }},
]

[[clients]]
id = "llm"
plan = "llm"
api_keys = ["{KEY}"]

[[routes]]
name = "complete"
path_prefix = "/echo"
upstream = "llm"
auth = "api_key"
reserve_from = "header:x-max-tokens"
read_timeout = "30s"
{route_extra}

{store}
"#,
        addr = up.addr()
    )
}

/// 200 requests in flight at once, spread over `gws`, each reserving a random bound of 1 to
/// 100 tokens and reporting a random cost within it after 1.5 s: the tokens the admitted
/// requests consumed never pass the budget, whatever the concurrency (before, each counted
/// the estimate of 1 while in flight, and 200 of them consumed ~10 000 of 1000). Returns
/// (admitted, consumed).
fn two_hundred_in_flight(gws: &[&Gateway], seed: u64) -> (usize, u64) {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let requests: Vec<(u16, u64, u64)> = (0..200)
        .map(|i| {
            let bound = 1 + next() % 100;
            let cost = next() % (bound + 1);
            (gws[i % gws.len()].port, bound, cost)
        })
        .collect();
    let threads: Vec<_> = requests
        .into_iter()
        .map(|(port, bound, cost)| {
            std::thread::spawn(move || {
                let resp = common::http::get_with(
                    port,
                    &format!("/echo/x?tokens={cost}&delay_ms=1500"),
                    &[("X-Api-Key", KEY), ("X-Max-Tokens", &bound.to_string())],
                );
                (resp.status, cost, resp.text())
            })
        })
        .collect();
    let mut admitted = 0;
    let mut consumed = 0;
    for t in threads {
        let (status, cost, text) = t.join().unwrap();
        match status {
            200 => {
                admitted += 1;
                consumed += cost;
            }
            429 => {}
            other => panic!("{other}: {text}"),
        }
    }
    (admitted, consumed)
}

fn assert_within_budget(what: &str, (admitted, consumed): (usize, u64)) {
    println!("{what}: {admitted} admitted, {consumed} tokens consumed of 1000");
    assert!(
        consumed <= 1000,
        "{what}: {consumed} consumed, {admitted} admitted"
    );
    // Not by refusing everything: at least ten bounds of at most 100 fit in 1000.
    assert!(admitted >= 10, "{what}: {admitted} admitted");
}

/// The seed of the random bounds and costs (printed, so a failure can be replayed).
fn seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("seed {seed}");
    seed
}

#[test]
fn a_reserved_budget_is_never_overdrawn_by_concurrency_across_gateways_on_redis_and_a_cluster() {
    let up = Upstream::start("llm");
    let redis = RedisServer::start();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let text = reserving_config(&up, &store, "");
    let gws: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    let seed = seed();
    assert_within_budget(
        "redis",
        two_hundred_in_flight(&gws.iter().collect::<Vec<_>>(), seed),
    );
    // What Redis holds after the charges settled is what was consumed (the reservations
    // all came back or were charged).
    drop(gws);

    let cluster = common::redis::RedisCluster::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"2s\"",
        urls.join(", ")
    );
    let text = reserving_config(&up, &store, "");
    let gws: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    assert_within_budget(
        "cluster",
        two_hundred_in_flight(&gws.iter().collect::<Vec<_>>(), seed.rotate_left(17)),
    );
}

#[test]
fn a_reserved_budget_is_never_overdrawn_in_the_memory_store_or_the_local_failure_mode() {
    let up = Upstream::start("llm");
    let seed = seed();
    let gw = Gateway::start(&reserving_config(&up, "", ""));
    assert_within_budget("memory", two_hundred_in_flight(&[&gw], seed));
    drop(gw);
    // A Redis store that is not there: the route's local fallback decides (one instance
    // expected, so the whole budget), in process.
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"200ms\"\nexpected_instances = 1",
        common::free_port()
    );
    let gw = Gateway::start(&reserving_config(&up, &store, "on_store_error = \"local\""));
    assert_within_budget(
        "local fallback",
        two_hundred_in_flight(&[&gw], seed.rotate_left(29)),
    );
}

/// What a request reserves is what it states, once: a bound given twice, as a list, under a
/// `_` spelling or not as a whole number is refused (400) before anything is counted; a
/// request without one reserves the limit's `reserve`; the settled count is what the
/// responses reported.
#[test]
fn a_reservation_is_read_one_way_and_settled_to_what_the_response_reported() {
    let up = Upstream::start("llm");
    let redis = RedisServer::start();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let gw = Gateway::start(&reserving_config(&up, &store, ""));
    for bad in [
        &[("X-Max-Tokens", "1.5")][..],
        &[("X-Max-Tokens", "-3")],
        &[("X-Max-Tokens", "10, 20")],
        &[("X-Max-Tokens", "10"), ("X-Max-Tokens", "20")],
        &[("X-Max-Tokens", "10"), ("X_Max_Tokens", "20")],
    ] {
        let mut headers = vec![("X-Api-Key", KEY)];
        headers.extend_from_slice(bad);
        let resp = gw.get_with("/echo/x?tokens=1", &headers);
        assert_eq!(resp.status, 400, "{bad:?}: {}", resp.text());
    }
    assert_eq!(up.served(), 0);
    // While a request is in flight its reservation is counted: the stated 70, or the
    // limit's 100 without one.
    for (bound, reserved) in [(Some("70"), 70), (None, 100)] {
        let mut headers = vec![("X-Api-Key", KEY)];
        if let Some(bound) = bound {
            headers.push(("X-Max-Tokens", bound));
        }
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let port = gw.port;
        let before = count(&redis, "complete", "tokens");
        let slow = std::thread::spawn(move || {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            common::http::get_with(port, "/echo/x?tokens=5&delay_ms=1500", &headers).status
        });
        wait_until("the reservation counted", || {
            count(&redis, "complete", "tokens") == before + reserved
        });
        assert_eq!(slow.join().unwrap(), 200);
        // Settled: the 5 the response reported.
        wait_until("the settlement", || {
            count(&redis, "complete", "tokens") == before + 5
        });
    }
}
