//! Passive outlier ejection through a real gateway, with orders-api servers that fail on
//! command: a server failing every request is taken out of rotation after
//! `consecutive_failures` and comes back after the ejection time — or as soon as its active
//! health check passes — and never more than the allowed share of a pool is out at once.

use crate::common;

use common::{upstream_of, wait_until, Gateway, Upstream};

fn config(ups: &[&Upstream], outlier: &str, extra: &str) -> String {
    let servers: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.addr())).collect();
    format!(
        r#"
[upstreams.orders]
servers = [{servers}]
{extra}

[upstreams.orders.outlier_detection]
{outlier}

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
"#,
        servers = servers.join(", ")
    )
}

fn ejections(gw: &Gateway) -> f64 {
    gw.metric(
        "turnstile_upstream_ejections_total",
        &[("upstream", "orders")],
    )
}

#[test]
fn a_failing_server_is_ejected_then_comes_back_after_the_ejection_time() {
    let (a, b, c) = (
        Upstream::start("a"),
        Upstream::start("b"),
        Upstream::start("c"),
    );
    let gw = Gateway::start(&config(
        &[&a, &b, &c],
        "consecutive_failures = 3\nbase_ejection_time = \"5s\"",
        "",
    ));
    a.set_failing(503);
    // Round robin: a's third failure comes within nine requests.
    let mut failed = 0;
    for _ in 0..9 {
        if gw.get("/orders").status == 503 {
            failed += 1;
        }
    }
    assert_eq!(failed, 3, "a failed three times, then was out");
    assert_eq!(ejections(&gw), 1.0);
    let server = a.addr();
    assert_eq!(
        gw.metric(
            "turnstile_upstream_server_ejected",
            &[("upstream", "orders"), ("server", &server)]
        ),
        1.0
    );
    // Out of rotation: nothing reaches a.
    let before = a.served();
    for _ in 0..30 {
        let resp = gw.get("/orders");
        assert_eq!(resp.status, 200);
        assert_ne!(upstream_of(&resp), "a");
    }
    assert_eq!(a.served(), before);
    // Repaired, a is back after the ejection time, with no health check to say so.
    a.set_failing(0);
    wait_until("a back in rotation", || {
        upstream_of(&gw.get("/orders")) == "a"
    });
    let log = gw.proc.log_text();
    assert!(
        log.contains("ejected for 5000 ms after 3 consecutive failures"),
        "{log}"
    );
    assert!(log.contains("is back in rotation"), "{log}");
    assert_eq!(ejections(&gw), 1.0);
}

#[test]
fn never_more_than_the_allowed_share_is_out() {
    let (a, b, c, d) = (
        Upstream::start("a"),
        Upstream::start("b"),
        Upstream::start("c"),
        Upstream::start("d"),
    );
    let gw = Gateway::start(&config(
        &[&a, &b, &c, &d],
        "consecutive_failures = 2\nbase_ejection_time = \"1m\"\nmax_ejected_percent = 25",
        "",
    ));
    // Three of four fail; 25 % of four: one may be out.
    for up in [&a, &b, &c] {
        up.set_failing(500);
    }
    for _ in 0..60 {
        let _ = gw.get("/orders");
    }
    assert_eq!(ejections(&gw), 1.0);
    let out: f64 = [&a, &b, &c, &d]
        .iter()
        .map(|u| {
            gw.metric(
                "turnstile_upstream_server_ejected",
                &[("upstream", "orders"), ("server", &u.addr())],
            )
        })
        .sum();
    assert_eq!(out, 1.0);
    // The two failing servers still in rotation keep getting their share.
    let served: Vec<u64> = [&a, &b, &c].iter().map(|u| u.served()).collect();
    for _ in 0..12 {
        let _ = gw.get("/orders");
    }
    let still: usize = [&a, &b, &c]
        .iter()
        .zip(&served)
        .filter(|(u, s)| u.served() > **s)
        .count();
    assert_eq!(still, 2, "two failing servers still in rotation");
}

#[test]
fn a_passing_health_check_brings_an_ejected_server_back_early() {
    let (a, b) = (Upstream::start("a"), Upstream::start("b"));
    let gw = Gateway::start(&config(
        &[&a, &b],
        "consecutive_failures = 2\nbase_ejection_time = \"10m\"",
        "[upstreams.orders.health_check]\npath = \"/healthz\"\ninterval = \"200ms\"",
    ));
    wait_until("both healthy", || {
        gw.metric(
            "turnstile_upstream_server_healthy",
            &[("upstream", "orders"), ("server", &a.addr())],
        ) == 1.0
    });
    // a fails requests but passes its check: ejected, and back at the next check.
    a.set_failing(502);
    wait_until("a ejected", || {
        let _ = gw.get("/orders");
        ejections(&gw) >= 1.0
    });
    a.set_failing(0);
    wait_until("a back long before ten minutes", || {
        upstream_of(&gw.get("/orders")) == "a"
    });
    assert!(gw
        .proc
        .log_text()
        .contains("is back in rotation (its health check passed)"));
}
