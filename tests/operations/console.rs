//! The operator console in real browsers (headless Chromium and Firefox over WebDriver)
//! against a real gateway: signing in with the admin token, the chart moving under traffic, a client created
//! and given a key, that key refused once over its limit, the client found under "limited
//! right now", the 429 looked up by its request id, the key revoked (the next request 401), a
//! wrong token seeing nothing, markup in a client's metadata shown as text. Screenshots of
//! each page go to `target/console-screenshots/`.

use crate::common;

use common::browser::Browser;
use common::{http, Gateway, Upstream};
use serde_json::json;

const TOKEN: &str = "console-admin-token-0123456789";

fn config(up: &Upstream) -> String {
    format!(
        r#"
[registry]

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = 3, window = "1d" }}]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
"#,
        addr = up.addr()
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
    http::request(
        gw.admin_port,
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
}

/// A gateway whose clients live in a clients file in `dir` (so the console can write them),
/// with the admin token `TOKEN` and `server` / `admin` lines added.
fn start(up: &Upstream, dir: &tempfile::TempDir, server: &str, admin: &str) -> Gateway {
    let clients = dir.path().join("clients.toml");
    std::fs::write(&clients, "").unwrap();
    Gateway::start_full(
        &format!("clients_file = \"{}\"\n{server}", clients.display()),
        &format!("tokens = {{ ops = \"{TOKEN}\" }}\n{admin}"),
        &config(up),
    )
}

/// Markup in a client's metadata: the console must show it as text, and run none of it.
const HOSTILE: &str = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>";

/// Client "mallory" (plan small, group red-team) with [`HOSTILE`] metadata.
fn add_mallory(gw: &Gateway) {
    let put = admin(
        gw,
        "PUT",
        "/clients/mallory",
        Some(json!({"plan": "small", "metadata": {"note": HOSTILE}, "groups": ["red-team"]})),
    );
    assert_eq!(put.status, 201, "{}", put.text());
}

