//! Address rules (`allow_ips` / `deny_ips`) through the real binary: IPv4 peers, IPv6 peers
//! and IPv4-mapped peers of a dual-stack listener; `X-Forwarded-For` believed only from a
//! trusted proxy; refused before the per-IP bucket and identity (nothing counted); a
//! 10 000-entry list; changed by a reload; `turnstile check` naming bad entries with their
//! line.

use crate::common;

use common::http::{self, raw_between};
use common::{assert_check_refuses, Gateway, Upstream};
use std::net::{IpAddr, SocketAddr};

const KEY: &str = "address-key-0123456789";

fn config(up: &Upstream, routes: &str) -> String {
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
name = "open"
path_prefix = "/open"
upstream = "orders"
add_prefix = "/echo"
{routes}
"#,
        addr = up.addr()
    )
}

/// `GET path` from `source` to the listener at `to`, with extra header lines.
fn get(source: &str, to: SocketAddr, path: &str, extra: &str) -> http::Response {
    let source: IpAddr = source.parse().unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: gw\r\n{extra}Connection: close\r\n\r\n");
    raw_between(Some(source), to, request.as_bytes())
        .unwrap_or_else(|e| panic!("GET {path} from {source} to {to}: {e}"))
}

fn v4(gw: &Gateway) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], gw.port))
}

fn assert_forbidden(resp: &http::Response, detail_has: &str) {
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    let body = resp.json();
    assert_eq!(body["type"], "https://turnstile.dev/problems/forbidden");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(detail_has), "{detail}");
}

const OFFICE: &str = r#"
[[routes]]
name = "office"
path_prefix = "/office"
upstream = "orders"
add_prefix = "/echo"
allow_ips = ["127.0.0.0/29", "::1"]
deny_ips = ["127.0.0.5"]

[[routes]]
name = "no-v6"
path_prefix = "/no-v6"
upstream = "orders"
add_prefix = "/echo"
deny_ips = ["::1/128"]
"#;

/// The same rules read on an IPv4 listener (IPv4 peers) and on a dual-stack one, where IPv4
/// clients arrive as IPv4-mapped IPv6 peers (`::ffff:127.0.0.5`) and IPv6 clients as `::1`.
#[test]
fn rules_hold_for_ipv4_ipv6_and_ipv4_mapped_peers() {
    let up = Upstream::start("addresses");
    let text = config(&up, OFFICE);
    let server = "deny_ips = [\"127.0.0.66\"]\nquota_path = \"/_quota\"";
    let plain = Gateway::start_with(server, &text);
    let dual = Gateway::start_dual_stack(server, &text);
    let dual_v4 = v4(&dual);
    let dual_v6: SocketAddr = format!("[::1]:{}", dual.port).parse().unwrap();

    for (gw, to) in [(&plain, v4(&plain)), (&dual, dual_v4)] {
        let served = up.served();
        assert_eq!(get("127.0.0.2", to, "/office/1", "").status, 200);
        assert_eq!(get("127.0.0.9", to, "/open/1", "").status, 200);
        assert_forbidden(&get("127.0.0.5", to, "/office/1", ""), "route office");
        assert_forbidden(&get("127.0.0.9", to, "/office/1", ""), "route office");
        // The server's rules come before routing: no 404 tells a refused address what exists.
        assert_forbidden(&get("127.0.0.66", to, "/open/1", ""), "this gateway");
        assert_forbidden(&get("127.0.0.66", to, "/nowhere", ""), "this gateway");
        assert_eq!(get("127.0.0.2", to, "/nowhere", "").status, 404);
        // The quota endpoint too.
        let key = format!("X-Api-Key: {KEY}\r\n");
        assert_eq!(get("127.0.0.2", to, "/_quota", &key).status, 200);
        assert_forbidden(&get("127.0.0.66", to, "/_quota", &key), "this gateway");
        assert_eq!(
            up.served(),
            served + 2,
            "refused requests never reach the upstream"
        );
        gw.assert_counted(
            "turnstile_address_refusals_total",
            &[("route", "office")],
            2.0,
        );
        gw.assert_counted(
            "turnstile_address_refusals_total",
            &[("route", "(none)")],
            3.0,
        );
    }

    // IPv6 clients of the dual-stack listener.
    assert_eq!(get("::1", dual_v6, "/office/1", "").status, 200);
    assert_eq!(get("::1", dual_v6, "/open/1", "").status, 200);
    assert_forbidden(&get("::1", dual_v6, "/no-v6/1", ""), "route no-v6");
    // An IPv4-mapped client is not `::1`: the IPv6 rule does not catch it.
    assert_eq!(get("127.0.0.1", dual_v4, "/no-v6/1", "").status, 200);
    dual.assert_counted(
        "turnstile_address_refusals_total",
        &[("route", "no-v6")],
        1.0,
    );

    // /config shows the lists as written.
    let config = dual.admin("/config").json()["config"].clone();
    assert_eq!(
        config["server"]["deny_ips"],
        serde_json::json!(["127.0.0.66/32"])
    );
    let office = &config["routes"][1];
    assert_eq!(
        office["allow_ips"],
        serde_json::json!(["127.0.0.0/29", "::1/128"])
    );
    assert_eq!(config["routes"][0]["allow_ips"], serde_json::Value::Null);
}

