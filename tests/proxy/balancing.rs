//! How a pool spreads requests, through a real gateway to real orders-api servers, counted
//! over many requests: weights (also for a name the pool re-resolves: the weight belongs to
//! the configured server, every address it resolves to gets it), and least request, which
//! keeps requests away from a slow server where round robin splits them evenly.

use crate::common;

use common::dns::DnsServer;
use common::{free_port, upstream_of, wait_until, Gateway, Upstream};
use std::collections::HashMap;
use std::net::Ipv4Addr;

fn count(gw: &Gateway, path: &str, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let resp = gw.get(path);
        assert_eq!(resp.status, 200);
        *seen.entry(upstream_of(&resp)).or_default() += 1;
    }
    seen
}

#[test]
fn weights_share_requests_in_proportion_and_survive_re_resolution() {
    let dns = DnsServer::start();
    let port = free_port();
    let a = Upstream::start_args("a", port, &["--host", "127.0.0.2"]);
    let b = Upstream::start_args("b", port, &["--host", "127.0.0.3"]);
    dns.set("heavy.test", &[Ipv4Addr::new(127, 0, 0, 2)]);
    let gw = Gateway::start_with(
        &format!(
            "dns_servers = [\"127.0.0.1:{}\"]\nwatch_config = false",
            dns.port
        ),
        &format!(
            r#"
[upstreams.orders]
servers = ["heavy.test:{port} weight=3", "127.0.0.3:{port}"]
resolve_interval = "200ms"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
"#
        ),
    );
    // Weighted round robin: 3 of every 4 to a. Within 10 % over 400.
    let seen = count(&gw, "/orders", 400);
    let to_a = seen.get("a").copied().unwrap_or(0);
    assert!((270..=330).contains(&to_a), "{seen:?}");
    // The name now resolves to b's address too: each of its addresses weighs 3, the plain
    // server 1 — b gets 4 of every 7, a 3.
    dns.set(
        "heavy.test",
        &[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
    );
    wait_until("the new answer to be used", || {
        let seen = count(&gw, "/orders", 70);
        seen.get("b").copied().unwrap_or(0) > 30
    });
    let seen = count(&gw, "/orders", 700);
    let to_a = seen.get("a").copied().unwrap_or(0);
    assert!((240..=360).contains(&to_a), "a weighs 3 of 7: {seen:?}");
    let _ = (a, b);
}

#[test]
fn least_request_keeps_requests_away_from_a_slow_server() {
    let fast = Upstream::start("fast");
    let slow = Upstream::start("slow");
    slow.set_delay(1000);
    let config = |balance: &str| {
        format!(
            r#"
[upstreams.orders]
servers = ["{}", "{}"]
balance = "{balance}"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
"#,
            fast.addr(),
            slow.addr()
        )
    };
    // 8 clients at once, 15 requests each.
    let run = |gw: &Gateway| -> HashMap<String, usize> {
        let port = gw.port;
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut seen: HashMap<String, usize> = HashMap::new();
                    for _ in 0..15 {
                        let resp = common::http::get(port, "/orders");
                        assert_eq!(resp.status, 200);
                        *seen.entry(upstream_of(&resp)).or_default() += 1;
                    }
                    seen
                })
            })
            .collect();
        let mut total = HashMap::new();
        for t in threads {
            for (k, v) in t.join().unwrap() {
                *total.entry(k).or_default() += v;
            }
        }
        total
    };
    let lr = Gateway::start(&config("least_request"));
    let seen = run(&lr);
    let to_slow = seen.get("slow").copied().unwrap_or(0);
    // Round robin would send it half (60); least request only what finds it idle.
    assert!(to_slow <= 30, "least request: {seen:?}");
    let rr = Gateway::start(&config("round_robin"));
    let seen = run(&rr);
    let to_slow = seen.get("slow").copied().unwrap_or(0);
    assert!((50..=70).contains(&to_slow), "round robin: {seen:?}");
}
