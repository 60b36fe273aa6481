//! Why was this request limited? Every refusal of the limiter (429, and 503 when the store
//! cannot decide) is kept by its request id (`GET /refusals/{id}`) and counted per caller in
//! fixed-memory summaries (`GET /limited`), through a real gateway: an identified client over
//! its plan, an unidentified caller over the per-IP limit, a store that is down.

use crate::common;

use common::{free_port, Gateway, Upstream};

const KEY: &str = "refusals-key-0123456789";

fn config(up: &Upstream, dead_redis: u16) -> String {
    format!(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:{dead_redis}"
timeout = "100ms"

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = 2, window = "1d" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
on_store_error = "local"

[[routes]]
name = "down"
path_prefix = "/echo/down"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_closed"

[[routes]]
name = "open"
path_prefix = "/echo/open"
upstream = "orders"
ip_limit = {{ rate = "1/h", burst = 1 }}
"#,
        addr = up.addr()
    )
}

fn json(gw: &Gateway, path: &str) -> (u16, serde_json::Value) {
    let resp = gw.admin(path);
    let body = serde_json::from_str(&resp.text()).unwrap_or(serde_json::Value::Null);
    (resp.status, body)
}

#[test]
fn a_refusal_is_found_by_its_request_id_and_its_caller_is_listed_as_limited() {
    let up = Upstream::start("a");
    // Nothing listens there: the store is down, so the "orders" route decides locally (the
    // plan's limit, divided by the one instance) and "down" answers 503.
    let gw = Gateway::start(&config(&up, free_port()));
    let key = [("X-Api-Key", KEY)];
    assert_eq!(gw.get_with("/orders", &key).status, 200);
    assert_eq!(gw.get_with("/orders", &key).status, 200);
    let refused = gw.get_with("/orders", &key);
    assert_eq!(refused.status, 429);
    let id = refused
        .header("x-request-id")
        .expect("a request id")
        .to_owned();

    let (status, why) = json(&gw, &format!("/refusals/{id}"));
    assert_eq!(status, 200, "{why}");
    assert_eq!(why["status"], 429);
    assert_eq!(why["route"], "orders");
    assert_eq!(why["caller"], "client:ada");
    assert_eq!(why["limits"][0]["name"], "per-day");
    assert_eq!(why["limits"][0]["limit"], 2);
    assert_eq!(why["limits"][0]["remaining"], 0);
    assert!(why["retry_after_s"].as_u64().unwrap() >= 1, "{why}");
    assert!(
        !why.to_string().contains(KEY),
        "no credential in a refusal: {why}"
    );

    // The caller no route identifies is named by its address.
    assert_eq!(gw.get("/echo/open").status, 200);
    let by_ip = gw.get("/echo/open");
    assert_eq!(by_ip.status, 429);
    let (_, why) = json(
        &gw,
        &format!("/refusals/{}", by_ip.header("x-request-id").unwrap()),
    );
    assert_eq!(why["caller"], "address:127.0.0.1", "{why}");

    // The store could not decide: a 503, and no limit to blame.
    let down = gw.get_with("/echo/down", &key);
    assert_eq!(down.status, 503);
    let (_, why) = json(
        &gw,
        &format!("/refusals/{}", down.header("x-request-id").unwrap()),
    );
    assert_eq!(
        (
            why["status"].as_u64(),
            why["limits"].as_array().map(Vec::len)
        ),
        (Some(503), Some(0)),
        "{why}"
    );

    for _ in 0..5 {
        assert_eq!(gw.get_with("/orders", &key).status, 429);
    }
    let (status, limited) = json(&gw, "/limited");
    assert_eq!(status, 200);
    let top = &limited["minute"]["top"][0];
    assert_eq!(
        (
            top["route"].as_str(),
            top["limit"].as_str(),
            top["caller"].as_str()
        ),
        (Some("orders"), Some("per-day"), Some("client:ada")),
        "{limited}"
    );
    assert_eq!(top["count"], 6);
    assert_eq!(limited["minute"]["refusals"], 8);
    assert_eq!(limited["hour"]["top"][0]["count"], 6);

    let (status, _) = json(&gw, "/refusals/not-a-refused-request");
    assert_eq!(status, 404);
    let (_, latest) = json(&gw, "/refusals");
    assert_eq!(latest["latest"].as_array().unwrap().len(), 8);
}

