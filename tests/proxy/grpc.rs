//! gRPC-native answers, seen by a real gRPC library (Python `grpcio`, `tests/clients/
//! grpc_call.py`) through a real gateway: every answer the gateway gives a gRPC call itself
//! is a gRPC status with its metadata — RESOURCE_EXHAUSTED with the RateLimit headers and a
//! retry pushback, UNAUTHENTICATED, UNIMPLEMENTED, UNAVAILABLE (fail-closed limiter, an
//! unreachable upstream) — while HTTP clients keep problem+json; and `grpc-timeout` is the
//! call's deadline (DEADLINE_EXCEEDED from the gateway, the rest of it passed upstream).

use crate::common;

use common::grpc::{call_within, GrpcServer, SilentServer};
use common::python::{client_script, clients};
use common::tls::Ca;
use common::{free_port, Gateway};
use serde_json::Value;
use std::time::Duration;

const KEY: &str = "grpc-answers-key-0123456789";

/// One unary call by grpcio through the gateway on `port`.
fn grpcio(port: u16, method: &str, metadata: &[(&str, &str)]) -> Value {
    python_call(
        "grpc_call.py",
        &format!("127.0.0.1:{port}"),
        method,
        metadata,
    )
}

/// One unary call by sonora, a gRPC-Web client (HTTP/1), through the gateway on `port`.
fn grpc_web(port: u16, method: &str, metadata: &[(&str, &str)]) -> Value {
    let url = format!("http://127.0.0.1:{port}");
    python_call("grpc_web_call.py", &url, method, metadata)
}

/// Runs a client script of `tests/clients/` for one call of "hello"; its JSON output.
fn python_call(script: &str, target: &str, method: &str, metadata: &[(&str, &str)]) -> Value {
    let mut cmd = std::process::Command::new(clients());
    cmd.arg(client_script(script))
        .arg(target)
        .arg(method)
        .arg("hello");
    for (k, v) in metadata {
        cmd.arg(format!("{k}={v}"));
    }
    let out = cmd.output().expect("run a client script");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client script prints JSON")
}

/// Metadata `name` of a call, initial or trailing (a trailers-only answer has only the
/// latter).
fn meta<'a>(call: &'a Value, name: &str) -> Option<&'a str> {
    call["trailing"][name]
        .as_str()
        .or_else(|| call["initial"][name].as_str())
}

fn config(grpc_port: u16, ca: &std::path::Path, dead: u16) -> String {
    format!(
        r#"
[upstreams.grpc]
servers = ["127.0.0.1:{grpc_port}"]
tls = true
tls_sni = "grpc.test"
tls_ca_file = "{ca}"
http2 = true

[upstreams.gone]
servers = ["127.0.0.1:{dead}"]
http2 = true

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 2, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "echo"
path_prefix = "/echo.Echo"
upstream = "grpc"
auth = "api_key"

[[routes]]
name = "gone"
path_prefix = "/gone.Gone"
upstream = "gone"
"#,
        ca = ca.display(),
    )
}

