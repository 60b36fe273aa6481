//! CORS through the real binary (a real browser's view is `operations/cors_browser.rs`):
//! preflights answered at the edge — never authenticated, sent upstream or charged, still
//! bounded by the per-IP bucket — the headers every answer to an allowed origin carries (the
//! gateway's own 401 and 429 too), the upstream's own CORS headers replaced or kept, and
//! `turnstile check` refusing what cannot be right.

use crate::common;

use common::{assert_check_refuses, http, Gateway, Upstream};

const KEY: &str = "cors-ada-key-0123456789";
const APP: &str = "https://app.example.com";

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 3, window = "1h" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "api"
path_prefix = "/echo/api"
methods = ["GET", "POST", "PUT"]
upstream = "orders"
auth = "api_key"
ip_limit = {{ rate = "1/h", burst = 100 }}
cors = {{ origins = ["HTTPS://App.Example.com:443", "https://*.example.org"], methods = ["GET", "put"], headers = ["x-api-key", "content-type"], expose = ["x-upstream-name"], credentials = true, max_age = "10m" }}

[[routes]]
name = "keep"
path_prefix = "/echo/keep"
upstream = "orders"
cors = {{ origins = ["*"], upstream = "keep" }}

[[routes]]
name = "tight"
path_prefix = "/echo/tight"
upstream = "orders"
ip_limit = {{ rate = "1/h", burst = 2 }}
cors = {{ origins = ["*"] }}

[[routes]]
name = "plain"
path_prefix = "/echo/plain"
upstream = "orders"
"#,
        addr = up.addr()
    )
}

fn preflight(
    gw: &Gateway,
    path: &str,
    origin: &str,
    method: &str,
    headers: &str,
) -> http::Response {
    let mut h = vec![
        ("Origin", origin),
        ("Access-Control-Request-Method", method),
    ];
    if !headers.is_empty() {
        h.push(("Access-Control-Request-Headers", headers));
    }
    http::request(gw.port, "OPTIONS", path, &h, b"")
}

fn preflights(gw: &Gateway, outcome: &str) -> f64 {
    gw.metric(
        "turnstile_cors_preflights_total",
        &[("route", "api"), ("outcome", outcome)],
    )
}

#[test]
fn a_preflight_is_answered_at_the_edge_with_what_the_route_allows() {
    let up = Upstream::start("cors");
    let gw = Gateway::start(&config(&up));
    let resp = preflight(
        &gw,
        "/echo/api/orders",
        APP,
        "PUT",
        "X-Api-Key, Content-Type",
    );
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert_eq!(resp.header("access-control-allow-origin"), Some(APP));
    assert_eq!(
        resp.header("access-control-allow-methods"),
        Some("GET, PUT")
    );
    assert_eq!(
        resp.header("access-control-allow-headers"),
        Some("x-api-key, content-type")
    );
    assert_eq!(
        resp.header("access-control-allow-credentials"),
        Some("true")
    );
    assert_eq!(resp.header("access-control-max-age"), Some("600"));
    assert_eq!(resp.header("vary"), Some("Origin"));
    assert!(resp.header("x-request-id").is_some());
    // One wildcard label, normalised.
    let sub = preflight(
        &gw,
        "/echo/api/x",
        "https://Shop.Example.org:443",
        "GET",
        "",
    );
    assert_eq!(sub.status, 204);
    assert_eq!(
        sub.header("access-control-allow-origin"),
        Some("https://Shop.Example.org:443"),
        "the origin as the browser sent it"
    );
    assert_eq!(preflights(&gw, "allowed"), 2.0);

    for (origin, method, headers, why) in [
        ("https://evil.example", "GET", "", "origin"),
        ("https://app.example.com.evil.net", "GET", "", "origin"),
        ("https://a.b.example.org", "GET", "", "origin"),
        ("https://example.org", "GET", "", "origin"),
        ("null", "GET", "", "origin"),
        ("http://app.example.com", "GET", "", "origin"),
        (APP, "POST", "", "method"),
        (APP, "PUT", "x-api-key, x-admin", "header"),
    ] {
        let resp = preflight(&gw, "/echo/api/orders", origin, method, headers);
        assert_eq!(
            resp.status,
            403,
            "{origin} {method} {headers}: {}",
            resp.text()
        );
        assert!(resp.text().contains(why), "{why}: {}", resp.text());
        assert_eq!(
            resp.header("content-type"),
            Some("application/problem+json")
        );
        if why == "origin" {
            assert_eq!(resp.header("access-control-allow-origin"), None);
        }
    }
    assert_eq!(preflights(&gw, "refused"), 8.0);
    assert_eq!(up.served(), 0, "no preflight reached the upstream");

    // A route without cors: an OPTIONS request like any other, sent upstream.
    let plain = preflight(&gw, "/echo/plain/x", APP, "GET", "");
    assert_eq!(plain.status, 200);
    assert_eq!(plain.json()["method"], "OPTIONS");
    assert_eq!(up.served(), 1);
}

