//! The quota endpoint's cost and bound, against a real Redis: a quota call is one store call
//! that writes nothing — Redis runs no more commands for it than for one decision of the same
//! client (before: one counting-free decision per route, each writing, ~180 commands for a
//! real plan) — and each client has a bucket of its own for it.

use crate::common;

use common::redis::RedisServer;
use common::{Gateway, Upstream};

const KEY: &str = "quota-client-key-0123456789";

fn config(up: &Upstream, redis: &RedisServer) -> String {
    format!(
        r#"
[upstreams.api]
servers = ["{addr}"]

[plans.p]
limits = [
  {{ name = "per-minute", algorithm = "fixed_window", limit = 100, window = "1m" }},
  {{ name = "per-day", algorithm = "fixed_window", limit = 1000, window = "1d" }},
]

[[clients]]
id = "quoted"
plan = "p"
api_keys = ["{KEY}"]

[[routes]]
name = "a"
path_prefix = "/echo/a"
upstream = "api"
auth = "api_key"

[[routes]]
name = "b"
path_prefix = "/echo/b"
upstream = "api"
auth = "api_key"

[store]
kind = "redis"
url = "{url}"
timeout = "1s"
"#,
        addr = up.addr(),
        url = redis.url()
    )
}

/// Commands Redis ran (scripts' own commands included; the scripts' calls and this
/// harness's own questions left out), from `INFO commandstats`.
fn commands(redis: &RedisServer) -> u64 {
    let info: String = redis.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| {
            ![
                "evalsha", "eval", "info", "config", "script", "hello", "client", "ping",
            ]
            .iter()
            .any(|c| l.starts_with(&format!("{c}:")))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The fewest commands Redis ran for `op` over a few tries (a heartbeat landing in one try
/// adds its own).
fn cost(redis: &RedisServer, mut op: impl FnMut()) -> u64 {
    (0..5)
        .map(|_| {
            let before = commands(redis);
            op();
            commands(redis) - before
        })
        .min()
        .unwrap()
}

#[test]
fn a_quota_call_costs_redis_no_more_than_a_decision_and_has_a_bucket_of_its_own() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let gw = Gateway::start_with(
        "quota_path = \"/_turnstile/quota\"\nquota_limit = { rate = \"1/h\", burst = 30 }",
        &config(&up, &redis),
    );
    let ask =
        |query: &str| gw.get_with(&format!("/_turnstile/quota{query}"), &[("X-Api-Key", KEY)]);
    assert_eq!(gw.get_with("/echo/a/x", &[("X-Api-Key", KEY)]).status, 200);
    let decision = cost(&redis, || {
        assert_eq!(gw.get_with("/echo/a/x", &[("X-Api-Key", KEY)]).status, 200);
    });
    let every_route = cost(&redis, || assert_eq!(ask("").status, 200));
    let one_route = cost(&redis, || assert_eq!(ask("?route=b").status, 200));
    println!(
        "commands: a decision {decision}, quota of every route {every_route}, of one {one_route}"
    );
    assert!(every_route <= decision, "{every_route} > {decision}");
    assert!(one_route < decision, "{one_route} >= {decision}");
    // It answers what the next requests will find, and counts nothing.
    let body = ask("").json();
    assert_eq!(body["routes"][0]["route"], "a");
    assert_eq!(body["routes"][0]["limits"][0]["remaining"], 100 - 6);
    assert_eq!(body["routes"][1]["limits"][0]["remaining"], 100);
    let one = ask("?route=b").json();
    assert_eq!(one["routes"].as_array().unwrap().len(), 1);
    assert_eq!(ask("?route=nope").status, 404);
    assert_eq!(ask("?route=a&route=b").status, 400);

    // Its own bucket, per client (after the per-IP one): 30 asked above, the next refused.
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(ask("").status);
    }
    let refused = ask("");
    assert_eq!(refused.status, 429, "{statuses:?}");
    assert!(
        refused
            .header("ratelimit-policy")
            .unwrap_or("")
            .contains("\"quota\";q=30"),
        "{:?}",
        refused.header("ratelimit-policy")
    );
    assert!(refused.header("retry-after").is_some());
    // Requests on the routes are not held to it.
    assert_eq!(gw.get_with("/echo/a/x", &[("X-Api-Key", KEY)]).status, 200);
}

#[test]
fn the_quota_endpoint_has_a_bucket_by_default_and_it_can_be_switched_off() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let asked = |gw: &Gateway, n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| {
                gw.get_with("/_turnstile/quota", &[("X-Api-Key", KEY)])
                    .status
            })
            .collect()
    };
    let default = Gateway::start_with("quota_path = \"/_turnstile/quota\"", &config(&up, &redis));
    let statuses = asked(&default, 15);
    assert!(
        statuses.contains(&429),
        "on by default (burst 10): {statuses:?}"
    );
    let off = Gateway::start_with(
        "quota_path = \"/_turnstile/quota\"\nquota_limit = \"off\"",
        &config(&up, &redis),
    );
    assert_eq!(asked(&off, 15), [200; 15]);
}
