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

/// A read-only token (`admin.read_tokens`) reads everything a token reads — metrics,
/// clients, the configuration, refusals — and changes nothing: a reload or a new client is
/// 403, naming why, and the registry is as it was. `/config` lists its name, never its value.
#[test]
fn a_read_only_token_reads_and_changes_nothing() {
    let up = Upstream::start("a");
    let (admin, reader) = ("admin-token-0123456789", "support-token-0123456789");
    let gw = Gateway::start_full(
        "",
        &format!("token = \"{admin}\"\nread_tokens = {{ support = \"{reader}\" }}"),
        &config(&up),
    );
    let call = |method: &str, path: &str, token: &str, body: &[u8]| {
        let auth = format!("Bearer {token}");
        http::request(
            gw.admin_port,
            method,
            path,
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    for path in [
        "/metrics",
        "/clients",
        "/config",
        "/refusals",
        "/limited",
        "/readyz",
    ] {
        assert_eq!(call("GET", path, reader, b"").status, 200, "GET {path}");
    }
    assert_eq!(
        call("GET", "/metrics", "not-a-token-0000000000", b"").status,
        401
    );
    let client = br#"{"id": "eve", "plan": "small"}"#;
    for (method, path, body) in [
        ("POST", "/reload", &b""[..]),
        ("POST", "/clients", &client[..]),
        ("DELETE", "/clients/ada", &b""[..]),
    ] {
        let refused = call(method, path, reader, body);
        assert_eq!(refused.status, 403, "{method} {path}: {}", refused.text());
        assert!(
            refused.text().contains("may only read"),
            "{}",
            refused.text()
        );
        assert!(!refused.text().contains(reader));
    }
    let clients = call("GET", "/clients", reader, b"").text();
    assert!(
        clients.contains("ada") && !clients.contains("eve"),
        "{clients}"
    );
    let shown = call("GET", "/config", reader, b"").text();
    assert!(shown.contains("\"support\"") && !shown.contains(reader) && !shown.contains(admin));
    // The write token still writes.
    assert_eq!(call("POST", "/reload", admin, b"").status, 200);
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
    gw.assert_counted("turnstile_requests_total", &[], 6.0);
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

/// The admin listener reads a request one way and answers only for its own names: a second
/// `Authorization` header is refused (it took the first), a host name a DNS-rebinding page
/// would send is refused with or without a token (before, with none set, any Host read
/// `/clients` and `/config`), and client ids `.` and `..` — which no URL path can name back
/// — are refused (before, `PUT /clients/..` made one).
#[test]
fn the_admin_listener_answers_only_its_own_names_once_and_refuses_dot_ids() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up));
    let port = gw.admin_port;
    let raw = |head: &str| {
        http::raw(port, format!("{head}Connection: close\r\n\r\n").as_bytes()).unwrap()
    };
    assert_eq!(
        raw("GET /config HTTP/1.1\r\nHost: localhost:1\r\n").status,
        200
    );
    assert_eq!(
        raw(&format!(
            "GET /config HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        ))
        .status,
        200
    );
    for host in ["attacker.example", &format!("rebound.example:{port}")] {
        let resp = raw(&format!("GET /config HTTP/1.1\r\nHost: {host}\r\n"));
        assert_eq!(resp.status, 421, "{host}: {}", resp.text());
        assert!(
            !resp.text().contains("routes"),
            "nothing of the config: {}",
            resp.text()
        );
        let resp = raw(&format!(
            "POST /reload HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
        ));
        assert_eq!(resp.status, 421, "{host}");
    }
    // An operator's own name for it, configured.
    let named = Gateway::start_full("", "hosts = [\"turnstile-admin.internal\"]", &config(&up));
    let resp = http::raw(
        named.admin_port,
        b"GET /healthz HTTP/1.1\r\nHost: turnstile-admin.internal:9090\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(resp.status, 200);

    // Two Authorization headers: which one counts would be the client's choice.
    let token = "admin-token-0123456789";
    let locked = Gateway::start_full("", &format!("token = \"{token}\""), &config(&up));
    let resp = http::raw(
        locked.admin_port,
        format!(
            "GET /config HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nAuthorization: Bearer wrong-token-0000000\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());

    // Client ids `.` and `..`.
    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients.toml");
    std::fs::write(&clients, "").unwrap();
    let files = Gateway::start_full(
        &format!("clients_file = \"{}\"", clients.display()),
        &format!("tokens = {{ ops = \"{token}\" }}"),
        &config(&up),
    );
    for id in [".", ".."] {
        let resp = http::raw(
            files.admin_port,
            format!(
                "PUT /clients/{id} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 16\r\nConnection: close\r\n\r\n{{\"plan\":\"small\"}}"
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(resp.status, 422, "{id}: {}", resp.text());
    }
    assert!(!std::fs::read_to_string(&clients).unwrap().contains("id ="));
}

/// `GET /fleet`: the instances sharing a Redis store, from their heartbeats — each with its
/// version and start time, the one answering first; one that shuts down leaves the list. With
/// the memory store, only the instance itself.
#[test]
fn the_fleet_lists_the_instances_sharing_the_store_with_their_versions() {
    let redis = common::redis::RedisServer::start();
    let up = Upstream::start("a");
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nheartbeat_interval = \"100ms\"\n",
        redis.url()
    );
    let a = Gateway::start(&format!("{store}{}", config(&up)));
    let b = Gateway::start(&format!("{store}{}", config(&up)));
    let fleet = |gw: &Gateway| gw.admin("/fleet").json()["instances"].clone();
    wait_until("both instances in the fleet", || {
        fleet(&a).as_array().is_some_and(|i| i.len() == 2)
    });
    let seen = fleet(&a);
    assert_eq!(seen[0]["this"], true, "{seen}");
    assert_eq!(seen[1]["this"], false, "{seen}");
    for instance in seen.as_array().unwrap() {
        assert_eq!(instance["version"], env!("CARGO_PKG_VERSION"), "{seen}");
        assert!(instance["started_at"].as_u64().unwrap() > 1_700_000_000);
        assert!(instance["last_seen_ms"].as_u64().unwrap() < 60_000);
    }
    let b_id = seen[1]["id"].clone();
    assert_eq!(fleet(&b)[0]["id"], b_id, "b lists itself first");

    // B shuts down: it leaves the fleet.
    b.proc.signal("TERM");
    wait_until("b gone from the fleet", || {
        fleet(&a).as_array().is_some_and(|i| i.len() == 1)
    });
    assert_ne!(fleet(&a)[0]["id"], b_id);

    let alone = Gateway::start(&config(&up));
    let own = alone.admin("/fleet").json();
    assert_eq!(own["store"], "memory");
    assert_eq!(own["instances"].as_array().unwrap().len(), 1);
    assert_eq!(own["instances"][0]["this"], true);
}
