//! Hostile traffic over raw TCP (bytes on the wire, nothing normalised by a client library):
//! request smuggling, oversized requests, slow clients, identity edge cases. Each gets a
//! correct, cheap answer, and nothing behind the gateway is confused: the upstream counts
//! what it receives.

use crate::common;

use common::{http, wait_until, Gateway, Upstream};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const KEY: &str = "hostile-key-0123456789";

fn config(up: &Upstream, route_extra: &str) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.p]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 1000, window = "1h" }}]

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

[[routes]]
name = "echo"
path_prefix = "/echo"
upstream = "orders"
{route_extra}

[[routes]]
name = "private"
path_prefix = "/echo/private"
upstream = "orders"
auth = "api_key"
"#,
        addr = up.addr()
    )
}

/// Sends raw bytes and reads until the server closes the connection. Fails (after 30 s)
/// if the server keeps it open.
fn send_expect_close(port: u16, bytes: &[u8]) -> http::Response {
    http::raw(port, bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn smuggling_attempts_get_400_close_the_connection_and_never_reach_the_upstream() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, ""));
    let cases: &[(&str, &str)] = &[
        ("CL and TE", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("TE and CL", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
        ("duplicate TE", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("comma-joined TE", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"),
        ("gzip, chunked", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
        ("TE identity", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n"),
        ("CL -1", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
        ("CL 1.5", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1.5\r\n\r\nab"),
        ("CL abc", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"),
        ("two CLs", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
        ("CL list", "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 4\r\n\r\nabcd"),
        ("TE on HTTP/1.0", "POST /echo/a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("space before colon", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"),
        ("obs-fold", "POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
        ("bare LF smuggled TE", "POST /echo/a HTTP/1.1\r\nHost: x\r\nX: y\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"),
    ];
    for (name, request) in cases {
        let resp = send_expect_close(gw.port, request.as_bytes());
        assert_eq!(resp.status, 400, "{name}: {}", resp.text());
    }
    // The same connection never carries a second, smuggled request: the upstream saw nothing.
    assert_eq!(up.served(), 0);
    // A clean request on the same gateway still works.
    assert_eq!(gw.get("/echo/ok").status, 200);
    assert_eq!(up.served(), 1);
}

#[test]
fn oversized_requests_get_413_414_431() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        "max_header_bytes = 4096\nmax_header_count = 20\nmax_uri_length = 256",
        &config(&up, "max_body_bytes = 1000"),
    );
    let long_uri = format!("GET /echo/{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(300));
    assert_eq!(send_expect_close(gw.port, long_uri.as_bytes()).status, 414);
    let many: String = (0..25).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET /echo/a HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    assert_eq!(send_expect_close(gw.port, many.as_bytes()).status, 431);
    let big = format!(
        "GET /echo/a HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(5000)
    );
    assert_eq!(send_expect_close(gw.port, big.as_bytes()).status, 431);
    let announced = "POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    let resp = send_expect_close(gw.port, announced.as_bytes());
    assert_eq!(resp.status, 413);
    assert_eq!(
        resp.json()["type"],
        "https://turnstile.dev/problems/payload-too-large"
    );
    assert_eq!(up.served(), 0, "none of these reached the upstream");
    // A chunked body is counted as it streams and cut off past the limit.
    let mut chunked =
        String::from("POST /echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..10 {
        chunked.push_str(&format!("1f4\r\n{}\r\n", "c".repeat(500)));
    }
    chunked.push_str("0\r\n\r\n");
    let resp = http::raw(gw.port, chunked.as_bytes());
    if let Ok(resp) = resp {
        assert_eq!(resp.status, 413, "{}", resp.text());
    } // else: the connection was closed mid-body, which also refuses it
      // Within the limits, everything passes.
    let ok = http::request(gw.port, "POST", "/echo/a", &[], &[b'd'; 900]);
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["body_bytes"], 900);
}

/// True when the server closed (EOF or reset) while we were still trickling bytes.
fn trickle_until_closed(port: u16, bytes: &[u8], gap: Duration) -> bool {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return true;
        }
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => return true, // an error response, then the close
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
        std::thread::sleep(gap);
    }
    false
}

/// Reads until EOF (or reset): true if the server closed the connection.
fn server_closes(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn slow_clients_are_cut_off_without_holding_a_worker() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        "header_timeout = \"1s\"\nbody_timeout = \"1s\"\nkeepalive_timeout = \"1s\"",
        &config(&up, ""),
    );
    let port = gw.port;
    // 40 slowloris connections at once (the gateway has 2 worker threads)...
    let loris: Vec<_> = (0..40)
        .map(|_| {
            std::thread::spawn(move || {
                let head = format!(
                    "GET /echo/slow HTTP/1.1\r\nHost: x\r\nX-Slow: {}\r\n\r\n",
                    "a".repeat(60)
                );
                trickle_until_closed(port, head.as_bytes(), Duration::from_millis(100))
            })
        })
        .collect();
    // ...while normal requests keep being served.
    for _ in 0..20 {
        assert_eq!(gw.get("/echo/fast").status, 200);
    }
    for l in loris {
        assert!(
            l.join().unwrap(),
            "a header trickling for 8 s must be cut off by the 1 s deadline"
        );
    }

    // A body that stalls halfway: the connection is closed.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"POST /echo/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .unwrap();
    assert!(
        server_closes(&mut s),
        "a stalled body must not hold the connection"
    );

    // An idle keep-alive connection is closed after keepalive_timeout.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /echo/idle HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        server_closes(&mut s),
        "an idle keep-alive connection must be closed"
    );
    assert!(!gw.proc.log_text().contains("panicked"));
}

/// On a kept-alive connection the next request's headers are due `header_timeout` after its
/// first bytes, as on a fresh connection — not after the keep-alive time plus that.
#[test]
fn a_request_begun_on_a_reused_connection_gets_header_timeout_too() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        "header_timeout = \"1s\"\nkeepalive_timeout = \"60s\"",
        &config(&up, ""),
    );
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /echo/first HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while http::parse(&got).is_err() {
        let n = s.read(&mut buf).expect("the first response");
        assert!(n > 0, "closed before the first response");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(http::parse(&got).unwrap().0.status, 200);
    // The second request starts and stalls inside its headers.
    s.write_all(b"GET /echo/second HTTP/1.1\r\nHo").unwrap();
    // Cut after ~1 s; the old deadline (60 s idle + 1 s) would outlast this read's 30 s.
    assert!(
        server_closes(&mut s),
        "a stalled head on a reused connection must be cut at header_timeout"
    );
}

#[test]
fn identity_edge_cases_never_panic_nor_create_limiter_state() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.0/8\"]\nmax_tracked_ips = 1000\nheader_timeout = \"2s\"",
        &config(&up, "ip_limit = { rate = \"1000/s\", burst = 1000 }"),
    );
    let many = vec!["10.1.2.3"; 400].join(", ");
    let long_garbage = "z".repeat(3000);
    let forwarded = [
        "garbage",
        "",
        ",,,",
        " , 1.2.3.4 , ",
        many.as_str(),
        "[2001:db8::1]:443",
        "fe80::1%eth0",
        "[fe80::1%25eth0]",
        "1.2.3.4:99999",
        "::ffff:9.9.9.9",
        "unknown, 1.2.3.4",
        long_garbage.as_str(),
    ];
    for xff in forwarded {
        let resp = gw.get_with("/echo/x", &[("X-Forwarded-For", xff)]);
        assert_eq!(resp.status, 200, "X-Forwarded-For {xff:?}: {}", resp.text());
    }
    // Non-UTF-8 bytes in the header, on the wire.
    let raw = b"GET /echo/x HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: \xff\xfe\x80, 1.2.3.4\r\nConnection: close\r\n\r\n";
    assert_eq!(http::raw(gw.port, raw).unwrap().status, 200);
    let tracked = gw.metric("turnstile_tracked_entries", &[("table", "ip:echo")]);
    assert!(
        tracked <= 12.0,
        "at most one bucket per distinct parsed address, got {tracked}"
    );

    // API keys: duplicated, empty, huge, non-ASCII.
    let dup = b"GET /echo/private/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: a-first-key-00000000\r\nX-Api-Key: a-second-key-0000000\r\nConnection: close\r\n\r\n";
    assert_eq!(http::raw(gw.port, dup).unwrap().status, 400);
    assert_eq!(
        gw.get_with("/echo/private/x", &[("X-Api-Key", "")]).status,
        401
    );
    let huge = "k".repeat(10_000);
    assert_eq!(
        gw.get_with("/echo/private/x", &[("X-Api-Key", &huge)])
            .status,
        401
    );
    let non_ascii = b"GET /echo/private/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: k\xc3\xa9y-0123456789abcdef\r\nConnection: close\r\n\r\n";
    assert_eq!(http::raw(gw.port, non_ascii).unwrap().status, 401);
    assert_eq!(
        gw.get_with("/echo/private/x", &[("Authorization", "Bearer ")])
            .status,
        401
    );
    assert_eq!(
        gw.get_with(
            "/echo/private/x",
            &[("Authorization", "Basic Zm9vOmJhcg==")]
        )
        .status,
        401
    );
    // None of those created per-client state; the valid key does.
    assert_eq!(
        gw.metric("turnstile_tracked_entries", &[("table", "store:memory")]),
        0.0
    );
    assert_eq!(
        gw.get_with("/echo/private/x", &[("X-Api-Key", KEY)]).status,
        200
    );
    assert_eq!(
        gw.metric("turnstile_tracked_entries", &[("table", "store:memory")]),
        1.0
    );

    // Garbage request lines and methods get a clean 4xx or a close, never a panic.
    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..], // a TLS ClientHello on the plain port
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
        b"G\x00T /echo HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /echo/\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n",
        b"\r\n\r\n\r\n",
    ] {
        if let Ok(resp) = http::raw(gw.port, garbage) {
            assert!(
                (400..500).contains(&resp.status),
                "{:?} got {}",
                String::from_utf8_lossy(garbage),
                resp.status
            );
        }
    }
    wait_until("the gateway to still answer", || {
        gw.get("/echo/alive").status == 200
    });
    assert!(!gw.proc.log_text().contains("panicked"));
}
