//! End-to-end tests of the in-process limiting chain (per-IP bucket, API keys, plan limits in
//! the memory store, the 429 contract) through the real gateway binary.

use crate::common;

use common::{http, Gateway, Upstream};

const ADA_KEY: &str = "ada-key-0123456789abcdef";
const BOB_KEY: &str = "bob-key-0123456789abcdef";

/// sha256("bob-key-0123456789abcdef"), so one client is configured by digest.
fn bob_digest() -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(BOB_KEY.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn config(upstream: &Upstream, routes: &str) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.free]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 3, window = "1m" }}]

[plans.wide]
limits = [
  {{ name = "per-day", algorithm = "token_bucket", limit = 100, window = "1d" }},
  {{ name = "per-hour", algorithm = "sliding_window", limit = 5, window = "1h" }},
]

[[clients]]
id = "ada"
plan = "free"
api_keys = ["{ADA_KEY}"]

[[clients]]
id = "bob"
plan = "wide"
api_keys = ["sha256:{bob}"]

{routes}
"#,
        addr = upstream.addr(),
        bob = bob_digest()
    )
}

fn route(name: &str, prefix: &str, extra: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"orders\"\n{extra}\n")
}

fn with_key(gw: &Gateway, path: &str, key: &str) -> http::Response {
    gw.get_with(path, &[("X-Api-Key", key)])
}