#[test]
fn a_grpc_library_sees_the_gateways_answers_as_grpc_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "grpc", "grpc service", &["grpc.test"]);
    let grpc = GrpcServer::start(&server.cert, &server.key, None);
    let gw = Gateway::start_with("h2c = true", &config(grpc.port, &ca_file, free_port()));
    let key = [("x-api-key", KEY)];

    // Through to the service and back, twice (the plan allows 2 a minute).
    for _ in 0..2 {
        let ok = grpcio(gw.port, "/echo.Echo/Say", &key);
        assert_eq!(ok["code"], "OK", "{ok}");
        assert_eq!(ok["reply"], "hello");
    }
    // The third: RESOURCE_EXHAUSTED, with what an HTTP client would have been told.
    let limited = grpcio(gw.port, "/echo.Echo/Say", &key);
    assert_eq!(limited["code"], "RESOURCE_EXHAUSTED", "{limited}");
    assert!(
        limited["details"].as_str().unwrap().contains("rate limit"),
        "{limited}"
    );
    let retry_after: u64 = meta(&limited, "retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    assert_eq!(
        meta(&limited, "grpc-retry-pushback-ms").unwrap(),
        (retry_after * 1000).to_string()
    );
    assert!(
        meta(&limited, "ratelimit-policy").is_some_and(|p| p.contains("per-minute")),
        "{limited}"
    );
    assert!(meta(&limited, "x-request-id").is_some());
    // Counted as what it is: a 429, not the 200 on the wire.
    gw.assert_counted(
        "turnstile_requests_total",
        &[("route", "echo"), ("status", "429")],
        1.0,
    );

    // No key, a wrong key: UNAUTHENTICATED.
    let anonymous = grpcio(gw.port, "/echo.Echo/Say", &[]);
    assert_eq!(anonymous["code"], "UNAUTHENTICATED", "{anonymous}");
    let wrong = grpcio(
        gw.port,
        "/echo.Echo/Say",
        &[("x-api-key", "not-a-key-0123456789")],
    );
    assert_eq!(wrong["code"], "UNAUTHENTICATED", "{wrong}");
    // No route: UNIMPLEMENTED.
    let nowhere = grpcio(gw.port, "/other.Service/Call", &key);
    assert_eq!(nowhere["code"], "UNIMPLEMENTED", "{nowhere}");
    // The upstream refuses connections: UNAVAILABLE, which gRPC's retry policies retry.
    let gone = grpcio(gw.port, "/gone.Gone/Call", &[]);
    assert_eq!(gone["code"], "UNAVAILABLE", "{gone}");
    assert!(
        gone["details"]
            .as_str()
            .unwrap()
            .contains("could not be reached"),
        "{gone}"
    );

    // An HTTP client on the same route still gets problem+json.
    let http = gw.get_with("/echo.Echo/Say", &key);
    assert_eq!(http.status, 429);
    assert!(http
        .header("content-type")
        .unwrap()
        .contains("problem+json"));
}

/// gRPC-Web (browsers, HTTP/1 clients) reads its status from the same trailers-only answer:
/// HTTP 200, `grpc-status` in the header, no body. Before, it got problem+json, whose body a
/// gRPC-Web library reads as a message (sonora reported OK with the JSON as the reply).
#[test]
fn a_grpc_web_client_sees_the_gateways_answers_as_grpc_statuses() {
    let gw = Gateway::start(&format!(
        r#"
[upstreams.gone]
servers = ["127.0.0.1:{dead}"]

[plans.one]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 1, window = "1m" }}]

[[clients]]
id = "ada"
plan = "one"
api_keys = ["{KEY}"]

[[routes]]
name = "web"
path_prefix = "/echo.Echo"
upstream = "gone"
auth = "api_key"
cors = {{ origins = ["https://app.example"], headers = ["x-api-key", "content-type", "x-grpc-web"] }}
"#,
        dead = free_port()
    ));
    let key = [("x-api-key", KEY)];
    // Admitted, then the upstream refuses the connection: UNAVAILABLE.
    let gone = grpc_web(gw.port, "/echo.Echo/Say", &key);
    assert_eq!(gone["code"], "UNAVAILABLE", "{gone}");
    // The plan allows one a minute: RESOURCE_EXHAUSTED.
    let limited = grpc_web(gw.port, "/echo.Echo/Say", &key);
    assert_eq!(limited["code"], "RESOURCE_EXHAUSTED", "{limited}");
    assert!(
        limited["details"].as_str().unwrap().contains("rate limit"),
        "{limited}"
    );
    let anonymous = grpc_web(gw.port, "/echo.Echo/Say", &[]);
    assert_eq!(anonymous["code"], "UNAUTHENTICATED", "{anonymous}");
    let nowhere = grpc_web(gw.port, "/other.Service/Call", &key);
    assert_eq!(nowhere["code"], "UNIMPLEMENTED", "{nowhere}");
    gw.assert_counted(
        "turnstile_requests_total",
        &[("route", "web"), ("status", "429")],
        1.0,
    );

    // The answer on the wire, for both gRPC-Web content types: the status and the metadata
    // in the header, the content type of the call's flavour, an empty body — and, for a
    // page on an allowed origin, the CORS headers with the status exposed to its script.
    for (sent, answered) in [
        ("application/grpc-web+proto", "application/grpc-web"),
        ("application/grpc-web-text", "application/grpc-web-text"),
    ] {
        let resp = common::http::request(
            gw.port,
            "POST",
            "/echo.Echo/Say",
            &[
                ("content-type", sent),
                ("x-api-key", KEY),
                ("origin", "https://app.example"),
            ],
            b"AAAAAAVoZWxsbw==",
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(
            resp.header("access-control-allow-origin"),
            Some("https://app.example")
        );
        let exposed = resp.header("access-control-expose-headers").unwrap_or("");
        for name in ["grpc-status", "grpc-message", "retry-after", "ratelimit"] {
            assert!(exposed.contains(name), "{name} in {exposed:?}");
        }
        assert_eq!(resp.header("content-type"), Some(answered));
        assert_eq!(resp.header("grpc-status"), Some("8"));
        let retry_after: u64 = resp.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(
            resp.header("grpc-retry-pushback-ms"),
            Some((retry_after * 1000).to_string().as_str())
        );
        assert!(resp.body.is_empty(), "{}", resp.text());
    }
}