#[test]
fn an_operator_follows_a_client_from_its_first_key_to_its_429_in_the_console() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    add_mallory(&gw);

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browser = Browser::start(1280, 800);
    let console = format!("http://127.0.0.1:{}/ui/", gw.admin_port);

    // A wrong token sees nothing.
    browser.open(&console);
    browser.type_into("#token", "not-the-token");
    browser.click("#sign-in-form button");
    browser.wait_text("#sign-in-error", "the wrong token refused", |t| {
        t.contains("refused")
    });
    assert_eq!(
        browser.eval("return document.querySelector('#tabs').hidden"),
        json!(true)
    );
    // Reading the log empties it: the refused token's 401 is the only error so far.
    let refused: Vec<String> = browser.errors();
    assert!(
        refused
            .iter()
            .all(|e| e.contains("/healthz") && e.contains("401")),
        "{refused:?}"
    );

    browser.type_into("#token", TOKEN);
    browser.click("#sign-in-form button");
    browser.find("#tabs");
    // The chart moves under traffic: the request rate read from the metrics goes above 0.
    let key_less: Vec<u16> = (0..20).map(|_| gw.get("/orders").status).collect();
    assert!(key_less.iter().all(|s| *s == 401));
    browser.wait_text("#rate-now", "a request rate above 0", |t| {
        t.parse::<f64>().is_ok_and(|r| r > 0.0)
    });
    let points: String = browser
        .eval("return document.querySelector('#chart polyline[data-class=\"4xx\"]').getAttribute('points')")
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(points.split(' ').count() >= 1, "{points}");
    browser.wait_text("#store-state", "the store's state", |t| {
        t.contains("memory")
    });
    browser.screenshot(&shots.join("overview.png"));

    // Create a client, issue its key.
    browser.click("#tabs [data-page=clients]");
    browser.type_into("#new-id", "acme");
    browser.type_into("#new-plan", "small");
    browser.click("#create-form button");
    browser.wait_text("#detail-id", "the new client's page", |t| t == "acme");
    browser.click("#issue-key");
    let key = browser.wait_text("#issued-key", "the new key, shown once", |t| !t.is_empty());
    let with_key = |k: &str| gw.get_with("/orders", &[("X-Api-Key", k)]);
    let statuses: Vec<u16> = (0..4).map(|_| with_key(&key).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let refused = with_key(&key);
    assert_eq!(refused.status, 429);
    let request_id = refused.header("x-request-id").unwrap().to_owned();
    browser.screenshot(&shots.join("clients.png"));

    // "Limited right now" names it.
    browser.click("#tabs [data-page=limited]");
    browser.wait_text("#limited-minute tbody", "acme among the limited", |t| {
        t.contains("client:acme") && t.contains("per-day")
    });
    // The memory store has no fleet: the view is this instance's, and says so.
    let scope = browser.text("#limited-scope");
    assert!(scope.starts_with("this instance ("), "{scope}");
    browser.screenshot(&shots.join("limited.png"));

    // The 429, looked up by its request id.
    browser.click("#tabs [data-page=lookup]");
    browser.type_into("#request-id", &request_id);
    browser.click("#lookup-form button");
    let why = browser.wait_text("#lookup-result", "the refusal", |t| {
        t.contains("client:acme")
    });
    assert!(
        why.contains("429") && why.contains("per-day") && why.contains("0 of 3 left"),
        "{why}"
    );
    browser.screenshot(&shots.join("lookup.png"));

    // Revoke the key: the next request with it is 401.
    browser.click("#tabs [data-page=clients]");
    browser.type_into("#client-search", "acme");
    browser.wait_text("#client-list tbody", "only acme listed", |t| {
        t.contains("acme") && !t.contains("mallory")
    });
    browser.click("#client-list .client-link");
    browser.wait_text("#detail-id", "acme's page", |t| t == "acme");
    browser.click("#keys .revoke");
    browser.wait_text("#status", "the key revoked", |t| t.contains("revoked"));
    assert_eq!(with_key(&key).status, 401);

    // Markup in metadata is text, and ran nowhere.
    browser.type_into("#client-search", "mallory");
    browser.wait_text("#client-list tbody", "mallory listed", |t| {
        t.contains("mallory")
    });
    browser.click("#client-list .client-link");
    let shown = browser.wait_text("#client-detail", "mallory's page", |t| {
        t.contains("mallory")
    });
    assert!(shown.contains("<script>window.pwned=2</script>"), "{shown}");
    assert!(shown.contains("groups red-team"), "{shown}");
    assert_eq!(
        browser.eval("return window.pwned === undefined"),
        json!(true)
    );
    assert_eq!(
        browser.eval(
            "return document.querySelectorAll('#client-detail img, #client-detail script').length"
        ),
        json!(0)
    );
    let errors = browser.errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

#[test]
fn the_console_is_served_with_a_strict_policy_and_nothing_else_without_the_token() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    let page = gw.admin("/ui/");
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(!page.text().contains("<script>"), "no inline script");
    assert_eq!(gw.admin("/ui/console.js").status, 200);
    for path in ["/limited", "/refusals", "/clients", "/config", "/metrics"] {
        assert_eq!(gw.admin(path).status, 401, "{path} without the token");
    }
    assert_eq!(gw.admin("/ui/other").status, 401);
}