/// The address is the one the per-IP bucket uses: `X-Forwarded-For` counts only from a
/// trusted proxy, and a forged one from anyone else changes nothing.
#[test]
fn a_forged_forwarded_for_changes_nothing() {
    let up = Upstream::start("addresses");
    let routes = r#"
[[routes]]
name = "guarded"
path_prefix = "/guarded"
upstream = "orders"
add_prefix = "/echo"
deny_ips = ["198.51.100.0/24", "127.0.0.7"]
"#;
    let gw = Gateway::start_with("trusted_proxies = [\"127.0.0.2\"]", &config(&up, routes));
    let to = v4(&gw);
    let xff = |ip: &str| format!("X-Forwarded-For: {ip}\r\n");
    // Untrusted peers: their own address decides, whatever they claim.
    assert_forbidden(
        &get("127.0.0.7", to, "/guarded/1", &xff("203.0.113.5")),
        "guarded",
    );
    assert_eq!(
        get("127.0.0.3", to, "/guarded/1", &xff("198.51.100.9")).status,
        200
    );
    // The trusted proxy: the address it names decides.
    assert_forbidden(
        &get("127.0.0.2", to, "/guarded/1", &xff("198.51.100.9")),
        "guarded",
    );
    assert_eq!(
        get("127.0.0.2", to, "/guarded/1", &xff("203.0.113.5")).status,
        200
    );
    // A client's forged hop ahead of the proxy's: the proxy's (rightmost) entry decides.
    let chain = xff("203.0.113.5, 198.51.100.9");
    assert_forbidden(&get("127.0.0.2", to, "/guarded/1", &chain), "guarded");
    let chain = xff("198.51.100.9, 203.0.113.5");
    assert_eq!(get("127.0.0.2", to, "/guarded/1", &chain).status, 200);
}