#[test]
fn preflights_are_never_charged_but_the_per_ip_bucket_bounds_them() {
    let up = Upstream::start("cors");
    let gw = Gateway::start(&config(&up));
    for _ in 0..10 {
        assert_eq!(
            preflight(&gw, "/echo/api/1", APP, "GET", "x-api-key").status,
            204
        );
    }
    let origin = [("Origin", APP), ("X-Api-Key", KEY)];
    for i in 0..3 {
        let resp = gw.get_with("/echo/api/1", &origin);
        assert_eq!(
            resp.status, 200,
            "request {i}: preflights took nothing of the plan"
        );
        assert_eq!(resp.header("access-control-allow-origin"), Some(APP));
        assert_eq!(
            resp.header("access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(
            resp.header("access-control-expose-headers"),
            Some("ratelimit, ratelimit-policy, retry-after, x-request-id, x-upstream-name")
        );
        assert!(resp.header("ratelimit").is_some());
    }
    // The gateway's own refusals carry them too: a page can read why.
    let refused = gw.get_with("/echo/api/1", &origin);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("access-control-allow-origin"), Some(APP));
    assert!(refused
        .header("access-control-expose-headers")
        .is_some_and(|v| v.contains("retry-after")));
    assert!(refused.header("retry-after").is_some());
    let unauthorized = gw.get_with("/echo/api/1", &[("Origin", APP)]);
    assert_eq!(unauthorized.status, 401);
    assert_eq!(
        unauthorized.header("access-control-allow-origin"),
        Some(APP)
    );
    assert_eq!(up.served(), 3);

    // Another origin is answered as ever, without the headers (the browser keeps it from
    // the page); the answer still says it varies by origin.
    let other = gw.get_with("/echo/keep/1", &[("Origin", "null")]);
    assert_eq!(other.status, 200);
    assert_eq!(other.header("access-control-allow-origin"), None);
    assert_eq!(other.header("vary"), Some("Origin"));

    // A preflight flood from one address meets the per-IP bucket first.
    let statuses: Vec<u16> = (0..4)
        .map(|_| preflight(&gw, "/echo/tight/1", APP, "GET", "").status)
        .collect();
    assert_eq!(statuses, [204, 204, 429, 429]);
}

#[test]
fn the_upstreams_cors_headers_are_replaced_or_kept_as_the_route_says() {
    let up = Upstream::start("cors");
    let gw = Gateway::start(&config(&up));
    let replaced = gw.get_with("/echo/api/1?acao=1", &[("Origin", APP), ("X-Api-Key", KEY)]);
    assert_eq!(replaced.status, 200);
    assert_eq!(replaced.header("access-control-allow-origin"), Some(APP));
    assert!(replaced
        .header("access-control-expose-headers")
        .is_some_and(|v| v.starts_with("ratelimit")));
    let kept = gw.get_with("/echo/keep/1?acao=1", &[("Origin", APP)]);
    assert_eq!(kept.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        kept.header("access-control-expose-headers"),
        Some("x-upstream-name")
    );
    let ours = gw.get_with("/echo/keep/1", &[("Origin", APP)]);
    assert_eq!(ours.header("access-control-allow-origin"), Some(APP));
    assert_eq!(ours.header("access-control-allow-credentials"), None);
    let config = gw.admin("/config").json();
    let cors = &config["config"]["routes"][0]["cors"];
    assert_eq!(cors["origins"][0], APP);
    assert_eq!(cors["origins"][1], "https://*.example.org");
}

