//! End-to-end tests of the gateway core over real HTTP: the real `turnstile` binary in front of
//! real `orders-api` processes, all on free loopback ports.

use crate::common;

use common::{http, upstream_of, wait_until, Gateway, Upstream};
use std::collections::HashMap;

fn pool(name: &str, servers: &[&Upstream], extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|u| format!("{:?}", u.addr())).collect();
    format!(
        "[upstreams.{name}]\nservers = [{}]\n{extra}\n",
        list.join(", ")
    )
}

fn assert_problem(resp: &http::Response, status: u16, slug: &str) -> serde_json::Value {
    assert_eq!(resp.status, status, "{}", resp.text());
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    let body = resp.json();
    assert_eq!(body["status"], status);
    assert_eq!(
        body["type"],
        format!("https://turnstile.dev/problems/{slug}")
    );
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    assert_eq!(body["request_id"].as_str(), resp.header("x-request-id"));
    body
}

#[test]
fn requests_reach_the_upstream_of_the_longest_matching_prefix() {
    let a = Upstream::start("a");
    let r = Upstream::start("reports");
    let gw = Gateway::start(&format!(
        "{}{}
[[routes]]
name = \"orders\"
path_prefix = \"/orders\"
upstream = \"orders\"

[[routes]]
name = \"special\"
path_prefix = \"/orders/special\"
upstream = \"reports\"

[[routes]]
name = \"echo\"
path_prefix = \"/echo\"
upstream = \"reports\"
methods = [\"GET\"]
",
        pool("orders", &[&a], ""),
        pool("reports", &[&r], "")
    ));

    let resp = gw.get("/orders/7");
    assert_eq!(resp.status, 200);
    assert_eq!(upstream_of(&resp), "a");
    assert_eq!(resp.json()["id"], 7);

    assert_eq!(upstream_of(&gw.get("/orders")), "a");
    assert_eq!(upstream_of(&gw.get("/orders/special/1")), "reports");
    assert_eq!(upstream_of(&gw.get("/echo/x")), "reports");

    // On a segment boundary only: /ordersx is not /orders.
    assert_problem(&gw.get("/ordersx"), 404, "route-not-found");

    // POST reaches the upstream with its body and gets the upstream's 202.
    let created = http::request(
        gw.port,
        "POST",
        "/orders",
        &[("content-type", "application/json")],
        br#"{"item":"x"}"#,
    );
    assert_eq!(created.status, 202, "{}", created.text());
    assert_eq!(created.json()["order"]["item"], "x");

    // A method no route allows: 405 with Allow.
    let resp = http::request(gw.port, "DELETE", "/echo/x", &[], b"");
    assert_problem(&resp, 405, "method-not-allowed");
    assert_eq!(resp.header("allow"), Some("GET"));
}

#[test]
fn unknown_routes_and_bad_paths_get_problem_json() {
    let a = Upstream::start("a");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"orders\"\n",
        pool("orders", &[&a], "")
    ));
    let body = assert_problem(&gw.get("/nothing/here"), 404, "route-not-found");
    assert!(body["detail"].as_str().unwrap().contains("/nothing/here"));

    // `/orders/../admin` must not be routed by its first segment.
    let resp = gw.get("/orders/../admin");
    assert_problem(&resp, 400, "bad-request");
    let resp = gw.get("/orders/%2e%2e/admin");
    assert_problem(&resp, 400, "bad-request");
}

#[test]
fn round_robin_spreads_requests_over_both_instances() {
    let a = Upstream::start("a");
    let b = Upstream::start("b");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"orders\"\n",
        pool("orders", &[&a, &b], "")
    ));
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut order = Vec::new();
    for _ in 0..20 {
        let resp = gw.get("/orders");
        assert_eq!(resp.status, 200);
        order.push(upstream_of(&resp));
        *seen.entry(upstream_of(&resp)).or_default() += 1;
    }
    assert_eq!(seen.get("a"), Some(&10), "{order:?}");
    assert_eq!(seen.get("b"), Some(&10), "{order:?}");
    // Strict alternation: no instance twice in a row.
    assert!(order.windows(2).all(|w| w[0] != w[1]), "{order:?}");
}

#[test]
fn a_server_failing_its_health_check_is_skipped_until_it_recovers() {
    let a = Upstream::start("a");
    let b = Upstream::start("b");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"orders\"\n",
        pool(
            "orders",
            &[&a, &b],
            "health_check = { path = \"/healthz\", interval = \"100ms\", unhealthy_threshold = 1, healthy_threshold = 1 }"
        )
    ));
    // b keeps serving orders, but says it is unhealthy: only health checks can take it out.
    b.set_healthy(false);
    wait_until("b to be taken out of rotation", || {
        (0..6).all(|_| upstream_of(&gw.get("/orders")) == "a")
    });
    for _ in 0..20 {
        let resp = gw.get("/orders");
        assert_eq!((resp.status, upstream_of(&resp).as_str()), (200, "a"));
    }
    b.set_healthy(true);
    wait_until("b to be back in rotation", || {
        (0..6).any(|_| upstream_of(&gw.get("/orders")) == "b")
    });
}