#[test]
fn a_fail_closed_limiter_is_unavailable_to_grpc_callers() {
    let dead = free_port();
    let gw = Gateway::start_with(
        "h2c = true",
        &format!(
            r#"
[upstreams.any]
servers = ["127.0.0.1:{up}"]
http2 = true

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 100, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "closed"
path_prefix = "/"
upstream = "any"
auth = "api_key"
on_store_error = "fail_closed"

[store]
kind = "redis"
url = "redis://127.0.0.1:{dead}"
timeout = "200ms"
"#,
            up = free_port()
        ),
    );
    let closed = grpcio(gw.port, "/any.Service/Call", &[("x-api-key", KEY)]);
    assert_eq!(closed["code"], "UNAVAILABLE", "{closed}");
    assert_eq!(meta(&closed, "grpc-retry-pushback-ms"), Some("1000"));
}

#[test]
fn grpc_timeout_is_the_calls_deadline_and_the_upstream_gets_what_is_left() {
    let silent = SilentServer::start();
    let gw = Gateway::start_with(
        "h2c = true",
        &format!(
            r#"
[upstreams.silent]
servers = ["127.0.0.1:{port}"]
http2 = true

[[routes]]
name = "slow"
path_prefix = "/"
upstream = "silent"
read_timeout = "1h"
"#,
            port = silent.port
        ),
    );
    // The route would wait an hour; the call's deadline is 300 ms: the gateway answers
    // DEADLINE_EXCEEDED itself (the 30 s bound only keeps a broken gateway from hanging the
    // test).
    let answer = call_within(
        Duration::from_secs(30),
        gw.port,
        "/slow.Slow/Call",
        b"x",
        &[("grpc-timeout", "300m")],
    )
    .expect("the gateway answered within the call's deadline, not the route's read_timeout");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers.get("grpc-status").unwrap(), "4");
    assert!(answer.headers.contains_key("x-request-id"));
    // The upstream was told what was left of the deadline, never more than was given.
    let received = silent.received.lock().unwrap();
    let forwarded = received[0].get("grpc-timeout").unwrap().to_str().unwrap();
    let ms: u64 = forwarded.strip_suffix('m').unwrap().parse().unwrap();
    assert!((1..=300).contains(&ms), "{forwarded}");
    drop(received);

    // A malformed deadline is refused, not ignored.
    let bad = call_within(
        Duration::from_secs(30),
        gw.port,
        "/slow.Slow/Call",
        b"x",
        &[("grpc-timeout", "soon")],
    )
    .unwrap();
    assert_eq!(bad.headers.get("grpc-status").unwrap(), "3");
    assert!(bad
        .headers
        .get("grpc-message")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("grpc-timeout"));
}