/// The console by keyboard alone, on a phone-width screen, in dark mode, signed in with a
/// read-only token: Tab reaches the token field, Enter signs in; every page fits the width
/// (nothing scrolls sideways); the colours follow `prefers-color-scheme: dark`; the overview's
/// reload history shows an operator's reload and what it changed; the Routes
/// page shows each route's match, auth, limits and failure mode and the Pools page each
/// server's health; a change is refused with the API's reason; no script error anywhere.
#[test]
fn the_console_works_by_keyboard_on_a_phone_in_dark_mode_with_a_read_only_token() {
    use common::browser::{ENTER, TAB};
    const READER: &str = "support-reader-token-0123456789";
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    // The reload below is the operator's, not the file watcher's.
    let gw = start(
        &up,
        &dir,
        "watch_config = false",
        &format!("read_tokens = {{ support = \"{READER}\" }}"),
    );
    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browser = Browser::start(390, 844);
    browser.cdp(
        "Emulation.setEmulatedMedia",
        json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
    );
    browser.open(&format!("http://127.0.0.1:{}/ui/", gw.admin_port));
    browser.find("#token");

    // Keyboard only: the first Tab stop is the token field; Enter submits.
    // (The page list, hidden until then, takes no Tab stop: it once did, as `nav`'s display
    // rule overrode `hidden`.)
    browser.press(TAB);
    assert_eq!(
        browser.eval("return document.activeElement.id"),
        json!("token")
    );
    browser.press(READER);
    browser.press(ENTER);
    browser.find("#tabs");
    // The overview lists the configuration's loads: the start, then an applied reload
    // naming what it changed.
    browser.wait_text("#reload-list", "the start in the reload history", |t| {
        t.contains("start") && t.contains("loaded")
    });
    let fleet = browser.wait_text("#fleet-list", "this instance in the fleet", |t| {
        t.contains("(this one)")
    });
    assert!(fleet.contains(env!("CARGO_PKG_VERSION")), "{fleet}");
    gw.rewrite(&config(&up).replace("limit = 3,", "limit = 4,"));
    assert_eq!(admin(&gw, "POST", "/reload", None).status, 200);
    browser.wait_text("#reload-list", "the reload in the history", |t| {
        t.contains("POST /reload by ops") && t.contains("plans.small changed")
    });
    // Tab through the page list to "Routes" and open it with Enter.
    let mut reached = false;
    for _ in 0..12 {
        browser.press(TAB);
        if browser.eval("return document.activeElement.dataset.page || ''") == json!("routes") {
            reached = true;
            break;
        }
    }
    assert!(reached, "Tab reaches the Routes button");
    browser.press(ENTER);
    let routes = browser.wait_text("#route-list", "the routes table", |t| t.contains("orders"));
    assert!(
        routes.contains("/orders") && routes.contains("api_key") && routes.contains("fail_open"),
        "{routes}"
    );
    let plans = browser.text("#plan-list");
    assert!(plans.contains("per-day: 4 / 1d token_bucket"), "{plans}");

    // Dark: the page's background is dark, its text light.
    let luminance = |css: &str| {
        browser.eval(&format!(
            "const c = getComputedStyle(document.body).{css}.match(/\\d+/g).map(Number); return (c[0] + c[1] + c[2]) / 3"
        ))
        .as_f64()
        .unwrap()
    };
    assert!(luminance("backgroundColor") < 60.0 && luminance("color") > 180.0);
    browser.screenshot(&shots.join("routes-phone-dark.png"));

    browser.click("#tabs [data-page=\"pools\"]");
    let servers = browser.wait_text("#server-list", "the servers table", |t| {
        t.contains("healthy")
    });
    assert!(servers.contains(&up.addr()), "{servers}");
    browser.screenshot(&shots.join("pools-phone-dark.png"));

    // Every page fits a phone's width.
    for page in [
        "overview", "limited", "lookup", "routes", "pools", "clients",
    ] {
        browser.click(&format!("#tabs [data-page=\"{page}\"]"));
        browser.find(&format!("#{page}"));
        let overflow = browser.eval(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
        );
        assert!(
            overflow.as_f64().unwrap() <= 0.0,
            "{page} scrolls sideways by {overflow}"
        );
    }

    // Read-only: creating a client is refused, with the API's reason; nothing was made.
    browser.type_into("#new-id", "eve");
    browser.type_into("#new-plan", "small");
    browser.click("#create-form button");
    browser.wait_text("#status", "the refusal", |t| t.contains("may only read"));
    assert!(!admin(&gw, "GET", "/clients", None).text().contains("eve"));
    let errors: Vec<String> = browser
        .errors()
        .into_iter()
        .filter(|e| !e.contains("403"))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

/// The console in Firefox (Debian's ESR, headless, over geckodriver): every page works
/// without a script error or a Content-Security-Policy violation — the overview's chart and
/// fleet, a client's 429 under "limited now" and looked up by its request id, the routes and
/// pools, a client's page whose metadata holds markup (shown as text, run nowhere).
#[test]
fn the_console_works_in_firefox_without_errors() {
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let gw = start(&up, &dir, "", "");
    add_mallory(&gw);
    let issued = admin(&gw, "POST", "/clients/mallory/keys", None).json();
    let key = issued["key"].as_str().expect("a key").to_owned();
    let with_key = || gw.get_with("/orders", &[("X-Api-Key", &key)]);
    let statuses: Vec<u16> = (0..4).map(|_| with_key().status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let refused = with_key();
    let request_id = refused.header("x-request-id").unwrap().to_owned();

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browser = Browser::firefox(1280, 800);
    browser.open(&format!("http://127.0.0.1:{}/ui/", gw.admin_port));
    browser.find("#token");
    browser.watch_violations();
    browser.type_into("#token", TOKEN);
    browser.click("#sign-in-form button");
    browser.find("#tabs");
    let key_less: Vec<u16> = (0..20).map(|_| gw.get("/orders").status).collect();
    assert!(key_less.iter().all(|s| *s == 401));
    browser.wait_text("#rate-now", "a request rate above 0", |t| {
        t.parse::<f64>().is_ok_and(|r| r > 0.0)
    });
    browser.wait_text("#fleet-list", "this instance in the fleet", |t| {
        t.contains("(this one)")
    });
    browser.screenshot(&shots.join("firefox-overview.png"));

    browser.click("#tabs [data-page=limited]");
    browser.wait_text("#limited-minute tbody", "mallory among the limited", |t| {
        t.contains("client:mallory") && t.contains("per-day")
    });
    browser.click("#tabs [data-page=lookup]");
    browser.type_into("#request-id", &request_id);
    browser.click("#lookup-form button");
    let why = browser.wait_text("#lookup-result", "the refusal", |t| {
        t.contains("client:mallory")
    });
    assert!(why.contains("0 of 3 left"), "{why}");
    browser.click("#tabs [data-page=routes]");
    browser.wait_text("#route-list", "the routes table", |t| t.contains("/orders"));
    browser.click("#tabs [data-page=pools]");
    let servers = browser.wait_text("#server-list", "the servers table", |t| {
        t.contains("healthy")
    });
    assert!(servers.contains(&up.addr()), "{servers}");

    browser.click("#tabs [data-page=clients]");
    browser.type_into("#client-search", "mallory");
    browser.wait_text("#client-list tbody", "mallory listed", |t| {
        t.contains("mallory")
    });
    browser.click("#client-list .client-link");
    let shown = browser.wait_text("#client-detail", "mallory's page", |t| {
        t.contains("mallory")
    });
    assert!(shown.contains("<script>window.pwned=2</script>"), "{shown}");
    assert_eq!(
        browser.eval("return window.pwned === undefined"),
        json!(true)
    );
    browser.screenshot(&shots.join("firefox-client.png"));
    let errors = browser.errors();
    assert!(errors.is_empty(), "script errors in Firefox: {errors:?}");
    // Both watches work: a script error and an inline script the policy refuses, now, are
    // both seen (so the empty list above means none).
    browser.eval("setTimeout(() => { throw new Error('probe') }, 0); return 1");
    browser.eval(
        "const s = document.createElement('script'); s.textContent = '1'; document.head.append(s); return 1",
    );
    let mut errors = Vec::new();
    common::wait_until("both probes seen", || {
        errors = browser.errors();
        errors.len() >= 2
    });
    assert!(
        errors.len() == 2 && errors[0].contains("probe") && errors[1].starts_with("CSP script-src"),
        "{errors:?}"
    );
}
