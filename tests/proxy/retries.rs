//! Retries through a real gateway to orders-api servers that fail on command, counting what
//! the servers received: a GET answered 503 by one server is tried again on the next, a POST
//! is not (unless the route names POST, and then its body is replayed whole), a timeout is
//! retried within the per-try timeout, the limits count a client request once however many
//! tries it took, and under a full outage the pool's retry budget caps the tries the servers
//! see far below `attempts` × requests.

use crate::common;

use common::{http, Gateway, Upstream};

fn retries(gw: &Gateway, reason: &str) -> f64 {
    gw.metric(
        "turnstile_upstream_retries_total",
        &[("upstream", "orders"), ("reason", reason)],
    )
}

#[test]
fn a_failed_get_is_tried_on_the_next_server_a_post_only_where_allowed() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&format!(
        r#"
[upstreams.orders]
servers = ["{a}", "{b}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
ip_limit = {{ rate = "10/m", burst = 10 }}
retry = {{ attempts = 3, on = ["503"] }}

[[routes]]
name = "create"
path_prefix = "/orders/new"
upstream = "orders"
retry = {{ attempts = 3, on = ["503"] }}

[[routes]]
name = "echo"
path_prefix = "/echo"
upstream = "orders"
retry = {{ attempts = 2, on = ["503"], methods = ["POST"] }}
"#,
        a = a.addr(),
        b = b.addr()
    ));
    a.set_failing(503);
    for _ in 0..10 {
        assert_eq!(gw.get("/orders").status, 200);
    }
    // Every try that met a was retried on b; b answered every request.
    assert_eq!(b.served(), 10);
    assert!(a.served() >= 1);
    assert_eq!(retries(&gw, "503"), a.served() as f64);
    // A retried try is said as one, at INFO; not as a failure to proxy, at WARN.
    let log = gw.proc.log_text();
    assert!(!log.contains("Fail to proxy"), "{log}");
    assert_eq!(
        log.matches("INFO turnstile::proxy::retry: route orders: try 1 failed")
            .count(),
        a.served() as usize,
        "{log}"
    );
    // The per-IP limit counted ten client requests, not the tries: the eleventh is refused.
    assert_eq!(gw.get("/orders").status, 429);

    // A POST is not repeated: a's 503 reaches the client.
    let before = retries(&gw, "503");
    let posts: Vec<u16> = (0..2)
        .map(|_| http::request(gw.port, "POST", "/orders/new", &[], b"{}").status)
        .collect();
    assert!(posts.contains(&503), "{posts:?}");
    assert_eq!(retries(&gw, "503"), before);

    // A route naming POST retries it, its body sent again whole.
    let body = vec![b'x'; 40_000];
    let met_a = a.served();
    for _ in 0..2 {
        let resp = http::request(gw.port, "POST", "/echo/upload", &[], &body);
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json()["body_bytes"], 40_000);
    }
    assert!(a.served() > met_a, "a met at least one of the two");
    assert_eq!(retries(&gw, "503"), before + (a.served() - met_a) as f64);
}

/// A retry goes to another server when the pool has one: under least request the failing
/// server, quick to answer, is the one with fewer requests in flight, and so would be drawn
/// again; under round robin concurrent requests move the turn between the tries.
#[test]
fn a_retry_is_sent_to_another_server_than_the_one_that_failed() {
    for balance in ["least_request", "round_robin"] {
        let (a, b, c) = (
            Upstream::start("a"),
            Upstream::start("b"),
            Upstream::start("c"),
        );
        a.set_failing(503);
        let gw = Gateway::start(&format!(
            r#"
[upstreams.orders]
servers = ["{a}", "{b}", "{c}"]
balance = "{balance}"
retry_budget = {{ percent = 100, min_retries = 100 }}

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
retry = {{ attempts = 2, on = ["503"], backoff = "1ms" }}
"#,
            a = a.addr(),
            b = b.addr(),
            c = c.addr()
        ));
        let port = gw.port;
        let clients: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..15)
                        .map(|_| http::get(port, "/orders").status)
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        for client in clients {
            let statuses = client.join().unwrap();
            assert!(
                statuses.iter().all(|&s| s == 200),
                "{balance}: {statuses:?}"
            );
        }
        assert!(a.served() >= 1, "{balance}: a was never tried");
        assert_eq!(b.served() + c.served(), 60, "{balance}");
        assert_eq!(retries(&gw, "503"), a.served() as f64, "{balance}");
    }
}

#[test]
fn a_timeout_is_retried_within_the_per_try_timeout() {
    let (slow, fast) = (Upstream::start("slow"), Upstream::start("fast"));
    slow.set_delay(5_000);
    let gw = Gateway::start(&format!(
        r#"
[upstreams.orders]
servers = ["{slow}", "{fast}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
read_timeout = "1m"
retry = {{ attempts = 2, on = ["timeout"], per_try_timeout = "300ms" }}
"#,
        slow = slow.addr(),
        fast = fast.addr()
    ));
    for _ in 0..4 {
        let resp = gw.get("/orders");
        assert_eq!(resp.status, 200);
        assert_eq!(common::upstream_of(&resp), "fast");
    }
    assert_eq!(retries(&gw, "timeout"), slow.served() as f64);
    assert!(slow.served() >= 1);
}

#[test]
fn under_a_full_outage_the_budget_caps_the_tries() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    for up in [&a, &b] {
        up.set_failing(503);
        up.set_delay(500);
    }
    let gw = Gateway::start(&format!(
        r#"
[upstreams.orders]
servers = ["{a}", "{b}"]
retry_budget = {{ percent = 20, min_retries = 0 }}

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
retry = {{ attempts = 5, on = ["gateway"], backoff = "10ms", max_backoff = "20ms" }}
"#,
        a = a.addr(),
        b = b.addr()
    ));
    let port = gw.port;
    let clients: Vec<_> = (0..10)
        .map(|_| std::thread::spawn(move || http::get(port, "/orders").status))
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), 503);
    }
    // Without a budget: 5 tries each, 50. With it: retries in flight at most 20 % of the
    // requests in flight (2 of 10, none below 5) — a few in all, well under one per request.
    let tries = a.served() + b.served();
    assert!((10..=20).contains(&tries), "{tries} tries for 10 requests");
    assert_eq!(retries(&gw, "503") as u64, tries - 10);
    assert!(
        gw.metric(
            "turnstile_upstream_retry_budget_exhausted_total",
            &[("upstream", "orders")]
        ) >= 1.0
    );
}
