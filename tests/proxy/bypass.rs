//! Attempts to get past the gateway's checks, or to make it leak what it must keep: paths the
//! upstream reads differently from the router, a second `Authorization`, header spellings
//! CGI/WSGI servers read as the gateway's own, malformed heads, credentials in `/config`.
//! Raw bytes on the wire wherever they matter; a real upstream echoes what it received.

use crate::common;

use common::{http, Gateway, Upstream};

const KEY: &str = "bypass-key-0123456789";

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.p]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 50, window = "1m" }}]

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

[[routes]]
name = "public"
path_prefix = "/"
upstream = "orders"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"

[[routes]]
name = "private"
path_prefix = "/echo/private/"
upstream = "orders"
auth = "api_key"
"#,
        addr = up.addr()
    )
}

/// A GET exactly as written (`curl --path-as-is`), with optional extra header lines.
fn get_raw(gw: &Gateway, target: &str, extra: &str) -> http::Response {
    let req = format!("GET {target} HTTP/1.1\r\nHost: gw\r\n{extra}Connection: close\r\n\r\n");
    http::raw(gw.port, req.as_bytes()).unwrap_or_else(|e| panic!("GET {target}: {e}"))
}

fn problem_type(resp: &http::Response) -> String {
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json"),
        "{} {}",
        resp.status,
        resp.text()
    );
    resp.json()["type"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn paths_are_routed_as_the_upstream_reads_them() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    // Without a key, every spelling of a protected path is refused: 401 where the path has
    // a normal form, 400 where it has none. Before, `//orders` reached the upstream (200).
    for (target, status) in [
        ("/orders", 401),
        ("//orders", 401),
        ("///orders//1", 401),
        ("/%6Frders", 401),
        ("/%6f%72ders", 401),
        ("/echo//private/x", 401),
        ("/echo/private", 401),
        ("/ORDERS", 400),
        ("/Orders/1", 400),
        ("/orders;jsessionid=1", 400),
        ("/public/..;/orders", 400),
        ("/orders%2F1", 400),
        ("/%252e%252e/orders", 400),
        ("/a/../orders", 400),
        ("/orders%", 400),
    ] {
        for _ in 0..3 {
            let resp = get_raw(&gw, target, "");
            assert_eq!(resp.status, status, "{target}: {}", resp.text());
            problem_type(&resp);
        }
    }
    assert_eq!(up.served(), 0, "nothing reached the upstream");
    // With the key, the upstream gets the path that was routed (and the query as sent).
    let key = format!("X-Api-Key: {KEY}\r\n");
    let resp = get_raw(&gw, "/echo//private///x?a=1&b=%2F", &key);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let echo = resp.json();
    assert_eq!(echo["path"], "/echo/private/x");
    assert_eq!(echo["query"], "a=1&b=%2F");
    let resp = get_raw(&gw, "/echo/%70rivate/%7Ex", &key);
    assert_eq!(resp.json()["path"], "/echo/private/~x");
    // A path that needs no change is forwarded byte for byte.
    let resp = get_raw(&gw, "/echo/public/caf%C3%A9", "");
    assert_eq!(resp.json()["path"], "/echo/public/caf%C3%A9");
    assert_eq!(get_raw(&gw, "//orders", &key).status, 200);
}

