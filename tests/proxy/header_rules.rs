//! Header rules (`request_headers` / `response_headers`) through the real binary: the
//! upstream receives exactly what the rules say (set, added, removed with its `_`
//! spelling, variables filled in), the client gets the response rules, and no rule can touch
//! the gateway's own headers — `turnstile check` refuses it, with the line.

use crate::common;

use common::echoed as received;
use common::{assert_check_refuses, http, Gateway, Upstream};

const KEY: &str = "rules-ada-key-0123456789";

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.gold]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 1000, window = "1h" }}]

[[clients]]
id = "ada"
plan = "gold"
api_keys = ["{KEY}"]

[[routes]]
name = "rules"
path_prefix = "/echo/rules"
upstream = "orders"
auth = "api_key"
ip_limit = {{ rate = "1/h", burst = 2 }}
request_headers = {{ set = {{ "X-Env" = "prod", "X-Caller" = "${{client_id}}/${{plan}} via ${{route}} from ${{client_ip}} (${{request_id}})" }}, add = {{ "X-Tag" = "gw" }}, remove = ["X-Debug"] }}
response_headers = {{ set = {{ "Strict-Transport-Security" = "max-age=63072000" }}, add = {{ "X-Served-By" = "${{route}}" }}, remove = ["X-Upstream-Name"] }}

[[routes]]
name = "plain"
path_prefix = "/echo/plain"
upstream = "orders"
"#,
        addr = up.addr()
    )
}

#[test]
fn the_upstream_and_the_client_get_what_the_rules_say() {
    let up = Upstream::start("rules");
    let gw = Gateway::start(&config(&up));
    let request = format!(
        "GET /echo/rules/1 HTTP/1.1\r\nHost: gw\r\nX-Api-Key: {KEY}\r\nX-Env: client\r\n\
         X-Tag: a\r\nX-Debug: 1\r\nX_Debug: 2\r\nX-Forwarded-For: 203.0.113.9\r\n\
         X-Request-Id: order-7\r\nConnection: close\r\n\r\n"
    );
    let resp = http::raw(gw.port, request.as_bytes()).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let echo = resp.json();
    assert_eq!(received(&echo, "x-env"), ["prod"]);
    assert_eq!(received(&echo, "x-tag"), ["a", "gw"]);
    assert!(received(&echo, "x-debug").is_empty(), "{echo}");
    assert!(
        received(&echo, "x_debug").is_empty(),
        "the `_` spelling goes too: {echo}"
    );
    assert_eq!(
        received(&echo, "x-caller"),
        ["ada/gold via rules from 127.0.0.1 (order-7)"]
    );
    // The gateway's own headers are as ever.
    assert_eq!(
        received(&echo, "x-forwarded-for"),
        ["203.0.113.9, 127.0.0.1"]
    );
    assert_eq!(received(&echo, "x-client-id"), ["ada"]);

    assert_eq!(
        resp.header("strict-transport-security"),
        Some("max-age=63072000")
    );
    assert_eq!(resp.header("x-served-by"), Some("rules"));
    assert_eq!(resp.header("x-upstream-name"), None);
    assert_eq!(resp.header("x-request-id"), Some("order-7"));
    assert!(resp.header("ratelimit").is_some());

    // A route without rules: untouched either way.
    let plain = gw.get_with("/echo/plain/1", &[("X-Env", "client"), ("X-Debug", "1")]);
    let echo = plain.json();
    assert_eq!(received(&echo, "x-env"), ["client"]);
    assert_eq!(received(&echo, "x-debug"), ["1"]);
    assert_eq!(plain.header("x-upstream-name"), Some("rules"));
    assert_eq!(plain.header("x-served-by"), None);

    // The gateway's own 429 keeps its contract on a route with response rules.
    let refused = (0..3)
        .map(|_| gw.get_with("/echo/rules/1", &[("X-Api-Key", KEY)]))
        .find(|r| r.status == 429)
        .expect("the per-IP bucket of 2 refuses the third");
    assert!(refused.header("retry-after").is_some());
    assert!(refused.header("x-request-id").is_some());
}

#[test]
fn check_refuses_rules_on_the_gateways_headers_with_the_line() {
    let text = r#"[server]
listen = "127.0.0.1:1"

[upstreams.api]
servers = ["127.0.0.1:9"]

[[routes]]
name = "r"
path_prefix = "/r"
upstream = "api"
request_headers = { set = { "X-Forwarded-For" = "1.2.3.4", "X-Who" = "${client_id}" }, remove = ["Host"] }
response_headers = { remove = ["Retry-After"], add = { "X-Bad" = "${nope}" } }
"#;
    assert_check_refuses(
        text,
        &[
        "routes[0].request_headers.set.X-Forwarded-For: x-forwarded-for is the gateway's to decide",
        "routes[0].request_headers.set.X-Who: ${client_id} and ${plan} need callers identified",
        "routes[0].request_headers.remove[0]: host is the gateway's to decide",
        "routes[0].response_headers.remove[0]: retry-after is the gateway's to decide",
        "routes[0].response_headers.add.X-Bad: \"${nope}\": unknown variable ${nope}",
        "(line 11,",
        "(line 12,",
    ],
    );
}
