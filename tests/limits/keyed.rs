//! Keyed limits end to end: routes limited per account, per address + account, per header
//! value or route-wide, counted once across three gateways sharing a real Redis (and across a
//! real Redis Cluster's slots), decided with the client's plan in one store call.

use crate::common;

use common::redis::{RedisCluster, RedisServer};
use common::{http, Gateway, Upstream};
use std::net::Ipv4Addr;

const KEY: &str = "keyed-key-0123456789abcdef";
const SECRET: &str = "keyed-limits-test-secret";

/// A store, an upstream, a plan of `plan_limit` per hour for client "ada", and `routes`.
fn config(store: &str, up: &Upstream, plan_limit: u64, routes: &str) -> String {
    format!(
        r#"
{store}

[upstreams.main]
servers = ["{addr}"]

[plans.p]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = {plan_limit}, window = "1h" }}]

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

{routes}
"#,
        addr = up.addr()
    )
}

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    )
}

fn server_extra() -> String {
    format!("key_hash_secret = \"{SECRET}\"")
}

const LOGIN: &str = r#"
[[routes]]
name = "login"
path_prefix = "/echo/login"
upstream = "main"
methods = ["POST"]

[[routes.limits]]
name = "per-account"
algorithm = "sliding_window"
limit = 5
window = "15m"
key = ["body:username"]

[[routes.limits]]
name = "per-address-and-account"
algorithm = "fixed_window"
limit = 3
window = "15m"
key = ["ip", "body:username"]
"#;

/// A login attempt for `user` from `source` (a loopback address: any 127.0.0.0/8 works).
fn login(port: u16, source: Ipv4Addr, body: &str, content_type: &str) -> http::Response {
    let req = format!(
        "POST /echo/login HTTP/1.1\r\nHost: gw\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    http::raw_from(Some(source), port, req.as_bytes()).expect("login request")
}

fn json_login(port: u16, source: Ipv4Addr, user: &str) -> http::Response {
    let body = format!(r#"{{"username": "{user}", "password": "hunter2"}}"#);
    login(port, source, &body, "application/json")
}

fn admitted(statuses: &[u16]) -> usize {
    statuses.iter().filter(|s| **s == 200).count()
}

/// Counts Redis holds for keys matching `pattern` (field `c` of window limits).
fn counts(redis: &RedisServer, pattern: &str) -> Vec<u64> {
    let keys: Vec<String> = redis.cmd(&["KEYS", pattern]);
    keys.iter()
        .map(|k| {
            redis
                .cmd::<Option<String>>(&["HGET", k, "c"])
                .map_or(0, |c| c.parse().unwrap())
        })
        .collect()
}

#[test]
fn a_login_limit_counts_each_account_once_across_the_fleet_whatever_the_address() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(&redis_store(&redis), &up, 1000, LOGIN);
    let gateways: Vec<Gateway> = (0..3)
        .map(|_| Gateway::start_with(&server_extra(), &text))
        .collect();
    // 20 attempts on one account, each from another address, round robin over 3 gateways.
    let statuses: Vec<u16> = (0..20u8)
        .map(|i| {
            let gw = &gateways[i as usize % 3];
            json_login(gw.port, Ipv4Addr::new(127, 0, 1, i + 1), "Ada@Example.com").status
        })
        .collect();
    assert_eq!(admitted(&statuses), 5, "{statuses:?}");
    let refused = json_login(
        gateways[0].port,
        Ipv4Addr::new(127, 0, 1, 99),
        "ada@example.com",
    );
    assert_eq!(refused.status, 429, "the same account, spelled otherwise");
    assert_eq!(
        refused.json()["violated-policies"],
        serde_json::json!(["per-account"])
    );
    assert!(refused
        .header("ratelimit-policy")
        .unwrap()
        .contains(r#""per-account";q=5;w=900"#));
    // Another account is untouched, and its body reaches the upstream byte for byte.
    let body = r#"{"username": "grace", "password": "x"}"#;
    let ok = login(
        gateways[1].port,
        Ipv4Addr::new(127, 0, 1, 1),
        body,
        "application/json",
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["body"], body);
    assert_eq!(ok.json()["body_bytes"], body.len());
    let rejected: f64 = gateways
        .iter()
        .map(|gw| {
            gw.metric(
                "turnstile_limiter_decisions_total",
                &[("policy", "per-account"), ("outcome", "rejected")],
            )
        })
        .sum();
    assert_eq!(rejected, 16.0, "decisions are counted per limit");
    // The store keys are short hashes: no account name in Redis.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(keys
        .iter()
        .all(|k| !k.contains("ada") && !k.contains("grace")));
}

#[test]
fn a_flood_of_accounts_from_one_address_is_cut_by_the_per_ip_bucket_before_the_store() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let login = LOGIN.replace(
        "methods = [\"POST\"]",
        "methods = [\"POST\"]\nip_limit = { rate = \"1/h\", burst = 4 }",
    );
    let gw = Gateway::start_with(
        &server_extra(),
        &config(&redis_store(&redis), &up, 1000, &login),
    );
    let source = Ipv4Addr::new(127, 0, 6, 1);
    let statuses: Vec<u16> = (0..30)
        .map(|i| json_login(gw.port, source, &format!("user-{i}")).status)
        .collect();
    assert_eq!(admitted(&statuses), 4);
    // Only the four requests the bucket let through made keys (two limits each).
    let keys: Vec<String> = redis.cmd(&["KEYS", "*per-*"]);
    assert_eq!(keys.len(), 8, "{keys:?}");
}

#[test]
fn address_and_account_together_count_per_pair() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        &server_extra(),
        &config(&redis_store(&redis), &up, 1000, LOGIN),
    );
    let from = |ip: u8| Ipv4Addr::new(127, 0, 2, ip);
    let first: Vec<u16> = (0..4)
        .map(|_| json_login(gw.port, from(1), "eve").status)
        .collect();
    assert_eq!(first, [200, 200, 200, 429], "3 per address and account");
    assert_eq!(
        json_login(gw.port, from(1), "eve").json()["violated-policies"],
        serde_json::json!(["per-address-and-account"])
    );
    // From another address the pair is fresh, but the account's own limit (5) ends it.
    let second: Vec<u16> = (0..3)
        .map(|_| json_login(gw.port, from(2), "eve").status)
        .collect();
    assert_eq!(second, [200, 200, 429]);
}