fn assert_429(resp: &http::Response, violated: &[&str]) -> serde_json::Value {
    assert_eq!(resp.status, 429, "{}", resp.text());
    assert_eq!(
        resp.header("content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = resp
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1);
    assert!(resp.header("ratelimit-policy").is_some());
    assert!(resp.header("ratelimit").is_some());
    let body = resp.json();
    assert_eq!(body["status"], 429);
    assert_eq!(
        body["type"],
        "https://turnstile.dev/problems/quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(violated));
    body
}

#[test]
fn per_ip_bucket_rejects_with_the_full_429_contract() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &route(
            "orders",
            "/orders",
            r#"ip_limit = { rate = "1/m", burst = 3 }"#,
        ),
    ));
    for remaining in [2, 1, 0] {
        let resp = gw.get("/orders");
        assert_eq!(resp.status, 200);
        // A token bucket advertises its capacity over the time it takes to refill it.
        assert_eq!(resp.header("ratelimit-policy"), Some(r#""ip";q=3;w=180"#));
        // A full bucket is 3 tokens at 1 per minute: 60 s per missing token.
        let t = (3 - remaining) * 60;
        assert_eq!(
            resp.header("ratelimit"),
            Some(format!(r#""ip";r={remaining};t={t}"#).as_str())
        );
    }
    let resp = gw.get("/orders");
    assert_429(&resp, &["ip"]);
    assert_eq!(resp.header("retry-after"), Some("60"));
    assert_eq!(resp.header("ratelimit-policy"), Some(r#""ip";q=3;w=180"#));
    assert_eq!(resp.header("ratelimit"), Some(r#""ip";r=0;t=180"#));
    assert!(
        resp.header("x-upstream-name").is_none(),
        "a rejected request must not reach the upstream"
    );
}

#[test]
fn a_spoofed_forwarded_for_from_an_untrusted_peer_lands_in_the_peers_bucket() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        r#"trusted_proxies = ["10.0.0.0/8"]"#,
        &config(
            &up,
            &route(
                "orders",
                "/orders",
                r#"ip_limit = { rate = "1/h", burst = 2 }"#,
            ),
        ),
    );
    let statuses: Vec<u16> = ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]
        .iter()
        .map(|fake| gw.get_with("/orders", &[("X-Forwarded-For", fake)]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
}

#[test]
fn a_trusted_proxys_forwarded_for_is_honoured() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(
        r#"trusted_proxies = ["127.0.0.0/8"]"#,
        &config(
            &up,
            &route(
                "orders",
                "/orders",
                r#"ip_limit = { rate = "1/h", burst = 2 }"#,
            ),
        ),
    );
    let get = |xff: &str| gw.get_with("/orders", &[("X-Forwarded-For", xff)]).status;
    assert_eq!(
        [get("1.1.1.1"), get("1.1.1.1"), get("1.1.1.1")],
        [200, 200, 429]
    );
    // Another client behind the same proxy has its own bucket.
    assert_eq!(get("2.2.2.2"), 200);
    // The client cannot escape by prepending an address: the proxy-written entry counts.
    assert_eq!(get("9.9.9.9, 1.1.1.1"), 429);
    // IPv6 clients are grouped per /64.
    assert_eq!(
        [
            get("2001:db8:0:1::1"),
            get("2001:db8:0:1::2"),
            get("2001:db8:0:1::3")
        ],
        [200, 200, 429]
    );
    assert_eq!(get("2001:db8:0:2::1"), 200);
    // Garbage falls back to the peer (the proxy itself) instead of creating a bucket.
    assert_eq!(
        [get("garbage"), get("not-an-ip"), get("???")],
        [200, 200, 429]
    );
}

#[test]
fn unknown_missing_and_ambiguous_keys_are_refused_before_any_limit() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &route("orders", "/orders", r#"auth = "api_key""#),
    ));
    let resp = gw.get("/orders");
    assert_eq!(resp.status, 401, "{}", resp.text());
    assert_eq!(
        resp.json()["type"],
        "https://turnstile.dev/problems/unauthorized"
    );
    assert!(resp
        .header("www-authenticate")
        .is_some_and(|v| v.starts_with("Bearer")));
    assert!(resp.header("ratelimit").is_none());

    let resp = with_key(&gw, "/orders", "not-a-known-key-000000");
    assert_eq!(resp.status, 401);
    assert!(
        !resp.text().contains("not-a-known-key"),
        "the key must not be echoed"
    );

    let resp = gw.get_with(
        "/orders",
        &[
            ("X-Api-Key", ADA_KEY),
            ("Authorization", &format!("Bearer {BOB_KEY}")),
        ],
    );
    assert_eq!(resp.status, 400);

    // A Bearer token works as well as X-Api-Key.
    let resp = gw.get_with(
        "/orders",
        &[("Authorization", &format!("Bearer {ADA_KEY}"))],
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    // Unknown keys used no quota: ada still has exactly 2 of 3 left after that one request.
    let resp = with_key(&gw, "/orders", ADA_KEY);
    assert!(
        resp.header("ratelimit")
            .unwrap()
            .starts_with(r#""per-minute";r=1;"#),
        "{:?}",
        resp.header("ratelimit")
    );
}

#[test]
fn clients_are_limited_independently_by_their_plans() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &route("orders", "/orders", r#"auth = "api_key""#),
    ));
    for r in [2, 1, 0] {
        let resp = with_key(&gw, "/orders", ADA_KEY);
        assert_eq!(resp.status, 200);
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some(r#""per-minute";q=3;w=60"#)
        );
        assert!(resp
            .header("ratelimit")
            .unwrap()
            .starts_with(&format!(r#""per-minute";r={r};t="#)));
    }
    let body = assert_429(&with_key(&gw, "/orders", ADA_KEY), &["per-minute"]);
    assert!(body["detail"].is_string());
    // bob is on another plan with his own counters, configured by digest.
    let resp = with_key(&gw, "/orders", BOB_KEY);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some(r#""per-day";q=100;w=86400, "per-hour";q=5;w=3600"#)
    );
}

#[test]
fn a_plan_with_several_limits_names_the_one_that_rejected() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &route("orders", "/orders", r#"auth = "api_key""#),
    ));
    for _ in 0..5 {
        assert_eq!(with_key(&gw, "/orders", BOB_KEY).status, 200);
    }
    let resp = with_key(&gw, "/orders", BOB_KEY);
    assert_429(&resp, &["per-hour"]);
    let ratelimit = resp.header("ratelimit").unwrap();
    // The per-day bucket still has what it had: the rejected request burnt nothing there.
    assert!(ratelimit.starts_with(r#""per-day";r=95;"#), "{ratelimit}");
    assert!(ratelimit.contains(r#""per-hour";r=0;"#), "{ratelimit}");
}

#[test]
fn a_costly_route_charges_several_units() {
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &route("reports", "/orders", "auth = \"api_key\"\ncost = 2"),
    ));
    assert_eq!(with_key(&gw, "/orders", BOB_KEY).status, 200);
    assert_eq!(with_key(&gw, "/orders", BOB_KEY).status, 200);
    // 4 of 5 per-hour units used; the next request needs 2.
    assert_429(&with_key(&gw, "/orders", BOB_KEY), &["per-hour"]);
}

#[test]
fn header_modes_and_legacy_headers() {
    let up = Upstream::start("a");
    let routes = [
        route(
            "quiet",
            "/echo/quiet",
            "auth = \"api_key\"\nrate_limit_headers = \"off\"",
        ),
        route(
            "near",
            "/echo/near",
            "auth = \"api_key\"\nrate_limit_headers = \"near_limit\"",
        ),
        route(
            "legacy",
            "/echo/legacy",
            "auth = \"api_key\"\nlegacy_rate_limit_headers = true",
        ),
    ]
    .concat();
    let gw = Gateway::start(&config(&up, &routes));
    // off: admitted responses carry no quota headers; the rejection still does.
    for _ in 0..3 {
        let resp = with_key(&gw, "/echo/quiet/1", ADA_KEY);
        assert_eq!(resp.status, 200);
        assert!(resp.header("ratelimit").is_none() && resp.header("ratelimit-policy").is_none());
    }
    assert_429(&with_key(&gw, "/echo/quiet/1", ADA_KEY), &["per-minute"]);
    // near_limit: bob's per-hour limit of 5 is "near" once at most a tenth is left (r = 0).
    let shown: Vec<bool> = (0..5)
        .map(|_| {
            with_key(&gw, "/echo/near/1", BOB_KEY)
                .header("ratelimit")
                .is_some()
        })
        .collect();
    assert_eq!(shown, [false, false, false, false, true]);
    // legacy trio, for the most restrictive policy.
    let resp = with_key(&gw, "/echo/legacy/1", ADA_KEY);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(resp.header("x-ratelimit-remaining"), Some("2"));
    assert!(resp.header("x-ratelimit-reset").is_some());
}

#[test]
fn the_upstream_learns_the_client_id_and_never_sees_the_key() {
    let up = Upstream::start("a");
    let routes = [
        route("private", "/echo/private", "auth = \"api_key\""),
        route(
            "forwarding",
            "/echo/forwarding",
            "auth = \"api_key\"\nforward_api_key = true",
        ),
        route("public", "/echo/public", ""),
    ]
    .concat();
    let gw = Gateway::start(&config(&up, &routes));
    let headers_seen = |resp: http::Response| -> Vec<(String, String)> {
        resp.json()["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h[0].as_str().unwrap().to_owned(),
                    h[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let seen = headers_seen(gw.get_with(
        "/echo/private",
        &[("X-Api-Key", ADA_KEY), ("X-Client-Id", "mallory")],
    ));
    assert!(
        seen.contains(&("x-client-id".into(), "ada".into())),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(k, v)| k == "x-api-key" || v.contains(ADA_KEY) || v == "mallory"),
        "{seen:?}"
    );
    let seen = headers_seen(gw.get_with(
        "/echo/private",
        &[("Authorization", &format!("Bearer {ADA_KEY}"))],
    ));
    assert!(!seen.iter().any(|(k, _)| k == "authorization"), "{seen:?}");

    let seen = headers_seen(gw.get_with("/echo/forwarding", &[("X-Api-Key", BOB_KEY)]));
    assert!(
        seen.contains(&("x-api-key".into(), BOB_KEY.into())),
        "{seen:?}"
    );

    // An unauthenticated route cannot pass a client id of its choosing upstream.
    let seen = headers_seen(gw.get_with("/echo/public", &[("X-Client-Id", "mallory")]));
    assert!(!seen.iter().any(|(k, _)| k == "x-client-id"), "{seen:?}");
}

#[test]
fn a_flood_of_distinct_addresses_is_bounded_and_cannot_reset_a_bucket() {
    let up = Upstream::start("a");
    let max_tracked: usize = 64;
    let burst = 2;
    let gw = Gateway::start_with(
        &format!("trusted_proxies = [\"127.0.0.0/8\"]\nmax_tracked_ips = {max_tracked}"),
        &config(
            &up,
            &route(
                "orders",
                "/orders",
                &format!("ip_limit = {{ rate = \"1/h\", burst = {burst} }}"),
            ),
        ),
    );
    let get = |ip: &str| gw.get_with("/orders", &[("X-Forwarded-For", ip)]).status;
    // The abuser empties its bucket.
    assert_eq!(
        [get("6.6.6.6"), get("6.6.6.6"), get("6.6.6.6")],
        [200, 200, 429]
    );
    // 3000 distinct addresses, far more than the table tracks.
    let mut admitted = 0;
    for i in 0..3000u32 {
        let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        if get(&ip) == 200 {
            admitted += 1;
        }
    }
    // An unbounded table would admit all 3000 (each a fresh bucket). Bounded: each tracked
    // slot and each shard's overflow bucket admits at most `burst` (the rate is 1/h).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shards = (cores * 4).max(16).next_power_of_two();
    let slots = max_tracked.div_ceil(shards) * shards;
    assert!(
        admitted <= (slots + shards) * burst,
        "admitted {admitted} of 3000"
    );
    assert!(
        admitted >= burst,
        "some of the flood must have been admitted"
    );
    // The abuser's bucket was not evicted by the flood.
    assert_eq!(get("6.6.6.6"), 429);
}

/// A monthly quota (a calendar window, memory store): the limit holds, and Retry-After and
/// the RateLimit reset point at the first of the next month, midnight in the limit's time
/// zone.
#[test]
fn a_monthly_quota_resets_at_the_first_of_the_next_month() {
    let up = Upstream::start("orders");
    let text = format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.monthly]
limits = [{{ name = "per-month", algorithm = "fixed_window", limit = 3, window = "1 month", time_zone = "Asia/Tokyo" }}]

[[clients]]
id = "ada"
plan = "monthly"
api_keys = ["{ADA_KEY}"]

{route}
"#,
        addr = up.addr(),
        route = route("orders", "/orders", "auth = \"api_key\""),
    );
    let gw = Gateway::start(&text);
    for _ in 0..3 {
        assert_eq!(with_key(&gw, "/orders", ADA_KEY).status, 200);
    }
    let before = jiff::Timestamp::now();
    let refused = with_key(&gw, "/orders", ADA_KEY);
    let after = jiff::Timestamp::now();
    assert_429(&refused, &["per-month"]);
    // The first of next month, 00:00 in Tokyo, seen from either side of the request.
    let next_month = |t: jiff::Timestamp| {
        let local = t.to_zoned_datetime(jiff::tz::TimeZone::get("Asia/Tokyo").unwrap());
        let first = local.first_of_month().unwrap().start_of_day().unwrap();
        first
            .checked_add(jiff::ToSpan::month(1))
            .unwrap()
            .timestamp()
    };
    let until = |t: jiff::Timestamp| (next_month(t).as_second() - t.as_second()) as u64;
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (until(after)..=until(before) + 1).contains(&retry),
        "Retry-After {retry}, expected {} to {}",
        until(after),
        until(before) + 1
    );
    let ratelimit = refused.header("ratelimit").unwrap().to_owned();
    assert!(ratelimit.contains(&format!("t={retry}")), "{ratelimit}");
}