/// With a Redis store, `GET /limited` also shows the fleet: every live instance's summaries,
/// published with its heartbeat, merged — the same caller refused on two gateways is one
/// line with both counts added. A keyed limit's refusals are listed by the hashed key the
/// store uses, never the raw value.
#[test]
fn the_fleet_view_merges_what_every_instance_refused_and_keyed_values_show_hashed() {
    let redis = common::redis::RedisServer::start();
    let up = Upstream::start("a");
    let text = format!(
        r#"
[store]
kind = "redis"
url = "{url}"
heartbeat_interval = "100ms"
# A busy machine (tests run in parallel) must not turn a slow decision into the default
# failure mode, fail_open, which would admit past the limit.
timeout = "5s"

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = 2, window = "1d" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"

[[routes]]
name = "tenants"
path_prefix = "/echo/tenants"
upstream = "orders"

[[routes.limits]]
name = "per-tenant"
algorithm = "fixed_window"
limit = 1
window = "1h"
key = ["header:x-tenant-id"]
"#,
        url = redis.url(),
        addr = up.addr()
    );
    let server = "key_hash_secret = \"refusals-test-secret\"";
    let a = Gateway::start_with(server, &text);
    let b = Gateway::start_with(server, &text);
    // Both connected to the store (each heartbeat seen), so neither decides alone.
    common::wait_until("both gateways in the fleet", || {
        [&a, &b].iter().all(|gw| {
            gw.admin("/fleet").json()["instances"]
                .as_array()
                .is_some_and(|i| i.len() == 2)
        })
    });
    let key = [("X-Api-Key", KEY)];
    let mut refused = [0, 0];
    let mut statuses = Vec::new();
    for which in [0, 1, 0, 1, 0, 1, 1] {
        let status = [&a, &b][which].get_with("/orders", &key).status;
        statuses.push(status);
        if status == 429 {
            refused[which] += 1;
        }
    }
    // Two admitted in all (one limit across both gateways), five refused.
    assert_eq!(refused[0] + refused[1], 5, "{statuses:?}");
    let tenant = [("X-Tenant-Id", "tenant-secret-name")];
    assert_eq!(b.get_with("/echo/tenants", &tenant).status, 200);
    assert_eq!(b.get_with("/echo/tenants", &tenant).status, 429);

    let ada = |view: &serde_json::Value| {
        view["top"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["caller"] == "client:ada")
            .map(|l| l["count"].as_u64().unwrap())
    };
    // A's own view: only what A refused.
    let (_, own) = json(&a, "/limited");
    assert_eq!(ada(&own["minute"]), Some(refused[0] as u64), "{own}");
    // The fleet's, once B's heartbeat published its part: both, added.
    let mut fleet = serde_json::Value::Null;
    // (B publishes with each heartbeat: its plan refusals and its keyed one may reach the
    // view a heartbeat apart.)
    common::wait_until("B's refusals in A's fleet view", || {
        fleet = json(&a, "/limited").1["fleet"].clone();
        ada(&fleet["minute"]) == Some(5) && fleet["minute"]["refusals"] == 6
    });
    assert_eq!(fleet["instances"], 2, "{fleet}");
    // Heartbeats that follow send "unchanged" (a byte): the summaries stay in the view.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let again = json(&a, "/limited").1["fleet"].clone();
    assert_eq!(ada(&again["minute"]), Some(5), "{again}");
    assert_eq!(fleet["merged"].as_array().unwrap().len(), 2, "{fleet}");
    assert_eq!(fleet["minute"]["refusals"], 6, "{fleet}");
    assert_eq!(ada(&fleet["hour"]), Some(5), "{fleet}");
    let keyed = fleet["minute"]["top"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "per-tenant")
        .cloned()
        .unwrap_or_else(|| panic!("the keyed limit is listed: {fleet}"));
    let caller = keyed["caller"].as_str().unwrap();
    assert!(caller.starts_with("key:k:"), "{keyed}");
    assert_eq!(
        (keyed["route"].as_str(), keyed["count"].as_u64()),
        (Some("tenants"), Some(1))
    );
    let everything = json(&a, "/limited").1.to_string() + &json(&b, "/refusals").1.to_string();
    assert!(
        !everything.contains("tenant-secret-name") && !everything.contains(KEY),
        "no raw key value or credential: {everything}"
    );
    // The keyed refusal names the same hashed partition when looked up by request id.
    let (_, latest) = json(&b, "/refusals");
    let by_key = latest["latest"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == "tenants")
        .cloned()
        .unwrap();
    assert_eq!(
        by_key["limits"][0]["key"].as_str(),
        caller.strip_prefix("key:"),
        "{by_key}"
    );

    // A gateway with the memory store has no fleet to show.
    let (_, alone) = json(&Gateway::start(&config(&up, free_port())), "/limited");
    assert!(
        alone["fleet"].is_object(),
        "a Redis store that is down: {alone}"
    );
    assert!(alone["fleet"]["error"].is_string(), "{alone}");
}