/// Refused before the per-IP bucket and identity: a refused address gets 403 every time,
/// never 401 or 429, and spends nothing of the bucket or of any limit.
#[test]
fn a_refused_address_spends_nothing() {
    let up = Upstream::start("addresses");
    let routes = r#"
[[routes]]
name = "keyed"
path_prefix = "/keyed"
upstream = "orders"
add_prefix = "/echo"
auth = "api_key"
ip_limit = { rate = "1/h", burst = 2 }
deny_ips = ["127.0.0.4"]
"#;
    let gw = Gateway::start(&config(&up, routes));
    let to = v4(&gw);
    let key = format!("X-Api-Key: {KEY}\r\n");
    for _ in 0..4 {
        assert_forbidden(&get("127.0.0.4", to, "/keyed/1", ""), "keyed");
        assert_forbidden(&get("127.0.0.4", to, "/keyed/1", &key), "keyed");
    }
    gw.assert_counted(
        "turnstile_address_refusals_total",
        &[("route", "keyed")],
        8.0,
    );
    let decisions = |outcome: &str| {
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[
                ("route", "keyed"),
                ("policy", "per-hour"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(decisions("allowed"), 0.0, "no plan limit was spent");
    assert_eq!(
        gw.metric("turnstile_ip_rejections_total", &[("route", "keyed")]),
        0.0
    );
    // The client's quota is whole, and the bucket of another address works as before.
    assert_eq!(get("127.0.0.3", to, "/keyed/1", &key).status, 200);
    assert_eq!(get("127.0.0.3", to, "/keyed/1", &key).status, 200);
    assert_eq!(get("127.0.0.3", to, "/keyed/1", &key).status, 429);
    assert_eq!(decisions("allowed"), 2.0);
}

/// A 10 000-entry deny list, then an allow list as long, swapped by a reload.
#[test]
fn ten_thousand_entries_and_a_reload() {
    let up = Upstream::start("addresses");
    let list = |around: &str| {
        let mut entries: Vec<String> = (0..9_999u32)
            .map(|i| format!("\"10.{}.{}.0/24\"", i / 256 % 256, i % 256))
            .collect();
        entries.insert(4_321, format!("\"{around}\""));
        entries.join(", ")
    };
    let deny = format!(
        "\n[[routes]]\nname = \"long\"\npath_prefix = \"/long\"\nupstream = \"orders\"\nadd_prefix = \"/echo\"\ndeny_ips = [{}]\n",
        list("127.0.0.3")
    );
    let gw = Gateway::start(&config(&up, &deny));
    let to = v4(&gw);
    assert_forbidden(&get("127.0.0.3", to, "/long/1", ""), "long");
    assert_eq!(get("127.0.0.4", to, "/long/1", "").status, 200);
    let shown = gw.admin("/config").json()["config"]["routes"][1]["deny_ips"].clone();
    assert_eq!(shown.as_array().map(Vec::len), Some(10_000));

    let allow = deny
        .replace("deny_ips", "allow_ips")
        .replace("127.0.0.3", "127.0.0.4");
    gw.rewrite(&config(&up, &allow));
    assert_eq!(gw.reload().status, 200);
    assert_forbidden(&get("127.0.0.3", to, "/long/1", ""), "long");
    assert_eq!(get("127.0.0.4", to, "/long/1", "").status, 200);
}

/// `turnstile check` names each bad entry by its TOML path and line.
#[test]
fn check_names_bad_rules_with_their_path_and_line() {
    let text = r#"[server]
listen = "127.0.0.1:1"
deny_ips = ["10.0.0.5/8"]

[upstreams.api]
servers = ["127.0.0.1:9"]

[[routes]]
name = "office"
path_prefix = "/office"
upstream = "api"
allow_ips = ["10.1.0.0/16"]
deny_ips = ["not-an-ip", "10.0.0.0/8"]

[[routes]]
name = "nobody"
path_prefix = "/nobody"
upstream = "api"
allow_ips = []
"#;
    assert_check_refuses(
        text,
        &[
            "server.deny_ips[0]: \"10.0.0.5/8\" has bits set past its prefix: write 10.0.0.0/8",
            "(line 3,",
            "routes[0].deny_ips[0]: \"not-an-ip\": expected a CIDR",
            "(line 13,",
            "routes[0].allow_ips[0]: 10.1.0.0/16 lies inside deny_ips[1] (10.0.0.0/8)",
            "(line 12,",
            "routes[1].allow_ips: an empty allow list lets no address in",
            "(line 19,",
        ],
    );
}
