//! The gateway reads a request the way the upstream will: a login limit of 5 per
//! `body:username` (and a tenant limit of 5 per `header:x-tenant-id`) holds against upstreams
//! that read the field the way Go, ASP.NET Core, Spring, Flask, Django and WSGI servers are
//! documented to (`tests/upstreams/frameworks.py`, a real process). For each bypass vector,
//! 30 attempts on one account: the upstream sees at most 5 of them, whatever it makes of the
//! spelling. Each test first sends one attack request straight to the upstream, to show that
//! the upstream does read it as the victim's account (the attack would work without the
//! gateway's rule).

use crate::common;

use common::{free_port, http, wait_until, Gateway, Proc};
use std::process::Command;

const LIMIT: usize = 5;
const ATTEMPTS: usize = 30;

const ROUTES: &str = r#"
[[routes]]
name = "login"
path_prefix = "/login"
upstream = "app"
methods = ["POST"]

[[routes.limits]]
name = "per-account"
algorithm = "sliding_window"
limit = 5
window = "15m"
key = ["body:username"]

[[routes]]
name = "tenants"
path_prefix = "/tenant"
upstream = "app"

[[routes.limits]]
name = "per-tenant"
algorithm = "sliding_window"
limit = 5
window = "15m"
key = ["header:x-tenant-id"]
missing = "skip"
"#;

/// `tests/upstreams/frameworks.py` reading requests as one framework does.
struct Framework {
    port: u16,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Framework {
    fn start(reader: &str) -> Framework {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstreams/frameworks.py");
        let mut proc = Proc::spawn(
            &format!("frameworks.py --reader {reader}"),
            Command::new("python3").args([script, "--port", &port.to_string(), "--reader", reader]),
            dir.path().join("frameworks.log"),
        );
        // Answering HTTP, not merely a port that takes a connection (a client can connect
        // to itself on a free loopback port).
        let probe = b"GET /_attempts HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
        wait_until("the framework upstream", || {
            proc.assert_running();
            http::raw(port, probe).is_ok_and(|r| r.status == 200)
        });
        Framework {
            port,
            _proc: proc,
            _dir: dir,
        }
    }

    /// Attempts that reached the account a user typing `name` logs in as.
    fn attempts(&self, name: &str) -> usize {
        let resp = http::get(self.port, &format!("/_attempts?account={}", percent(name)));
        resp.json()["attempts"].as_u64().unwrap() as usize
    }

    /// The account the framework reads `request` as, sent to it directly (not counted
    /// against the gateway: the caller subtracts it).
    fn reads(&self, request: &[u8]) -> Option<String> {
        let resp = http::raw(self.port, request).unwrap();
        resp.json()["account"].as_str().map(str::to_owned)
    }
}

fn gateway(up: &Framework) -> Gateway {
    Gateway::start_with(
        "key_hash_secret = \"readings-test-secret-0123456789\"",
        &format!(
            "[upstreams.app]\nservers = [\"127.0.0.1:{}\"]\n{ROUTES}",
            up.port
        ),
    )
}

/// A POST with `body` and these header lines (each `Name: value`).
fn post(target: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut req = format!("POST {target} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

const JSON: &str = "Content-Type: application/json";
const FORM: &str = "Content-Type: application/x-www-form-urlencoded";

/// Sends `ATTEMPTS` requests made by `attack(i)` through the gateway; returns the statuses
/// and how many the upstream counted on `victim`. Asserts first that the upstream reads the
/// first attack request as `victim`.
fn attack(reader: &str, victim: &str, attack: impl Fn(usize) -> Vec<u8>) -> (Vec<u16>, usize) {
    let up = Framework::start(reader);
    let direct = up.reads(&attack(0));
    assert_eq!(
        direct.as_deref().map(|a| a == up_identity(&up, victim)),
        Some(true),
        "{reader} reads the attack as {direct:?}: the test would prove nothing"
    );
    let before = up.attempts(victim);
    let gw = gateway(&up);
    let statuses: Vec<u16> = (0..ATTEMPTS)
        .map(|i| http::raw(gw.port, &attack(i)).unwrap().status)
        .collect();
    let seen = up.attempts(victim) - before;
    for s in &statuses {
        assert!(matches!(s, 200 | 400 | 429), "{statuses:?}");
    }
    (statuses, seen)
}

/// The account name the framework resolves `name` to (what `/_attempts` reports).
fn up_identity(up: &Framework, name: &str) -> String {
    let resp = http::get(up.port, &format!("/_attempts?account={}", percent(name)));
    resp.json()["account"].as_str().unwrap().to_owned()
}

fn held(reader: &str, statuses: &[u16], seen: usize) {
    assert!(
        seen <= LIMIT,
        "{reader}: the upstream saw {seen} attempts on the victim's account: {statuses:?}"
    );
}

#[test]
fn json_keys_that_go_and_aspnet_match_ignoring_case_are_refused() {
    for (reader, key) in [
        ("go", "USERNAME"),
        ("go", "u\u{17f}ername"),
        ("aspnet", "UserName"),
    ] {
        let (statuses, seen) = attack(reader, "victim", |i| {
            let body = format!(r#"{{"username":"decoy{i}","{key}":"victim"}}"#);
            post("/login", &[JSON], body.as_bytes())
        });
        held(reader, &statuses, seen);
        assert!(statuses.iter().all(|s| *s == 400), "{reader}: {statuses:?}");
    }
}

#[test]
fn a_query_field_that_spring_and_flask_read_before_the_body_is_refused() {
    for reader in ["spring", "flask"] {
        let (statuses, seen) = attack(reader, "victim", |i| {
            let body = format!("username=decoy{i}&password=x");
            post("/login?username=victim", &[FORM], body.as_bytes())
        });
        held(reader, &statuses, seen);
        assert!(statuses.iter().all(|s| *s == 400), "{reader}: {statuses:?}");
    }
}

#[test]
fn unicode_spellings_that_django_folds_into_one_account_are_counted_as_one() {
    let spellings = ["ｖｉｃｔｉｍ", "victim", "ｖictim", "vｉctim"];
    let (statuses, seen) = attack("django", "victim", |i| {
        let body = format!("username={}&password=x", spellings[i % spellings.len()]);
        post("/login", &[FORM], body.as_bytes())
    });
    held("django", &statuses, seen);
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), LIMIT);
    // NFC and NFD spellings of one name.
    let forms = ["jos\u{e9}", "jose\u{301}"];
    let (statuses, seen) = attack("django", "jos\u{e9}", |i| {
        let body = format!("username={}&password=x", forms[i % 2]);
        post("/login", &[FORM], body.as_bytes())
    });
    held("django", &statuses, seen);
}

#[test]
fn names_that_aspnet_identity_upper_cases_alike_are_counted_as_one() {
    // ToUpperInvariant makes the dotless `ı` an `I`: one account for ASP.NET Identity.
    let spellings = ["v\u{131}ctim", "victim", "VICTIM", "V\u{131}ct\u{131}m"];
    let (statuses, seen) = attack("aspnet", "victim", |i| {
        let body = format!(r#"{{"username":"{}"}}"#, spellings[i % spellings.len()]);
        post("/login", &[JSON], body.as_bytes())
    });
    held("aspnet", &statuses, seen);
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), LIMIT);
}

#[test]
fn characters_that_python_and_java_trim_do_not_make_new_accounts() {
    for reader in ["flask", "spring", "django"] {
        let (statuses, seen) = attack(reader, "victim", |i| {
            // A different run of U+001C–U+001F around the name every time.
            let pad: String = (0..=i).map(|j| char::from(0x1c + (j % 4) as u8)).collect();
            let body = format!(
                "username={}&password=x",
                percent(&format!("{pad}victim{pad}"))
            );
            post("/login", &[FORM], body.as_bytes())
        });
        held(reader, &statuses, seen);
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            LIMIT,
            "{reader}"
        );
    }
}

