//! Upstream names are resolved again: a DNS server the test controls (`server.dns_servers`)
//! changes its answer, and the pool follows it without a reload — new addresses take
//! traffic (after their health check), vanished ones stop getting it.

use crate::common;

use common::dns::DnsServer;
use common::{free_port, upstream_of, wait_until, Gateway, Upstream};
use std::net::Ipv4Addr;

#[test]
fn a_pool_follows_its_names_answer_without_a_reload() {
    let dns = DnsServer::start();
    // Two upstreams on the same port of two loopback addresses.
    let port = free_port();
    let a = Upstream::start_args("a", port, &["--host", "127.0.0.2"]);
    let b = Upstream::start_args("b", port, &["--host", "127.0.0.3"]);
    dns.set("orders.test", &[Ipv4Addr::new(127, 0, 0, 2)]);
    let gw = Gateway::start_with(
        &format!(
            "dns_servers = [\"127.0.0.1:{}\"]\nwatch_config = false",
            dns.port
        ),
        &format!(
            r#"
[upstreams.orders]
servers = ["orders.test:{port}"]
resolve_interval = "200ms"

[upstreams.orders.health_check]
path = "/healthz"
interval = "200ms"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
"#
        ),
    );
    for _ in 0..4 {
        assert_eq!(upstream_of(&gw.get("/orders")), "a");
    }
    // The name moves to b: traffic follows, no reload.
    dns.set("orders.test", &[Ipv4Addr::new(127, 0, 0, 3)]);
    wait_until("traffic to move to b", || {
        upstream_of(&gw.get("/orders")) == "b"
    });
    for _ in 0..4 {
        assert_eq!(upstream_of(&gw.get("/orders")), "b");
    }
    // Both: both serve.
    dns.set(
        "orders.test",
        &[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
    );
    wait_until("both to serve", || {
        let seen: std::collections::BTreeSet<String> =
            (0..6).map(|_| upstream_of(&gw.get("/orders"))).collect();
        seen.len() == 2
    });
    assert_eq!(gw.config_version(), 1, "no reload happened");
    // A lookup that finds nothing keeps the addresses the pool has (and says so).
    dns.set("orders.test", &[]);
    wait_until("the empty answer to be noticed", || {
        gw.proc.log_text().contains("keeping its addresses")
    });
    for _ in 0..4 {
        assert_eq!(gw.get("/orders").status, 200);
    }
    let _ = (a, b);
}
