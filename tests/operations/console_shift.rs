//! The operator console through a support shift, in Chromium and in Firefox: what an operator
//! meets and what a red team tried — request ids real systems send, signing out, a phone's
//! width, a store outage, a cross-site form, guessed tokens, text that hides or turns itself
//! around, and the small things (a key count, a status line, the chart's scale, metadata, ids
//! of dots). Each case runs in both browsers.

use crate::common;

use common::browser::Browser;
use common::{free_port, http, wait_until, Gateway, Upstream};
use serde_json::json;
use std::io::{Read, Write};

const TOKEN: &str = "console-admin-token-0123456789";
const KEY: &str = "shift-client-key-0123456789abcdef";

/// A route `/orders` on a plan of 3 a day, a route `/tenants` keyed per `X-Tenant` (1 a
/// day), client `ada` with [`KEY`]; `extra` goes before the routes.
fn config(up: &Upstream, extra: &str) -> String {
    format!(
        r#"
{extra}

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = 3, window = "1d" }}]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"

[[routes]]
name = "tenants"
path_prefix = "/tenants"
upstream = "orders"
limits = [{{ name = "per-tenant", algorithm = "fixed_window", limit = 1, window = "1d", key = ["header:x-tenant"] }}]
"#,
        addr = up.addr()
    )
}

/// A gateway with the admin token, its clients in a clients file (so the console can write
/// them) holding `ada`.
fn start(up: &Upstream, dir: &tempfile::TempDir, server: &str, admin: &str) -> Gateway {
    let clients = dir.path().join("clients.toml");
    std::fs::write(
        &clients,
        format!("[[clients]]\nid = \"ada\"\nplan = \"small\"\napi_keys = [\"{KEY}\"]\n"),
    )
    .unwrap();
    Gateway::start_full(
        &format!("clients_file = \"{}\"\n{server}", clients.display()),
        &format!("tokens = {{ ops = \"{TOKEN}\" }}\n{admin}"),
        &config(up, "[registry]"),
    )
}

fn admin(
    gw: &Gateway,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> http::Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    http::request(gw.admin_port, method, path, &headers, body.as_bytes())
}

/// Runs `check` in headless Chromium, then in headless Firefox, each `width` × `height`; no
/// script error may have happened (refused calls the checks made on purpose aside).
fn in_both(width: u32, height: u32, mut check: impl FnMut(&str, &Browser)) {
    for name in ["chromium", "firefox"] {
        let browser = match name {
            "chromium" => Browser::start(width, height),
            _ => Browser::firefox(width, height),
        };
        check(name, &browser);
        let errors: Vec<String> = browser
            .errors()
            .into_iter()
            .filter(|e| {
                !["401", "403", "404", "429", "503"]
                    .iter()
                    .any(|s| e.contains(s))
            })
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
}

/// Opens the console and signs in with `token`.
fn sign_in(browser: &Browser, gw: &Gateway, token: &str) {
    browser.open(&format!("http://127.0.0.1:{}/ui/", gw.admin_port));
    browser.type_into("#token", token);
    browser.click("#sign-in-form button");
    browser.find("#tabs");
}

/// Ids as AWS, tenants' own systems and base64 encoders write them: kept by the gateway on a
/// 429, and found again by the console (percent-encoded there, decoded once here).
#[test]
fn request_ids_with_url_special_characters_are_found() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let ids = [
        "order:42",
        "tenant/7/req-1",
        "Root=1-67891233-abcdef012345678912345678",
        "a+b==",
        "q?x=1#y",
        "..",
    ];
    for _ in 0..3 {
        assert_eq!(gw.get_with("/orders", &[("X-Api-Key", KEY)]).status, 200);
    }
    for id in ids {
        let refused = gw.get_with("/orders", &[("X-Api-Key", KEY), ("X-Request-Id", id)]);
        assert_eq!(refused.status, 429);
        assert_eq!(refused.header("x-request-id"), Some(id));
    }
    // Decoded once and strictly: a raw `/` or a malformed escape is refused, not guessed at.
    for bad in [
        "/refusals/tenant/7/req-1",
        "/refusals/a%2",
        "/refusals/a%zz",
        "/refusals?id=a%2",
    ] {
        assert_eq!(admin(&gw, "GET", bad, None).status, 400, "{bad}");
    }
    for found in [
        "/refusals/order%3A42",
        "/refusals?id=%2E%2E",
        "/refusals?id=a%2Bb%3D%3D",
    ] {
        assert_eq!(
            admin(&gw, "GET", found, None).json()["caller"],
            "client:ada",
            "{found}"
        );
    }
    in_both(1280, 800, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        browser.click("#tabs [data-page=lookup]");
        for id in ids {
            browser.type_into("#request-id", id);
            browser.click("#lookup-form button");
            let why = browser.wait_text("#lookup-result", "the refusal", |t| {
                t.contains("client:ada") || t.contains("no refusal") || t.contains("error")
            });
            assert!(
                why.contains("429") && why.contains("client:ada"),
                "{name}, {id}: {why}"
            );
            browser.eval("document.querySelector('#lookup-result').replaceChildren(); return 1");
        }
    });
}