#[test]
fn tenant_headers_that_wsgi_reads_otherwise_are_refused() {
    // A list in one line: the first element is the tenant the application sees.
    let (statuses, seen) = attack("wsgi-tenant", "victim", |i| {
        let header = format!("X-Tenant-Id: victim, r{i}");
        post("/tenant/report", &[&header], b"")
    });
    held("wsgi-tenant", &statuses, seen);
    assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
    // An underscore spelling before the real one: WSGI joins both into one list.
    let (statuses, seen) = attack("wsgi-tenant", "victim", |i| {
        let real = format!("X-Tenant-Id: decoy{i}");
        post("/tenant/report", &["X_Tenant_Id: victim", &real], b"")
    });
    held("wsgi-tenant", &statuses, seen);
    assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
    // And the header alone: 5 a tenant, as configured.
    let (statuses, seen) = attack("wsgi-tenant", "victim", |_| {
        post("/tenant/report", &["X-Tenant-Id: victim"], b"")
    });
    held("wsgi-tenant", &statuses, seen);
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), LIMIT);
}

#[test]
fn a_second_content_type_that_the_upstream_parses_by_is_refused() {
    // gunicorn keeps the last Content-Type: Flask parses the form, the first one says JSON.
    let (statuses, seen) = attack("flask", "victim", |i| {
        let body = format!(r#"{{"username":"decoy{i}","a":"&username=victim&b="}}"#);
        post("/login", &[JSON, FORM], body.as_bytes())
    });
    held("flask", &statuses, seen);
    assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
}

#[test]
fn a_form_body_that_go_decodes_as_json_is_refused() {
    let (statuses, seen) = attack("go", "victim", |i| {
        let body = format!(r#"{{"username":"victim","a":"=&username=decoy{i}"}}"#);
        post("/login", &[FORM], body.as_bytes())
    });
    held("go", &statuses, seen);
    assert!(statuses.iter().all(|s| *s == 400), "{statuses:?}");
}

/// Percent-encodes every byte that is not alphanumeric (a form value).
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
