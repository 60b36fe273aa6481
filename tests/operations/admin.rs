//! The admin listener: health, readiness, the optional bearer token, and the metrics
//! families after a scripted sequence of requests (asserting on the numbers).

use crate::common;

use common::{http, wait_until, Gateway, Upstream};

const KEY: &str = "metrics-key-0123456789";

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]
health_check = {{ path = "/healthz", interval = "100ms", unhealthy_threshold = 1 }}

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 2, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
ip_limit = {{ rate = "1/h", burst = 4 }}
"#,
        addr = up.addr()
    )
}

#[test]
fn health_and_readiness_follow_the_upstreams() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    assert_eq!(gw.admin("/healthz").status, 200);
    wait_until("ready", || gw.admin("/readyz").status == 200);
    let ready = gw.admin("/readyz").json();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["store"]["kind"], "memory");
    up.set_healthy(false);
    wait_until("unready once the only upstream fails its checks", || {
        gw.admin("/readyz").status == 503
    });
    assert_eq!(
        gw.admin("/readyz").json()["routes_without_healthy_upstream"],
        serde_json::json!(["orders"])
    );
    assert_eq!(
        gw.admin("/healthz").status,
        200,
        "the process itself is fine"
    );
    assert_eq!(gw.admin("/nope").status, 404);
}

#[test]
fn a_configured_admin_token_is_required() {
    let up = Upstream::start("a");
    let token = "admin-token-0123456789";
    let gw = Gateway::start_full("", &format!("token = \"{token}\""), &config(&up));
    let denied = gw.admin("/metrics");
    assert_eq!(denied.status, 401);
    assert!(!denied.text().contains(token));
    assert_eq!(
        http::get_with(
            gw.admin_port,
            "/metrics",
            &[("Authorization", "Bearer wrong-token-000000")]
        )
        .status,
        401
    );
    let ok = http::get_with(
        gw.admin_port,
        "/metrics",
        &[("Authorization", &format!("Bearer {token}"))],
    );
    assert_eq!(ok.status, 200);
    assert!(ok.text().contains("turnstile_circuit_breaker_state"));
}

#[test]
fn metrics_count_a_scripted_sequence() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    let with_key = |path: &str| gw.get_with(path, &[("X-Api-Key", KEY)]).status;
    // Per-IP burst 4: 2 admitted by the plan, 1 rejected by the plan (429), 1 unauthenticated
    // (401), then the per-IP bucket is empty: 1 rejected by it.
    assert_eq!(with_key("/orders/1"), 200);
    assert_eq!(with_key("/orders/2"), 200);
    assert_eq!(with_key("/orders/3"), 429);
    assert_eq!(gw.get("/orders/4").status, 401);
    assert_eq!(with_key("/orders/5"), 429);
    assert_eq!(gw.get("/nowhere").status, 404);

    // A request is counted when it ends, just after its response is on the wire.
    wait_until("the six requests to be counted", || {
        gw.metric("turnstile_requests_total", &[]) == 6.0
    });
    let text = gw.admin("/metrics").text();
    let m = |name: &str, labels: &[(&str, &str)]| common::metric_value(&text, name, labels);
    assert_eq!(
        m(
            "turnstile_requests_total",
            &[("route", "orders"), ("status", "200")]
        ),
        2.0
    );
    assert_eq!(
        m(
            "turnstile_requests_total",
            &[("route", "orders"), ("status", "429")]
        ),
        2.0
    );
    assert_eq!(
        m(
            "turnstile_requests_total",
            &[("route", "orders"), ("status", "401")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "turnstile_requests_total",
            &[("route", "(none)"), ("status", "404")]
        ),
        1.0
    );
    let decision = |policy: &str, outcome: &str| {
        m(
            "turnstile_limiter_decisions_total",
            &[
                ("route", "orders"),
                ("policy", policy),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(decision("ip", "allowed"), 4.0);
    assert_eq!(decision("ip", "rejected"), 1.0);
    assert_eq!(decision("per-minute", "allowed"), 2.0);
    assert_eq!(decision("per-minute", "rejected"), 1.0);
    assert_eq!(
        m("turnstile_ip_rejections_total", &[("route", "orders")]),
        1.0
    );
    assert_eq!(
        m(
            "turnstile_upstream_duration_seconds_count",
            &[("upstream", "orders")]
        ),
        2.0
    );
    assert_eq!(
        m(
            "turnstile_upstream_server_healthy",
            &[("upstream", "orders"), ("server", &up.addr())]
        ),
        1.0
    );
    assert_eq!(
        m("turnstile_tracked_entries", &[("table", "ip:orders")]),
        1.0
    );
    assert_eq!(
        m("turnstile_tracked_entries", &[("table", "store:memory")]),
        1.0
    );
    assert_eq!(
        m("turnstile_circuit_breaker_state", &[("state", "closed")]),
        1.0
    );
    assert_eq!(
        m("turnstile_circuit_breaker_state", &[("state", "open")]),
        0.0
    );
    // Whole requests per route, rejections included.
    assert_eq!(
        m(
            "turnstile_request_duration_seconds_count",
            &[("route", "orders")]
        ),
        5.0
    );
    assert!(text.contains(r#"turnstile_request_duration_seconds_bucket{route="orders",le="60"} 5"#));
    // The process and the build.
    assert!(m("process_resident_memory_bytes", &[]) > 0.0);
    assert!(m("process_open_fds", &[]) > 0.0);
    assert!(text.contains("process_cpu_seconds_total"));
    assert_eq!(
        m(
            "turnstile_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    // The load at start counts as a successful attempt.
    assert_eq!(m("turnstile_config_last_reload_success", &[]), 1.0);
    let at = m("turnstile_config_last_reload_timestamp_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(at > now - 3600.0 && at <= now, "{at} vs {now}");
    // Label values come from the config only: the key and the bad path never appear.
    assert!(!text.contains(KEY) && !text.contains("nowhere"));
}
