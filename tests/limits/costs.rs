//! Costs known after the response (an LLM API's tokens) and costs declared by the request,
//! through three real gateways on one real Redis: the sum charged is the sum the upstream
//! reported, admissions stop when the budget is spent and resume when it refills, a response
//! without a usable header leaves the estimate, and with Redis gone a charge that cannot be
//! made is counted as failed.

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
    // estimate, its charge cannot be made, and after its retries it is counted as failed.
    // (Requests admitted while Redis is down, failing open, counted nothing: nothing to
    // charge.)
    let failed_before = gws[0].metric("turnstile_response_costs_total", &[("result", "failed")]);
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
    wait_until("the failed charge counted", || {
        gws[0].metric("turnstile_response_costs_total", &[("result", "failed")]) > failed_before
    });
    assert!(gws[0].proc.log_text().contains("not counted"));
}