#[test]
fn traffic_continues_on_the_other_instance_when_one_is_killed() {
    let a = Upstream::start("a");
    let mut b = Upstream::start("b");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"orders\"\n",
        pool(
            "orders",
            &[&a, &b],
            "health_check = { path = \"/healthz\", interval = \"100ms\" }"
        )
    ));
    assert!((0..4).any(|_| upstream_of(&gw.get("/orders")) == "b"));
    b.proc.kill();
    // No request fails: a connect failure is retried on the next server, and the health check
    // then takes b out of rotation.
    for i in 0..50 {
        let resp = gw.get("/orders");
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        assert_eq!(upstream_of(&resp), "a");
    }
    wait_until("the health check to take b out", || {
        gw.proc.log_text().contains("becomes unhealthy")
    });
    for i in 0..20 {
        let resp = gw.get("/orders");
        assert_eq!(
            (resp.status, upstream_of(&resp).as_str()),
            (200, "a"),
            "request {i} after health check"
        );
    }
}

#[test]
fn upstream_failures_are_502_and_timeouts_504() {
    let slow = Upstream::start("slow");
    let dead_port = common::free_port();
    let gw = Gateway::start(&format!(
        "{}
[upstreams.dead]
servers = [\"127.0.0.1:{dead_port}\"]

[upstreams.checked]
servers = [\"127.0.0.1:{dead_port}\"]
health_check = {{ path = \"/healthz\", interval = \"100ms\", unhealthy_threshold = 1 }}

[[routes]]
name = \"slow\"
path_prefix = \"/orders\"
upstream = \"slow\"
read_timeout = \"300ms\"

[[routes]]
name = \"dead\"
path_prefix = \"/dead\"
upstream = \"dead\"

[[routes]]
name = \"checked\"
path_prefix = \"/checked\"
upstream = \"checked\"
",
        pool("slow", &[&slow], "")
    ));
    // Not slow enough to time out: answered.
    assert_eq!(gw.get("/orders?delay_ms=10").status, 200);
    // Slower than read_timeout: 504.
    let body = assert_problem(&gw.get("/orders?delay_ms=3000"), 504, "upstream-timeout");
    assert!(body["detail"].as_str().unwrap().contains("slow"), "{body}");
    // Connection refused: 502.
    assert_problem(&gw.get("/dead"), 502, "upstream-unavailable");
    // Every server failing its health check: 502 without trying to connect.
    wait_until("the checked pool to be marked down", || {
        gw.get("/checked").json()["type"] == "https://turnstile.dev/problems/no-healthy-upstream"
    });
    assert_problem(&gw.get("/checked"), 502, "no-healthy-upstream");
}

#[test]
fn forwarded_for_and_request_id_reach_the_upstream() {
    let a = Upstream::start("a");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"echo\"\npath_prefix = \"/echo\"\nupstream = \"orders\"\n",
        pool("orders", &[&a], "")
    ));
    let header = |v: &serde_json::Value, name: &str| -> Vec<String> {
        v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0] == name)
            .map(|h| h[1].as_str().unwrap().to_owned())
            .collect()
    };

    // No incoming headers: XFF is the peer, a request id is generated and returned.
    let resp = gw.get("/echo/a");
    let seen = resp.json();
    assert_eq!(header(&seen, "x-forwarded-for"), vec!["127.0.0.1"]);
    let ids = header(&seen, "x-request-id");
    assert_eq!(ids.len(), 1);
    assert_eq!(ids[0].len(), 32, "{ids:?}");
    assert_eq!(resp.header("x-request-id"), Some(ids[0].as_str()));

    // Incoming XFF is kept and the peer appended; a sane incoming request id is passed on.
    let resp = gw.get_with(
        "/echo/b",
        &[
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Request-Id", "client-id-42"),
        ],
    );
    let seen = resp.json();
    assert_eq!(
        header(&seen, "x-forwarded-for"),
        vec!["203.0.113.7, 127.0.0.1"]
    );
    assert_eq!(header(&seen, "x-request-id"), vec!["client-id-42"]);
    assert_eq!(resp.header("x-request-id"), Some("client-id-42"));

    // An unusable incoming id (too long) is replaced.
    let long = "x".repeat(300);
    let seen = gw.get_with("/echo/c", &[("X-Request-Id", &long)]).json();
    assert_eq!(header(&seen, "x-request-id")[0].len(), 32);

    // Each request gets its own id.
    let first = gw.get("/echo/d").header("x-request-id").unwrap().to_owned();
    let second = gw.get("/echo/d").header("x-request-id").unwrap().to_owned();
    assert_ne!(first, second);
}

#[test]
fn upstream_connections_are_kept_alive_and_reused() {
    let a = Upstream::start("a");
    let gw = Gateway::start(&format!(
        "{}[[routes]]\nname = \"echo\"\npath_prefix = \"/echo\"\nupstream = \"orders\"\n",
        pool("orders", &[&a], "")
    ));
    // The upstream echoes the address of the connection each request arrived on.
    let peers: std::collections::HashSet<String> = (0..20)
        .map(|_| {
            gw.get("/echo/x").json()["peer"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        peers.len() <= 2,
        "20 sequential requests should reuse one or two upstream connections, saw {peers:?}"
    );
}
