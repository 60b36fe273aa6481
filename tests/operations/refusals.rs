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