#[test]
fn a_route_wide_limit_counts_every_client_together_and_a_header_keyed_one_per_value() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let routes = r#"
[[routes]]
name = "reports"
path_prefix = "/echo/reports"
upstream = "main"

[[routes.limits]]
name = "route-total"
algorithm = "fixed_window"
limit = 10
window = "1h"
key = ["route"]

[[routes]]
name = "tenants"
path_prefix = "/echo/tenants"
upstream = "main"

[[routes.limits]]
name = "per-tenant"
algorithm = "token_bucket"
limit = 3
window = "1h"
key = ["header:x-tenant-id"]
missing = "skip"
"#;
    let text = config(&redis_store(&redis), &up, 1000, routes);
    let gateways: Vec<Gateway> = (0..3)
        .map(|_| Gateway::start_with(&server_extra(), &text))
        .collect();
    // 30 requests from 30 addresses over 3 gateways: 10 in all.
    let statuses: Vec<u16> = (0..30u8)
        .map(|i| {
            let req = b"GET /echo/reports/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";
            let source = Ipv4Addr::new(127, 0, 3, i + 1);
            http::raw_from(Some(source), gateways[i as usize % 3].port, req)
                .unwrap()
                .status
        })
        .collect();
    assert_eq!(admitted(&statuses), 10, "{statuses:?}");
    let tenant =
        |gw: &Gateway, t: &str| gw.get_with("/echo/tenants/x", &[("X-Tenant-Id", t)]).status;
    let acme: Vec<u16> = (0..5).map(|i| tenant(&gateways[i % 3], "acme")).collect();
    assert_eq!(acme, [200, 200, 200, 429, 429]);
    assert_eq!(tenant(&gateways[0], "globex"), 200, "another tenant");
    assert_eq!(
        tenant(&gateways[0], "ACME "),
        429,
        "normalised: the same tenant"
    );
    // No tenant header: this limit says skip.
    assert_eq!(gateways[1].get("/echo/tenants/x").status, 200);
    // Two headers: which one counts would be the client's choice, so it is refused.
    let twice = b"GET /echo/tenants/x HTTP/1.1\r\nHost: gw\r\nX-Tenant-Id: a\r\nX-Tenant-Id: b\r\nConnection: close\r\n\r\n";
    assert_eq!(http::raw(gateways[0].port, twice).unwrap().status, 400);
}