#[test]
fn a_second_authorization_is_refused_and_no_credential_reaches_the_upstream() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    let bearer = format!("Authorization: Bearer {KEY}\r\n");
    let resp = get_raw(
        &gw,
        "/echo/private/x",
        &format!("Authorization: Basic Zm9vOmJhcg==\r\n{bearer}"),
    );
    assert_eq!(resp.status, 400, "{}", resp.text());
    let resp = get_raw(
        &gw,
        "/echo/private/x",
        &format!("{bearer}Authorization: Basic Zm9vOmJhcg==\r\n"),
    );
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(up.served(), 0);

    let received = |extra: &str| -> Vec<(String, String)> {
        let resp = get_raw(&gw, "/echo/private/x", extra);
        assert_eq!(resp.status, 200, "{extra}: {}", resp.text());
        let headers = resp.json()["headers"].as_array().unwrap().clone();
        headers
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap().to_owned(),
                    h[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let leaks = |headers: &[(String, String)]| -> Vec<String> {
        headers
            .iter()
            .filter(|(_, v)| v.contains(KEY) || v.contains("mallory") || v.contains("6.6.6.6"))
            .map(|(k, v)| format!("{k}: {v}"))
            .collect()
    };
    for extra in [
        bearer.clone(),
        format!("X-Api-Key: {KEY}\r\nX-Api-Key: {KEY}\r\n"),
        format!("X-Api-Key: {KEY}\r\n{bearer}"),
        format!("X-Api-Key: {KEY}\r\nX_Api_Key: {KEY}\r\n"),
        format!("X-Api-Key: {KEY}\r\nX_Client_Id: mallory\r\nx-client_id: mallory\r\n"),
        format!("X-Api-Key: {KEY}\r\nX_Forwarded_For: 6.6.6.6\r\nX_Request_Id: mallory\r\n"),
    ] {
        let headers = received(&extra);
        assert!(
            leaks(&headers).is_empty(),
            "{extra:?}: {:?}",
            leaks(&headers)
        );
        let client: Vec<&(String, String)> = headers
            .iter()
            .filter(|(k, _)| k.replace('_', "-").eq_ignore_ascii_case("x-client-id"))
            .collect();
        assert_eq!(client, [&("x-client-id".to_owned(), "ada".to_owned())]);
    }
}

#[test]
fn malformed_heads_get_a_problem_and_never_reach_the_upstream() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    for (name, request) in [
        ("no Host", "GET /echo/x HTTP/1.1\r\n\r\n"),
        (
            "two Hosts",
            "GET /echo/x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ),
        (
            "absolute-form naming another host",
            "GET http://elsewhere.example/echo/x HTTP/1.1\r\nHost: gw\r\n\r\n",
        ),
        (
            "Content-Length list",
            "POST /echo/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 5, 5\r\n\r\nabcde",
        ),
        ("garbage request line", "GET\r\n\r\n"),
    ] {
        let resp = http::raw(gw.port, request.as_bytes()).unwrap();
        assert_eq!(resp.status, 400, "{name}: {}", resp.text());
        assert!(
            problem_type(&resp).ends_with("bad-request"),
            "{name}: {}",
            resp.text()
        );
    }
    assert_eq!(up.served(), 0);
    // HTTP/1.0 has no Host requirement, and no keep-alive unless asked for.
    let old = http::raw(gw.port, b"GET /echo/x HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(old.status, 200, "{}", old.text());
    assert_eq!(old.header("connection"), Some("close"));
}

#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    let mut requests = String::new();
    for i in 1..=3 {
        requests.push_str(&format!("GET /echo/{i} HTTP/1.1\r\nHost: gw\r\n\r\n"));
    }
    requests.push_str("GET /echo/4 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n");
    let responses = http::pipelined(gw.port, requests.as_bytes()).unwrap();
    let paths: Vec<String> = responses
        .iter()
        .map(|r| {
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["path"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(paths, ["/echo/1", "/echo/2", "/echo/3", "/echo/4"]);
    // A limit still counts each of them: four protected requests in one write.
    let mut requests = String::new();
    for i in 1..=4 {
        let close = if i == 4 { "Connection: close\r\n" } else { "" };
        requests.push_str(&format!(
            "GET /orders/{i} HTTP/1.1\r\nHost: gw\r\nX-Api-Key: {KEY}\r\n{close}\r\n"
        ));
    }
    let responses = http::pipelined(gw.port, requests.as_bytes()).unwrap();
    assert_eq!(responses.len(), 4);
    for (response, left) in responses.iter().zip([49, 48, 47, 46]) {
        assert_eq!(response.status, 200, "{}", response.text());
        let ratelimit = response.header("ratelimit").unwrap_or_default();
        assert!(
            ratelimit.starts_with(&format!("\"per-minute\";r={left};")),
            "{ratelimit}"
        );
    }
}

#[test]
fn config_shows_no_credential_of_any_redis_url_syntax() {
    let up = Upstream::start("a");
    for url in [
        "redis+unix:///tmp/turnstile-test-none.sock?db=1&pass=hunter2-unix",
        "unix:///tmp/turnstile-test-none.sock?pass=hunter2-unix",
        "redis://gw:hunter2-userinfo@127.0.0.1:1/0",
        "redis://:hunter2-userinfo@127.0.0.1:1",
    ] {
        let gw = Gateway::start(&format!(
            "[store]\nkind = \"redis\"\nurl = \"{url}\"\n{}",
            config(&up)
        ));
        let view = gw.admin("/config").text();
        assert!(!view.contains("hunter2"), "{url}: {view}");
        assert!(view.contains("***"), "{view}");
        assert!(!gw.proc.log_text().contains("hunter2"), "{url} in the log");
    }
}
