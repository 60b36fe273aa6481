//! Routes that answer themselves, through the real binary: a redirect keeps its configured
//! host whatever the request says (no open redirect) and carries the path and query; a fixed
//! answer has its status, body and type; both still meet the per-IP bucket, and neither
//! reaches the upstream. `turnstile check` refuses targets without a host.

use crate::common;

use common::{assert_check_refuses, http, Gateway, Upstream};
use std::io::{Read, Write};

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[[routes]]
name = "moved"
path_prefix = "/old"
strip_prefix = true
redirect = {{ to = "https://new.example.com/v2${{path}}", status = 308 }}

[[routes]]
name = "docs"
path_prefix = "/docs"
redirect = {{ to = "https://docs.example.com/start?from=gw", keep_query = false }}

[[routes]]
name = "retired"
path_prefix = "/v1"
ip_limit = {{ rate = "1/h", burst = 3 }}
respond = {{ status = 410, body = '{{"title":"v1 is retired: use /v2"}}', content_type = "application/problem+json" }}

[[routes]]
name = "live"
path_prefix = "/echo"
upstream = "orders"
"#,
        addr = up.addr()
    )
}

#[test]
fn a_redirect_keeps_its_host_and_carries_the_path_and_query() {
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(&up));
    for host in [
        "gw.example.com",
        "evil.example",
        "new.example.com.evil.example",
    ] {
        let resp = http::request(
            gw.port,
            "POST",
            "/old/orders/7?page=2&x=%2F%2Fevil",
            &[("Host", host), ("X-Forwarded-Host", "evil.example")],
            b"{}",
        );
        assert_eq!(resp.status, 308, "{}", resp.text());
        assert_eq!(
            resp.header("location"),
            Some("https://new.example.com/v2/orders/7?page=2&x=%2F%2Fevil")
        );
        assert!(resp.header("x-request-id").is_some());
    }
    // A path that looks like another host stays a path of the configured one.
    let resp = gw.get("/old//evil.example/x");
    assert!(
        resp.header("location")
            .is_some_and(|l| l.starts_with("https://new.example.com/v2/")),
        "{:?}",
        resp.header("location")
    );
    let docs = gw.get("/docs/anything?q=1");
    assert_eq!(docs.status, 301);
    assert_eq!(
        docs.header("location"),
        Some("https://docs.example.com/start?from=gw")
    );
    assert_eq!(up.served(), 0, "nothing was proxied");
    assert_eq!(gw.get("/echo/x").status, 200);
    let config = gw.admin("/config").json();
    assert_eq!(
        config["config"]["routes"][0]["answers"],
        "redirect 308 https://new.example.com/v2${path}"
    );
}

#[test]
fn a_fixed_answer_has_its_status_body_and_type_and_meets_the_per_ip_bucket() {
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(&up));
    let resp = gw.get("/v1/orders");
    assert_eq!(resp.status, 410);
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(resp.json()["title"], "v1 is retired: use /v2");
    // HEAD: the same head, no body (read to the end of the connection).
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    conn.write_all(b"HEAD /v1/orders HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 410"), "{head}");
    let length = format!("content-length: {}", resp.body.len());
    assert!(head.to_ascii_lowercase().contains(&length), "{head}");
    assert_eq!(body, "");
    assert_eq!(gw.get("/v1/orders").status, 410);
    assert_eq!(gw.get("/v1/orders").status, 429, "the bucket's burst is 3");
    assert_eq!(up.served(), 0);
}

#[test]
fn check_refuses_answers_that_cannot_be_right() {
    let route = "[upstreams.orders]\nservers = [\"127.0.0.1:9\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n";
    assert_check_refuses(
        &format!("{route}redirect = {{ to = \"/new${{path}}\" }}\n"),
        &["routes[0].redirect.to", "with its host", "(line 7"],
    );
    assert_check_refuses(
        &format!("{route}redirect = {{ to = \"https://${{path}}\", status = 303 }}\n"),
        &["redirect.status", "redirect.to"],
    );
    assert_check_refuses(
        &format!(
            "{route}redirect = {{ to = \"https://a.example\" }}\nrespond = {{ status = 200 }}\n"
        ),
        &["routes[0].respond", "either redirects or responds"],
    );
    assert_check_refuses(route, &["routes[0].upstream", "is required"]);
    assert_check_refuses(
        &format!("[server]\nhttps_redirect = true\n\n{route}upstream = \"orders\"\n"),
        &["server.https_redirect", "[server.tls]", "(line 2"],
    );
    assert_check_refuses(
        &format!("{route}respond = {{ status = 204, body = \"x\" }}\n"),
        &["respond.body"],
    );
}

#[test]
fn check_warns_of_what_a_route_that_answers_itself_never_reaches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    let route = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nrespond = { status = 410 }\ncost = 2\n\n[[routes.limits]]\nname = \"l\"\nalgorithm = \"fixed_window\"\nkey = [\"ip\"]\nlimit = 5\nwindow = \"1m\"\n";
    std::fs::write(&path, route).unwrap();
    let (code, out, err) = common::turnstile(&["check", path.to_str().unwrap()]);
    let said = format!("{out}{err}");
    assert_eq!(code, 0, "warnings, not errors: {said}");
    for key in ["limits", "cost"] {
        assert!(
            said.contains(&format!("routes[0].{key}")) && said.contains("is never used"),
            "{key} in {said}"
        );
    }
    assert!(!said.contains("routes[0].retry"), "{said}");
}
