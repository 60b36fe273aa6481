//! CORS in real browsers (headless Chromium and Firefox): a page on another origin calls an
//! API behind the gateway with `fetch()`. From an allowed origin it reads the bodies and, on
//! the 429, `Retry-After` and `RateLimit`; from any other the browser itself blocks the call.
//! Preflights never reach the upstream and never move the client's quota.

use crate::common;

use common::browser::Browser;
use common::{Gateway, Upstream};
use serde_json::Value;

const KEY: &str = "browser-ada-key-0123456789";

fn config(up: &Upstream, allowed: u16) -> String {
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
upstream = "orders"
auth = "api_key"
cors = {{ origins = ["http://127.0.0.1:{allowed}"], headers = ["x-api-key"] }}
"#,
        addr = up.addr()
    )
}

/// `fetch`es `url` `times` times with the API key (a header that needs a preflight); what
/// the page could read of each answer, or the error the browser gave it.
fn calls(browser: &Browser, url: &str, times: u32, with_key: bool) -> Value {
    let headers = if with_key {
        format!("{{ 'X-Api-Key': '{KEY}' }}")
    } else {
        "{}".to_owned()
    };
    browser.eval_async(&format!(
        "const done = arguments[arguments.length - 1];
         (async () => {{
           const out = [];
           for (let i = 0; i < {times}; i++) {{
             try {{
               const r = await fetch('{url}', {{ headers: {headers} }});
               out.push({{ status: r.status, body: await r.text(),
                          retryAfter: r.headers.get('Retry-After'),
                          rateLimit: r.headers.get('RateLimit'),
                          requestId: r.headers.get('X-Request-Id') }});
             }} catch (e) {{
               out.push({{ error: e.name }});
             }}
           }}
           return out;
         }})().then(done);"
    ))
}

fn quota_used(gw: &Gateway) -> u64 {
    let r = gw.get_with("/_turnstile/quota", &[("X-Api-Key", KEY)]);
    assert_eq!(r.status, 200, "{}", r.text());
    3 - r.json()["routes"][0]["limits"][0]["remaining"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_page_on_an_allowed_origin_reads_answers_and_refusals_and_others_are_blocked() {
    let page = "<!doctype html><html><body>another site</body></html>".to_owned();
    let allowed = common::page::serve(page.clone());
    let other = common::page::serve(page);
    for name in ["chromium", "firefox"] {
        let up = Upstream::start("orders");
        let gw = Gateway::start_with("quota_path = \"/_turnstile/quota\"", &config(&up, allowed));
        let browser = match name {
            "chromium" => Browser::start(1024, 768),
            _ => Browser::firefox(1024, 768),
        };
        let api = format!("http://127.0.0.1:{}/echo/api/orders", gw.port);

        browser.open(&format!("http://127.0.0.1:{allowed}/"));
        let answers = calls(&browser, &api, 4, true);
        let answers = answers
            .as_array()
            .unwrap_or_else(|| panic!("{name}: {answers}"));
        for (i, answer) in answers[..3].iter().enumerate() {
            assert_eq!(answer["status"], 200, "{name} call {i}: {answer}");
            assert!(
                answer["body"].as_str().unwrap().contains("\"upstream\""),
                "{name}: the page reads the body: {answer}"
            );
            assert!(answer["requestId"].is_string(), "{name}: {answer}");
        }
        let refused = &answers[3];
        assert_eq!(refused["status"], 429, "{name}: {refused}");
        assert!(refused["retryAfter"].is_string(), "{name}: {refused}");
        assert!(
            refused["rateLimit"]
                .as_str()
                .is_some_and(|v| v.contains("r=0")),
            "{name}: {refused}"
        );
        assert!(
            refused["body"].as_str().unwrap().contains("per-hour"),
            "{name}: {refused}"
        );
        let preflights = gw.metric(
            "turnstile_cors_preflights_total",
            &[("route", "api"), ("outcome", "allowed")],
        );
        assert!(preflights >= 1.0, "{name}: the browser sent preflights");
        assert_eq!(up.served(), 3, "{name}: no preflight reached the upstream");
        assert_eq!(quota_used(&gw), 3, "{name}: no preflight moved the quota");

        // Another origin: the preflight is refused and the browser never sends the call; a
        // call that needs no preflight is sent, but its answer is kept from the page.
        browser.open(&format!("http://127.0.0.1:{other}/"));
        let blocked = calls(&browser, &api, 1, true);
        assert_eq!(blocked[0]["error"], "TypeError", "{name}: {blocked}");
        assert_eq!(up.served(), 3, "{name}");
        let simple = calls(&browser, &format!("{api}?simple"), 1, false);
        assert_eq!(simple[0]["error"], "TypeError", "{name}: {simple}");
        assert_eq!(
            gw.metric(
                "turnstile_cors_preflights_total",
                &[("route", "api"), ("outcome", "refused")],
            ),
            1.0,
            "{name}"
        );
        assert_eq!(quota_used(&gw), 3, "{name}");
    }
}