#[test]
fn a_missing_part_is_refused_skipped_or_shared_and_huge_values_stay_short_keys() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let route = |name: &str, missing: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"/echo/{name}\"\nupstream = \"main\"\n\n[[routes.limits]]\nname = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\nkey = [\"body:user\", \"header:x-device\"]\nmissing = \"{missing}\"\n"
        )
    };
    let routes = [
        route("reject", "reject"),
        route("skip", "skip"),
        route("shared", "shared"),
    ]
    .concat();
    let gw = Gateway::start_with(
        &format!("{}\nmax_header_bytes = 65536", server_extra()),
        &config(&redis_store(&redis), &up, 1000, &routes),
    );
    let post = |path: &str, body: &str, extra: &str| {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            body.len()
        );
        http::raw(gw.port, req.as_bytes()).unwrap()
    };
    // The field is missing (no body at all).
    let refused = post("/echo/reject/x", "", "X-Device: d1\r\n");
    assert_eq!(refused.status, 400);
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("per-user"),
        "{}",
        refused.text()
    );
    let skipped: Vec<u16> = (0..4)
        .map(|_| post("/echo/skip/x", "", "X-Device: d1\r\n").status)
        .collect();
    assert_eq!(skipped, [200; 4]);
    // The missing part is one shared value; the parts present still tell requests apart.
    let shared: Vec<u16> = (0..3)
        .map(|_| post("/echo/shared/x", "", "X-Device: d1\r\n").status)
        .collect();
    assert_eq!(
        shared,
        [200, 200, 429],
        "requests lacking the field share a count"
    );
    assert_eq!(post("/echo/shared/x", "", "X-Device: d2\r\n").status, 200);
    // A body larger than body_key_bytes is not read: its fields count as missing.
    let big = format!("user=ada&pad={}", "x".repeat(9000));
    assert_eq!(post("/echo/reject/x", &big, "X-Device: d1\r\n").status, 400);
    // Huge values (a 40 KB header, a 7 KB field) are keys like any other.
    let device = "d".repeat(40_000);
    let user = "u".repeat(7_000);
    let ok = post(
        "/echo/reject/x",
        &format!("user={user}"),
        &format!("X-Device: {device}\r\n"),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.len() < 120), "{keys:?}");
}

#[test]
fn when_a_plan_limit_or_a_keyed_limit_rejects_the_other_counts_nothing() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let routes = r#"
[[routes]]
name = "orders"
path_prefix = "/echo/orders"
upstream = "main"
auth = "api_key"