/// Signing out leaves nothing behind: not the token (in storage, in its field, in memory),
/// not a key shown once, not a table; "Sign in" with nothing typed stays signed out.
#[test]
fn signing_out_forgets_the_token_and_everything_shown() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    in_both(1280, 800, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        browser.click("#tabs [data-page=clients]");
        browser.click("#client-list .client-link");
        browser.wait_text("#detail-id", "ada's page", |t| t == "ada");
        browser.click("#issue-key");
        let key = browser.wait_text("#issued-key", "a new key", |t| !t.is_empty());
        browser.click("#sign-out");
        browser.find("#sign-in");
        wait_until("the page loaded anew", || {
            browser.eval("return document.querySelector('#tabs').hidden") == json!(true)
        });
        let left = browser.eval(
            "return { stored: sessionStorage.length, field: document.querySelector('#token').value, \
             text: document.body.innerText, rows: document.querySelectorAll('tbody tr').length }",
        );
        assert_eq!(left["stored"], 0, "{name}: {left}");
        assert_eq!(left["field"], "", "{name}");
        assert!(
            !left["text"].as_str().unwrap().contains(&key),
            "{name}: the key is still shown"
        );
        assert_eq!(left["rows"], 0, "{name}: {left}");
        // "Sign in" with nothing typed: still signed out.
        browser.click("#sign-in-form button");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            browser.eval("return document.querySelector('#tabs').hidden"),
            json!(true),
            "{name}"
        );
        // The key issued in the browser is revoked for the next round's gateway state.
        let client = admin(&gw, "GET", "/clients/ada", None).json();
        for k in client["keys"].as_array().into_iter().flatten() {
            let id = k["id"].as_str().unwrap();
            admin(&gw, "DELETE", &format!("/clients/ada/keys/{id}"), None);
        }
    });
}

/// A phone's 390 px: a keyed limit's 429 looked up (its key a 64-digit hash) and a client
/// whose metadata holds a 190-character URL stay within the screen (nothing scrolls
/// sideways but inside its own box), and a label never squeezes its value to a character a
/// line.
#[test]
fn at_a_phones_width_long_keys_and_values_stay_within_the_screen() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let url = format!("https://partner.example/callbacks/{}", "x".repeat(155));
    let put = admin(
        &gw,
        "PUT",
        "/clients/ada",
        Some(json!({"plan": "small", "metadata": {"callback": url}})),
    );
    assert!(put.status < 300, "{}", put.text());
    assert_ne!(gw.get_with("/tenants", &[("X-Tenant", "acme")]).status, 429);
    let refused = gw.get_with("/tenants", &[("X-Tenant", "acme")]);
    assert_eq!(refused.status, 429);
    let id = refused.header("x-request-id").unwrap().to_owned();
    let overflow = |browser: &Browser| {
        browser
            .eval("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            .as_f64()
            .unwrap()
    };
    in_both(390, 844, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        browser.click("#tabs [data-page=lookup]");
        browser.type_into("#request-id", &id);
        browser.click("#lookup-form button");
        browser.wait_text("#lookup-result", "the keyed refusal", |t| t.contains("k:"));
        assert!(
            overflow(browser) <= 0.0,
            "{name}: the lookup scrolls sideways"
        );
        let narrowest = browser.eval(
            "return Math.min(...[...document.querySelectorAll('#refusal dd, #refusal dt')].map((e) => e.getBoundingClientRect().width))",
        );
        assert!(narrowest.as_f64().unwrap() > 200.0, "{name}: {narrowest}");
        browser.click("#tabs [data-page=clients]");
        browser.click("#client-list .client-link");
        browser.wait_text("#client-detail", "ada's page", |t| t.contains("callback"));
        assert!(
            overflow(browser) <= 0.0,
            "{name}: the client's page scrolls sideways"
        );
    });
}

/// With the store down, the fleet panel says the fleet is unknown, never "nobody".
#[test]
fn during_a_store_outage_the_fleet_panel_says_so() {
    let up = Upstream::start("orders");
    let nobody = free_port();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{nobody}\"\nstartup_grace = \"0s\"\n"
    );
    let gw = Gateway::start_full(
        "key_hash_secret = \"shift-key-hash-secret-0123456789abcdef\"",
        &format!("tokens = {{ ops = \"{TOKEN}\" }}"),
        &config(&up, &store),
    );
    assert_eq!(admin(&gw, "GET", "/fleet", None).status, 503);
    in_both(1280, 800, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        let fleet = browser.wait_text("#fleet-list tbody", "the fleet panel", |t| !t.is_empty());
        assert!(fleet.contains("did not answer"), "{name}: {fleet}");
        assert!(!fleet.contains("nobody"), "{name}: {fleet}");
    });
}

