//! Who may call a route (`allow_plans`, `allow_clients`, `deny_clients`, `deny_plans`) on a
//! real Redis: a refused client gets 403 and leaves every key in the store as it was (read
//! back, byte for byte, with `DUMP`); an admitted one writes as before; `turnstile check`
//! names the mistakes with their line.

use crate::common;

use common::redis::RedisServer;
use common::{assert_check_refuses, Gateway, Upstream};
use std::collections::BTreeMap;

const ADA: &str = "callers-ada-key-0123456789";
const BOB: &str = "callers-bob-key-0123456789";
const EVE: &str = "callers-eve-key-0123456789";

fn config(up: &Upstream, redis: &RedisServer) -> String {
    format!(
        r#"
[store]
kind = "redis"
url = "{url}"
heartbeat_interval = "1h"

[upstreams.orders]
servers = ["{addr}"]

[plans.gold]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 100, window = "1h" }}]
max_concurrent = 4

[plans.free]
limits = [{{ name = "per-hour", algorithm = "sliding_window", limit = 100, window = "1h" }}]

[[clients]]
id = "ada"
plan = "gold"
api_keys = ["{ADA}"]
groups = ["partners", "eu"]

[[clients]]
id = "bob"
plan = "free"
api_keys = ["{BOB}"]

[[clients]]
id = "eve"
plan = "gold"
api_keys = ["{EVE}"]
groups = ["partners", "suspended"]

[[routes]]
name = "premium"
path_prefix = "/echo/premium"
upstream = "orders"
auth = "api_key"
allow_plans = ["gold"]
deny_clients = ["eve"]

[[routes]]
name = "everyone"
path_prefix = "/echo/everyone"
upstream = "orders"
auth = "api_key"
deny_plans = ["trial"]

[[routes]]
name = "partners"
path_prefix = "/echo/partners"
upstream = "orders"
auth = "api_key"
allow_groups = ["partners"]
deny_groups = ["suspended"]

[plans.trial]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 1, window = "1h" }}]
"#,
        url = redis.url(),
        addr = up.addr(),
    )
}

/// The store once the gateway's first heartbeat has written its own keys (on a busy machine
/// the heartbeat task may run after the first requests): what a comparison starts from.
fn settled(redis: &RedisServer) -> BTreeMap<String, Vec<u8>> {
    common::wait_until("the gateway's heartbeat in Redis", || {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*instances*"]);
        keys.len() >= 2
    });
    state(redis)
}

/// Every key in Redis and its serialized value (`DUMP`: the value, not its TTL).
fn state(redis: &RedisServer) -> BTreeMap<String, Vec<u8>> {
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    keys.into_iter()
        .map(|k| {
            let dumped: Vec<u8> = redis.cmd(&["DUMP", &k]);
            (k, dumped)
        })
        .collect()
}

#[test]
fn a_refused_client_writes_nothing_to_the_store() {
    let redis = RedisServer::start();
    let up = Upstream::start("callers");
    let gw = Gateway::start(&config(&up, &redis));
    let get = |path: &str, key: &str| gw.get_with(path, &[("X-Api-Key", key)]);

    // Warm: the gateway's own keys (instances) are there before the count starts. Bob's plan
    // holds no concurrency slot, whose release would change the store after the response.
    assert_eq!(get("/echo/everyone/1", BOB).status, 200);
    let before = settled(&redis);
    let served = up.served();
    for _ in 0..5 {
        for key in [BOB, EVE] {
            let resp = get("/echo/premium/1", key);
            assert_eq!(resp.status, 403, "{}", resp.text());
            let body = resp.json();
            assert_eq!(body["type"], "https://turnstile.dev/problems/forbidden");
            assert!(
                body["detail"].as_str().unwrap().contains("route premium"),
                "{body}"
            );
            assert!(resp.header("ratelimit").is_none(), "no limit was asked");
        }
    }
    assert_eq!(state(&redis), before, "a refused client changed the store");
    assert_eq!(up.served(), served);
    gw.assert_counted(
        "turnstile_client_refusals_total",
        &[("route", "premium")],
        10.0,
    );

    // The same clients elsewhere, and an allowed client here, are counted as before: the
    // comparison above would have seen their writes.
    assert_eq!(get("/echo/everyone/1", BOB).status, 200);
    assert_ne!(state(&redis), before, "bob's admission wrote its count");
    let after_bob = state(&redis);
    let resp = get("/echo/premium/1", ADA);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.header("ratelimit").is_some());
    assert_ne!(state(&redis), after_bob, "ada's admission wrote its count");

    let callers = gw.admin("/config").json()["config"]["routes"][0]["callers"].clone();
    assert_eq!(callers["allow_plans"], serde_json::json!(["gold"]));
    assert_eq!(callers["deny_clients"], serde_json::json!(["eve"]));
}