#[test]
fn check_refuses_cors_that_cannot_be_right() {
    let base = "[upstreams.orders]\nservers = [\"127.0.0.1:9\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"orders\"\n";
    assert_check_refuses(
        &format!("{base}cors = {{ origins = [\"*\"], credentials = true }}\n"),
        &["routes[0].cors.origins[0]", "credentials", "(line 8"],
    );
    assert_check_refuses(
        &format!("{base}cors = {{ origins = [\"app.example.com\", \"https://*.com\", \"https://a.*.b.com\"] }}\n"),
        &["origins[0]", "is not an origin", "origins[1]", "origins[2]"],
    );
    assert_check_refuses(
        &format!("{base}cors = {{ origins = [\"https://a.example.com\"], methods = [\"OPTIONS\"], upstream = \"merge\" }}\nresponse_headers = {{ set = {{ \"Access-Control-Allow-Origin\" = \"*\" }} }}\n"),
        &["methods[0]", "upstream", "access-control-allow-origin"],
    );
}

/// `[server] cors` is every route's that has none of its own; `cors = "off"` opts out.
#[test]
fn the_servers_cors_is_every_routes_default() {
    let up = Upstream::start("cors");
    let server = format!("cors = {{ origins = [\"{APP}\"] }}");
    let text = format!(
        "[upstreams.orders]\nservers = [\"{}\"]\n\n\
         [[routes]]\nname = \"a\"\npath_prefix = \"/echo/a\"\nupstream = \"orders\"\n\n\
         [[routes]]\nname = \"own\"\npath_prefix = \"/echo/own\"\nupstream = \"orders\"\ncors = {{ origins = [\"https://other.example\"] }}\n\n\
         [[routes]]\nname = \"none\"\npath_prefix = \"/echo/none\"\nupstream = \"orders\"\ncors = \"off\"\n",
        up.addr()
    );
    let gw = Gateway::start_with(&server, &text);
    let origin = |path: &str| {
        gw.get_with(path, &[("Origin", APP)])
            .header("access-control-allow-origin")
            .map(str::to_owned)
    };
    assert_eq!(origin("/echo/a/1").as_deref(), Some(APP));
    assert_eq!(origin("/echo/own/1"), None, "its own origins only");
    assert_eq!(origin("/echo/none/1"), None);
    assert_eq!(preflight(&gw, "/echo/a/1", APP, "GET", "").status, 204);
    let off = preflight(&gw, "/echo/none/1", APP, "GET", "");
    assert_eq!(
        off.json()["method"],
        "OPTIONS",
        "sent upstream like any OPTIONS"
    );
    assert_check_refuses(
        &format!(
            "[server]\n{server}\n\n{}",
            text.replace("cors = \"off\"", "cors = \"no\"")
        ),
        &["invalid cors \"no\""],
    );
}

#[test]
fn the_quota_endpoint_answers_other_origins_by_the_servers_cors() {
    let up = Upstream::start("cors");
    let server = format!(
        "quota_path = \"/_quota\"\ncors = {{ origins = [\"{APP}\"], headers = [\"x-api-key\"] }}"
    );
    let gw = Gateway::start_with(&server, &config(&up));
    let allow_origin =
        |r: &http::Response| r.header("access-control-allow-origin").map(str::to_owned);
    // A browser asks first (its fetch sends X-Api-Key): answered here, not authenticated.
    let asked = preflight(&gw, "/_quota", APP, "GET", "x-api-key");
    assert_eq!(asked.status, 204, "{}", asked.text());
    assert_eq!(allow_origin(&asked).as_deref(), Some(APP));
    assert!(asked
        .header("access-control-allow-headers")
        .is_some_and(|h| h.contains("x-api-key")));
    assert_eq!(
        preflight(&gw, "/_quota", "https://evil.example", "GET", "").status,
        403
    );
    // The answer itself, and a refusal, readable by the page.
    let quota = gw.get_with("/_quota", &[("Origin", APP), ("X-Api-Key", KEY)]);
    assert_eq!(quota.status, 200, "{}", quota.text());
    assert_eq!(allow_origin(&quota).as_deref(), Some(APP));
    assert!(quota
        .header("access-control-expose-headers")
        .is_some_and(|h| h.to_ascii_lowercase().contains("ratelimit")));
    assert_eq!(quota.json()["client"], "ada");
    let refused = gw.get_with(
        "/_quota",
        &[("Origin", APP), ("X-Api-Key", "no-such-key-0123456789")],
    );
    assert_eq!(refused.status, 401);
    assert_eq!(allow_origin(&refused).as_deref(), Some(APP));
    let elsewhere = gw.get_with(
        "/_quota",
        &[("Origin", "https://evil.example"), ("X-Api-Key", KEY)],
    );
    assert_eq!(elsewhere.status, 200);
    assert_eq!(allow_origin(&elsewhere), None);
    assert_eq!(up.served(), 0, "nothing of it went upstream");
}