/// A page on another origin that, as soon as it loads, posts a form (as text/plain, the
/// encoding that lets a form send anything) and a `fetch` to `POST /reload` of the admin
/// listener on `admin_port`.
fn hostile_page(admin_port: u16) -> u16 {
    common::page::serve(format!(
        "<!doctype html><html><body>\
         <form id=f method=POST enctype=text/plain action=\"http://127.0.0.1:{admin_port}/reload\">\
         <input name='{{\"a\":\"' value='\"}}'></form>\
         <script>fetch('http://127.0.0.1:{admin_port}/reload', {{method: 'POST', mode: 'no-cors', body: 'x'}})\
         .finally(() => document.getElementById('f').submit());</script></body></html>"
    ))
}

/// No admin token configured: a page on another origin cannot reload the gateway — neither
/// its form nor its `fetch` — though an edit is staged in the file.
#[test]
fn a_cross_site_form_cannot_reload_a_gateway_without_an_admin_token() {
    let up = Upstream::start("orders");
    let gw = Gateway::start_with("watch_config = false", &config(&up, ""));
    let page = hostile_page(gw.admin_port);
    gw.rewrite(&config(&up, "").replace("limit = 3,", "limit = 4,"));
    in_both(1280, 800, |name, browser| {
        browser.open(&format!("http://127.0.0.1:{page}/"));
        // The form's answer replaces the page: the admin listener's refusal.
        let shown = browser.wait_text("body", "the form's answer", |t| t.contains("refused"));
        assert!(shown.contains("another"), "{name}: {shown}");
        assert_eq!(
            gw.config_version(),
            1,
            "{name}: the page reloaded the gateway"
        );
    });
    // The operator's own reload (JSON) still works.
    assert_eq!(gw.reload().status, 200);
    assert_eq!(gw.config_version(), 2);
    // A form's encodings, without any Origin (an older browser, a proxy that drops it).
    let form = [("Content-Type", "text/plain")];
    assert_eq!(
        http::request(gw.admin_port, "POST", "/reload", &form, b"x").status,
        415
    );
}

/// Wrong tokens are slowed per address: after ten, 429 with `Retry-After` (the right token
/// too, meanwhile), counted and logged; the console tells the operator why.
#[test]
fn wrong_admin_tokens_are_throttled_and_the_console_says_so() {
    let up = Upstream::start("orders");
    in_both(1280, 800, |name, browser| {
        let dir = tempfile::tempdir().unwrap();
        let gw = start(&up, &dir, "", "");
        // The page open and the token typed first: the throttle lets one attempt through
        // every 6 s, which a busy machine's page load could outlast.
        browser.open(&format!("http://127.0.0.1:{}/ui/", gw.admin_port));
        browser.type_into("#token", TOKEN);
        let wrong = [("Authorization", "Bearer not-the-token-0000000000")];
        let statuses: Vec<u16> = (0..11)
            .map(|_| http::request(gw.admin_port, "GET", "/config", &wrong, b"").status)
            .collect();
        assert_eq!(statuses[..10], [401; 10], "{name}");
        assert_eq!(statuses[10], 429, "{name}");
        let throttled = admin(&gw, "GET", "/config", None);
        assert_eq!(
            throttled.status, 429,
            "{name}: the right token too, meanwhile"
        );
        let retry: u64 = throttled.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=6).contains(&retry), "{name}: {retry}");
        browser.click("#sign-in-form button");
        let why = browser.wait_text("#sign-in-error", "why", |t| !t.is_empty());
        assert!(why.contains("too many wrong tokens"), "{name}: {why}");
        // From another address, the metrics show both kinds of refusal.
        let text = http::raw_from(
            Some("127.0.0.2".parse().unwrap()),
            gw.admin_port,
            format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap()
        .text();
        let count = |o: &str| {
            common::metric_value(
                &text,
                "turnstile_admin_auth_failures_total",
                &[("outcome", o)],
            )
        };
        assert_eq!(count("refused"), 10.0, "{name}");
        assert!(count("throttled") >= 2.0, "{name}");
        assert!(
            gw.proc.log_text().contains("wrong or missing token"),
            "{name}"
        );
    });
}