[[routes.limits]]
name = "per-address"
algorithm = "fixed_window"
limit = 5
window = "1h"
key = ["ip"]
"#;
    let gw = Gateway::start_with(
        &server_extra(),
        &config(&redis_store(&redis), &up, 3, routes),
    );
    let get = |source: Ipv4Addr| {
        let req = format!("GET /echo/orders/x HTTP/1.1\r\nHost: gw\r\nX-Api-Key: {KEY}\r\nConnection: close\r\n\r\n");
        http::raw_from(Some(source), gw.port, req.as_bytes()).unwrap()
    };
    // The plan (3) rejects first: the address's count stays at the 3 admitted.
    let a = Ipv4Addr::new(127, 0, 4, 1);
    let statuses: Vec<u16> = (0..6).map(|_| get(a).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    assert_eq!(counts(&redis, "*per-address*"), [3]);
    assert_eq!(counts(&redis, "*{ada}*per-hour*"), [3]);
    let last = get(a);
    assert_eq!(
        last.json()["violated-policies"],
        serde_json::json!(["per-hour"])
    );
    assert!(last
        .header("ratelimit")
        .unwrap()
        .contains(r#""per-address";r=2"#));
}

#[test]
fn on_redis_cluster_limits_in_several_slots_give_back_what_one_slot_took() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("a");
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    );
    let routes = r#"
[[routes]]
name = "orders"
path_prefix = "/echo/orders"
upstream = "main"
auth = "api_key"

[[routes.limits]]
name = "route-total"
algorithm = "sliding_window"
limit = 100
window = "1h"
key = ["route"]

[[routes.limits]]
name = "per-address"
algorithm = "token_bucket"
limit = 4
window = "1h"
key = ["ip"]
"#;
    let gateways: Vec<Gateway> = (0..2)
        .map(|_| Gateway::start_with(&server_extra(), &config(&store, &up, 3, routes)))
        .collect();
    let get = |i: usize| {
        let req = format!("GET /echo/orders/x HTTP/1.1\r\nHost: gw\r\nX-Api-Key: {KEY}\r\nConnection: close\r\n\r\n");
        http::raw_from(
            Some(Ipv4Addr::new(127, 0, 5, 1)),
            gateways[i % 2].port,
            req.as_bytes(),
        )
        .unwrap()
    };
    let statuses: Vec<u16> = (0..8).map(|i| get(i).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    // Three slots (the client's, the route's, the address's): the keyed counts kept only
    // the three admitted requests.
    let keys = cluster.all_keys();
    let slots: std::collections::HashSet<i64> = keys
        .iter()
        .filter(|(_, k)| {
            k.contains("per-hour") || k.contains("route-total") || k.contains("per-address")
        })
        .map(|(_, k)| cluster.nodes[0].cmd::<i64>(&["CLUSTER", "KEYSLOT", k]))
        .collect();
    assert_eq!(slots.len(), 3, "{keys:?}");
    let total = keys
        .iter()
        .find(|(_, k)| k.contains("route-total"))
        .unwrap();
    let node = cluster.nodes.iter().find(|n| n.port == total.0).unwrap();
    let c: String = node.cmd(&["HGET", &total.1, "c"]);
    assert_eq!(c, "3", "rejected requests gave their units back");
    // The per-address token bucket: 4 tokens, 3 spent.
    let last = get(0);
    assert!(
        last.header("ratelimit")
            .unwrap()
            .contains(r#""per-address";r=1"#),
        "{:?}",
        last.header("ratelimit")
    );
}

#[test]
fn a_client_expecting_100_continue_gets_it_before_it_sends_the_login() {
    use std::io::{Read, Write};
    let up = Upstream::start("a");
    let gw = Gateway::start_with(&server_extra(), &config("", &up, 1000, LOGIN));
    let body = r#"{"username": "ada", "password": "x"}"#;
    let head = format!(
        "POST /echo/login HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    // Nothing of the body is sent until the interim answer arrives (bounded by the timeout).
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        let n = stream
            .read(&mut byte)
            .expect("an interim 100 before the body is sent");
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&interim));
        interim.push(byte[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&interim)
    );
    stream.write_all(body.as_bytes()).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let (resp, _) = http::parse(&rest).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["body"], body);
    // The upstream was not asked for a second 100: the gateway holds the body already.
    let headers = resp.json()["headers"].to_string().to_ascii_lowercase();
    assert!(!headers.contains("100-continue"), "{headers}");
    // curl, which waits for the 100 (here up to 30 s) before it sends the body.
    let out = std::process::Command::new("curl")
        .args([
            "-sv",
            "--expect100-timeout",
            "30",
            "-H",
            "Expect: 100-continue",
        ])
        .args(["-H", "Content-Type: application/json", "--data", body])
        .arg(format!("http://127.0.0.1:{}/echo/login", gw.port))
        .output()
        .expect("run curl");
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert!(verbose.contains("< HTTP/1.1 100 Continue"), "{verbose}");
    assert!(verbose.contains("< HTTP/1.1 200"), "{verbose}");
}

#[test]
fn a_flood_of_usernames_is_held_to_max_tracked_keys_and_frees_nobody() {
    let up = Upstream::start("a");
    let extra = format!("{}\nmax_tracked_keys = 200", server_extra());
    let gw = Gateway::start_with(&extra, &config("", &up, 1000, LOGIN));
    let victim = Ipv4Addr::new(127, 0, 7, 1);
    let statuses: Vec<u16> = (0..4)
        .map(|_| json_login(gw.port, victim, "victim").status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429], "3 per address and account");
    // 3 000 distinct accounts from many addresses.
    for i in 0..3000u32 {
        let source = Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250) as u8 + 1);
        json_login(gw.port, source, &format!("user-{i}"));
    }
    let tracked = gw.metric("turnstile_tracked_entries", &[("table", "store:memory")]);
    // The cap, plus at most one overflow entry per shard and route (64 shards at most here).
    assert!(tracked <= 200.0 + 64.0, "{tracked} entries tracked");
    assert!(
        tracked >= 100.0,
        "{tracked}: the flood was tracked up to the cap"
    );
    assert_eq!(
        json_login(gw.port, victim, "victim").status,
        429,
        "the victim's count survived the flood"
    );
}