/// A reload moves the lines: eve let in, gold's clients out by plan.
#[test]
fn the_rules_follow_a_reload() {
    let redis = RedisServer::start();
    let up = Upstream::start("callers");
    let gw = Gateway::start(&config(&up, &redis));
    let status = |key: &str| gw.get_with("/echo/premium/1", &[("X-Api-Key", key)]).status;
    assert_eq!((status(ADA), status(BOB), status(EVE)), (200, 403, 403));
    let changed = config(&up, &redis).replace(
        "allow_plans = [\"gold\"]\ndeny_clients = [\"eve\"]",
        "allow_clients = [\"eve\", \"bob\"]\ndeny_plans = [\"free\"]",
    );
    gw.rewrite(&changed);
    assert_eq!(gw.reload().status, 200);
    // bob is named, but his plan is denied; ada is no longer named; eve is.
    assert_eq!((status(ADA), status(BOB), status(EVE)), (403, 403, 200));
}

/// Groups: a client in an allowed group is let in, one in a denied group is refused (even
/// inside an allowed one), one in neither is refused; nothing of the refused is stored.
#[test]
fn groups_let_in_and_keep_out_and_follow_a_reload() {
    let redis = RedisServer::start();
    let up = Upstream::start("callers");
    let gw = Gateway::start(&config(&up, &redis));
    let status = |key: &str| {
        gw.get_with("/echo/partners/1", &[("X-Api-Key", key)])
            .status
    };
    // Warm with bob, whose plan holds no concurrency slot (a release after the response
    // would change the store while it is compared).
    assert_eq!(
        gw.get_with("/echo/everyone/1", &[("X-Api-Key", BOB)])
            .status,
        200
    );
    let before = settled(&redis);
    assert_eq!((status(BOB), status(EVE)), (403, 403));
    assert_eq!(state(&redis), before, "a refused client changed the store");
    assert_eq!(status(ADA), 200);
    let clients = gw.admin("/clients").json();
    let ada = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "ada")
        .unwrap()
        .clone();
    assert_eq!(ada["groups"], serde_json::json!(["partners", "eu"]));
    // The route keeps out "eu" instead: ada (in it) is refused, eve let in.
    gw.rewrite(
        &config(&up, &redis).replace("deny_groups = [\"suspended\"]", "deny_groups = [\"eu\"]"),
    );
    assert_eq!(gw.reload().status, 200);
    assert_eq!((status(ADA), status(BOB), status(EVE)), (403, 403, 200));
    assert_check_refuses(
        &config(&up, &redis).replace(
            "deny_groups = [\"suspended\"]",
            "deny_groups = [\"nobody-in-it\"]",
        ),
        &["deny_groups: unknown group \"nobody-in-it\"", "(line "],
    );
    assert_check_refuses(
        &config(&up, &redis).replace("groups = [\"partners\", \"eu\"]", "groups = [\"a:b\"]"),
        &["clients[0].groups", "a group name"],
    );
}

#[test]
fn check_names_caller_rule_mistakes_with_their_line() {
    let text = r#"[server]
listen = "127.0.0.1:1"

[upstreams.api]
servers = ["127.0.0.1:9"]

[plans.gold]
limits = [{ name = "per-hour", algorithm = "fixed_window", limit = 10, window = "1h" }]

[[routes]]
name = "open"
path_prefix = "/open"
upstream = "api"
allow_plans = ["gold"]

[[routes]]
name = "keyed"
path_prefix = "/keyed"
upstream = "api"
auth = "api_key"
allow_plans = ["platinum"]
allow_clients = []
deny_plans = ["gold"]
"#;
    assert_check_refuses(
        text,
        &[
        "routes[0].auth: allow_clients, deny_clients, allow_plans, deny_plans, allow_groups and deny_groups need callers identified",
        "(line 10,",
        "routes[1].allow_plans: unknown plan \"platinum\"",
        "(line 21,",
        "routes[1].allow_clients: an empty allow list lets no client in",
        "(line 22,",
    ],
    );
}