/// Text a client or the store controls that reads as something else: a right-to-left
/// override (`"\u202Eexe.gnp"` reads `png.exe`), a zero-width space, a control character —
/// each shown as its escape.
#[test]
fn look_alike_text_is_shown_escaped() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let metadata =
        json!({"file": "\u{202E}exe.gnp", "note": "zero\u{200B}width", "bell": "ring\u{7}"});
    let put = admin(
        &gw,
        "PUT",
        "/clients/ada",
        Some(json!({"plan": "small", "metadata": metadata})),
    );
    assert!(put.status < 300, "{}", put.text());
    in_both(1280, 800, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        browser.click("#tabs [data-page=clients]");
        browser.click("#client-list .client-link");
        let shown = browser.wait_text("#client-detail", "ada's page", |t| t.contains("exe.gnp"));
        for escaped in ["\\u202E", "\\u200B", "\\u0007"] {
            assert!(
                shown.contains(escaped),
                "{name}: {escaped} not shown in {shown:?}"
            );
        }
        for raw in ['\u{202E}', '\u{200B}', '\u{7}'] {
            assert!(!shown.contains(raw), "{name}: {raw:?} shown raw");
        }
        assert_eq!(
            browser.eval("return document.querySelectorAll('#client-detail .hidden-char').length"),
            json!(3),
            "{name}"
        );
    });
}

/// The small things: a key issued counts in the client list at once; the status line stays
/// on the page it was said on; the chart's scale is text beside it, not stretched with it;
/// metadata is a table of names and values; ids of dots get the rule, not "not found".
#[test]
fn the_small_things_an_operator_notices() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let put = admin(
        &gw,
        "PUT",
        "/clients/bea",
        Some(json!({"plan": "small", "metadata": {"team": "payments", "tier": "2"}})),
    );
    assert!(put.status < 300, "{}", put.text());
    in_both(1280, 800, |name, browser| {
        sign_in(browser, &gw, TOKEN);
        browser.wait_text("#chart-max", "the chart's scale", |t| t.contains("/s"));
        assert_eq!(
            browser.eval("return document.querySelectorAll('#chart text').length"),
            json!(0)
        );
        browser.click("#tabs [data-page=clients]");
        browser.type_into("#client-search", "bea");
        browser.wait_text("#client-list tbody", "bea listed", |t| {
            t.contains("bea") && !t.contains("ada")
        });
        browser.click("#client-list .client-link");
        let meta = browser.wait_text("#metadata", "bea's metadata", |t| t.contains("payments"));
        assert!(
            meta.contains("team") && meta.contains("tier") && meta.contains('2'),
            "{name}: {meta}"
        );
        browser.click("#issue-key");
        browser.wait_text("#issued-key", "a new key", |t| !t.is_empty());
        wait_until("bea's key counted in the list", || {
            browser.eval(
                "const row = [...document.querySelectorAll('#client-list tbody tr')].find((r) => r.cells[0].innerText.trim() === 'bea'); \
                 return row ? row.cells[2].innerText.trim() : ''",
            ) == json!("1")
        });
        // Ids of dots: the rule, said here.
        browser.type_into("#new-id", "..");
        browser.type_into("#new-plan", "small");
        browser.click("#create-form button");
        let said = browser.wait_text("#status", "the id refused", |t| !t.is_empty());
        assert!(said.contains("not only dots"), "{name}: {said}");
        // The status line stays where it was said.
        browser.click("#tabs [data-page=overview]");
        assert_eq!(browser.text("#status"), "", "{name}");
        browser.click("#tabs [data-page=lookup]");
        browser.type_into("#request-id", "..");
        browser.click("#lookup-form button");
        let why = browser.wait_text("#lookup-result", "the answer", |t| !t.is_empty());
        assert!(
            why.contains("no refusal with this request id"),
            "{name}: {why}"
        );
        let keys = admin(&gw, "GET", "/clients/bea", None).json();
        for k in keys["keys"].as_array().into_iter().flatten() {
            admin(
                &gw,
                "DELETE",
                &format!("/clients/bea/keys/{}", k["id"].as_str().unwrap()),
                None,
            );
        }
    });
}

/// The admin listener answers a request too large to parse as the proxy listener does —
/// 414, 431 — instead of closing the connection without a word.
#[test]
fn the_admin_listener_answers_heads_too_large() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let long_path = format!(
        "GET /{} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "a".repeat(100_000)
    );
    let answer = sent_whole_or_not(gw.admin_port, long_path.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 414 "), "{answer}");
    assert!(answer.contains("request target"), "{answer}");
    let big_head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: {}\r\n\r\n",
        "b".repeat(1100 * 1024)
    );
    let answer = sent_whole_or_not(gw.admin_port, big_head.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert_eq!(admin(&gw, "GET", "/healthz", None).status, 200);
}

/// Sends `request` as far as the server reads it (it may answer and close before the end),
/// then what it answered.
fn sent_whole_or_not(port: u16, request: &[u8]) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    for chunk in request.chunks(16 * 1024) {
        if conn.write_all(chunk).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}
