//! Clients managed at runtime: the admin API against two gateways on one real Redis (a key
//! issued at one authenticates at the other, a revoked key stops on both, a plan change
//! applies on both and keeps the counts of unchanged limits), a Redis restarted empty (every
//! copy kept, no revoked key back, writes wait for a restore), a malformed entry skipped,
//! the memory store's clients file rewritten and reloaded, the quota endpoint, exemptions,
//! and writes refused without a named token.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use serde_json::{json, Value};
use std::time::Instant;

const TOKEN: &str = "ops-admin-token-0123456789";

fn plans() -> &'static str {
    r#"
[plans.small]
limits = [{ name = "per-hour", algorithm = "sliding_log", limit = 5, window = "1h" }]

[plans.big]
limits = [
  { name = "per-hour", algorithm = "sliding_log", limit = 5, window = "1h" },
  { name = "per-day", algorithm = "sliding_log", limit = 100, window = "1d" },
]

# For tests that poll with a key until a gateway is up to date: every 200 on the way is
# counted, so a tight limit would run out while the poll waits.
[plans.roomy]
limits = [{ name = "per-hour", algorithm = "fixed_window", limit = 1000000, window = "1h" }]
"#
}

fn config(up: &Upstream, store: &str, extra: &str) -> String {
    format!(
        r#"
[upstreams.api]
servers = ["{addr}"]
{plans}
[registry]
poll = "200ms"
resync = "5s"

[[clients]]
id = "from-file"
plan = "small"
api_keys = ["file-client-key-0123456789"]

[[routes]]
name = "api"
path_prefix = "/echo"
upstream = "api"
auth = "api_key"
{extra}
{store}
"#,
        addr = up.addr(),
        plans = plans(),
    )
}

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n",
        redis.url()
    )
}

/// An admin call with the ops token.
fn admin(gw: &Gateway, method: &str, path: &str, body: Option<Value>) -> http::Response {
    let auth = format!("Bearer {TOKEN}");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut headers = vec![("Authorization", auth.as_str())];
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    http::request(gw.admin_port, method, path, &headers, body.as_bytes())
}

fn with_key(gw: &Gateway, key: &str) -> u16 {
    gw.get_with("/echo/x", &[("X-Api-Key", key)]).status
}

fn start(text: &str) -> Gateway {
    Gateway::start_full("", &format!("tokens = {{ ops = \"{TOKEN}\" }}"), text)
}

#[test]
fn a_key_issued_at_one_gateway_works_at_the_other_and_revoking_it_stops_it_on_both() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let text = config(&up, &redis_store(&redis), "");
    let (a, b) = (start(&text), start(&text));

    let created = admin(
        &a,
        "PUT",
        "/clients/acme",
        Some(json!({"plan": "small", "metadata": {"team": "billing"}})),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    // Idempotent: the same PUT again changes nothing.
    assert_eq!(
        admin(
            &a,
            "PUT",
            "/clients/acme",
            Some(json!({"plan": "small", "metadata": {"team": "billing"}}))
        )
        .status,
        200
    );
    let issued = admin(&a, "POST", "/clients/acme/keys", None);
    assert_eq!(issued.status, 201, "{}", issued.text());
    let key = issued.json()["key"].as_str().unwrap().to_owned();
    let key_id = issued.json()["key_id"].as_str().unwrap().to_owned();
    assert!(key.starts_with("tsk_"), "{key}");
    // At once at A (it read the registry after writing), within the poll bound at B.
    assert_eq!(with_key(&a, &key), 200);
    let started = Instant::now();
    wait_until("the key at gateway B", || with_key(&b, &key) == 200);
    eprintln!(
        "a new key reached the other gateway in {:?}",
        started.elapsed()
    );

    // The key never appears anywhere but in the answer that issued it.
    let listed = admin(&b, "GET", "/clients/acme", None);
    assert_eq!(listed.json()["keys"][0]["id"], key_id.as_str());
    assert_eq!(listed.json()["metadata"]["team"], "billing");
    assert!(!listed.text().contains(&key[4..]));
    let stored: Vec<String> = redis.cmd(&["HVALS", "{turnstile:registry}:clients"]);
    assert!(!stored.concat().contains(&key[4..]), "{stored:?}");
    assert!(!a.proc.log_text().contains(&key[4..]));
    assert!(a
        .proc
        .log_text()
        .contains("actor=ops action=issue_key client=acme"));

    // 3 of small's 5 spent (A, B, and this one); the plan changes to big, whose per-hour
    // limit is the same definition: it keeps counting (2 left), on both gateways.
    assert_eq!(with_key(&a, &key), 200);
    assert_eq!(
        admin(&b, "PUT", "/clients/acme", Some(json!({"plan": "big"}))).status,
        200
    );
    wait_until("the new plan at A", || {
        admin(&a, "GET", "/clients/acme", None).json()["plan"] == "big"
    });
    let resp = a.get_with("/echo/x", &[("X-Api-Key", &key)]);
    assert_eq!(resp.status, 200);
    assert!(resp
        .header("ratelimit-policy")
        .is_some_and(|p| p.contains("per-day")));
    assert_eq!(with_key(&b, &key), 200);
    assert_eq!(
        with_key(&a, &key),
        429,
        "5 of the same per-hour limit spent"
    );

    // Revoked at B: refused on both.
    assert_eq!(
        admin(&b, "DELETE", &format!("/clients/acme/keys/{key_id}"), None).status,
        204
    );
    assert_eq!(with_key(&b, &key), 401);
    let started = Instant::now();
    wait_until("the revocation at A", || with_key(&a, &key) == 401);
    eprintln!(
        "a revocation reached the other gateway in {:?}",
        started.elapsed()
    );

    // The file's clients are not the API's; unknown plans are refused; deleting works.
    assert_eq!(
        admin(
            &a,
            "PUT",
            "/clients/from-file",
            Some(json!({"plan": "big"}))
        )
        .status,
        409
    );
    assert_eq!(
        admin(&a, "PUT", "/clients/x", Some(json!({"plan": "nope"}))).status,
        422
    );
    assert_eq!(
        admin(&a, "PUT", "/clients/bad%20id", Some(json!({"plan": "big"}))).status,
        422
    );
    assert_eq!(admin(&a, "DELETE", "/clients/acme", None).status, 204);
    assert_eq!(admin(&a, "GET", "/clients/acme", None).status, 404);
    let problem = admin(&a, "DELETE", "/clients/acme", None);
    assert_eq!(problem.status, 404);
    assert_eq!(
        problem.header("content-type"),
        Some("application/problem+json")
    );
}

#[test]
fn redis_restarted_empty_keeps_every_copy_and_brings_no_revoked_key_back() {
    let up = Upstream::start("api");
    let mut redis = RedisServer::start();
    let text = config(&up, &redis_store(&redis), "");
    let (a, b) = (start(&text), start(&text));
    // Roomy: if B's poll lands between the second key's issue and its revocation, every
    // round of the wait below is two admitted requests until B's next poll.
    assert_eq!(
        admin(&a, "PUT", "/clients/acme", Some(json!({"plan": "roomy"}))).status,
        201
    );
    let keep = admin(&a, "POST", "/clients/acme/keys", None).json()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let gone = admin(&a, "POST", "/clients/acme/keys", None).json();
    let (gone_key, gone_id) = (
        gone["key"].as_str().unwrap(),
        gone["key_id"].as_str().unwrap(),
    );
    assert_eq!(
        admin(&a, "DELETE", &format!("/clients/acme/keys/{gone_id}"), None).status,
        204
    );
    // B up to date: both keys seen, and the revocation too.
    wait_until("B up to date", || {
        with_key(&b, &keep) == 200 && with_key(&b, gone_key) == 401
    });

    redis.restart();
    wait_until("both gateways notice the registry is gone", || {
        [&a, &b]
            .iter()
            .all(|g| admin(g, "GET", "/readyz", None).json()["registry"]["lost"] == true)
    });
    for gw in [&a, &b] {
        assert_eq!(with_key(gw, &keep), 200, "the copy keeps serving");
        assert_eq!(with_key(gw, gone_key), 401, "no revoked key comes back");
    }
    let refused = admin(&b, "PUT", "/clients/other", Some(json!({"plan": "big"})));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("registry-lost"));

    // An operator restores it from A's copy; B follows; writes work again.
    let restored = admin(&a, "POST", "/registry/restore", None);
    assert_eq!(restored.status, 200, "{}", restored.text());
    wait_until("B sees the restored registry", || {
        admin(&b, "GET", "/readyz", None).json()["registry"]["lost"] == false
    });
    assert_eq!(
        admin(&b, "PUT", "/clients/other", Some(json!({"plan": "big"}))).status,
        201
    );
    assert_eq!(with_key(&b, &keep), 200);
    assert_eq!(with_key(&a, gone_key), 401);
    // A second restore finds the registry there and overwrites nothing.
    assert_eq!(admin(&a, "POST", "/registry/restore", None).status, 422);
}

#[test]
fn a_malformed_registry_entry_is_skipped_and_reported() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let gw = start(&config(&up, &redis_store(&redis), ""));
    assert_eq!(
        admin(&gw, "PUT", "/clients/good", Some(json!({"plan": "small"}))).status,
        201
    );
    let key = admin(&gw, "POST", "/clients/good/keys", None).json()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    // Someone writes garbage into Redis by hand, and an entry naming a plan that is gone.
    let _: i64 = redis.cmd(&[
        "HSET",
        "{turnstile:registry}:clients",
        "broken",
        "{not json",
    ]);
    let _: i64 = redis.cmd(&[
        "HSET",
        "{turnstile:registry}:clients",
        "orphan",
        r#"{"plan":"gone"}"#,
    ]);
    let _: i64 = redis.cmd(&["INCR", "{turnstile:registry}:version"]);
    wait_until("the bad entries reported", || {
        let r = admin(&gw, "GET", "/readyz", None).json();
        r["registry"]["skipped"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
            && r["registry"]["unserved"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
    });
    assert_eq!(with_key(&gw, &key), 200);
    assert!(gw.proc.log_text().contains("entry \"broken\" skipped"));
}

#[test]
fn with_the_memory_store_the_clients_file_is_rewritten_and_reloaded() {
    let up = Upstream::start("api");
    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients.toml");
    std::fs::write(&clients, "").unwrap();
    let text = config(&up, "", "");
    let gw = Gateway::start_full(
        &format!("clients_file = \"{}\"", clients.display()),
        &format!("tokens = {{ ops = \"{TOKEN}\" }}"),
        &text,
    );
    assert_eq!(
        admin(&gw, "PUT", "/clients/acme", Some(json!({"plan": "small"}))).status,
        201
    );
    let issued = admin(&gw, "POST", "/clients/acme/keys", None).json();
    let key = issued["key"].as_str().unwrap();
    assert_eq!(with_key(&gw, key), 200, "reloaded before the answer");
    let written = std::fs::read_to_string(&clients).unwrap();
    assert!(
        written.contains("id = \"acme\"") && written.contains("sha256:"),
        "{written}"
    );
    assert!(!written.contains(&key[4..]), "only the digest is written");
    let listed = admin(&gw, "GET", "/clients", None).json();
    let sources: Vec<&str> = listed["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["config", "clients_file"]);
    let key_id = issued["key_id"].as_str().unwrap();
    assert_eq!(
        admin(&gw, "DELETE", &format!("/clients/acme/keys/{key_id}"), None).status,
        204
    );
    assert_eq!(with_key(&gw, key), 401);
    assert_eq!(
        admin(
            &gw,
            "PUT",
            "/clients/from-file",
            Some(json!({"plan": "big"}))
        )
        .status,
        409
    );
}

/// Groups through the admin API: a registry client's groups let it into an `allow_groups`
/// route, a change of them takes it out, bad groups are refused; the clients file (memory
/// store) keeps them too.
#[test]
fn clients_get_groups_through_the_admin_api() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let route = "[[routes]]\nname = \"partners\"\npath_prefix = \"/echo/partners\"\nupstream = \"api\"\nauth = \"api_key\"\nallow_groups = [\"partners\"]\n";
    let gw = start(&config(&up, &redis_store(&redis), route));
    let put = |groups: Value| {
        admin(
            &gw,
            "PUT",
            "/clients/acme",
            Some(json!({"plan": "roomy", "groups": groups})),
        )
    };
    assert_eq!(put(json!(["partners", "eu"])).status, 201);
    let key = admin(&gw, "POST", "/clients/acme/keys", None).json()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let partners = |key: &str| {
        gw.get_with("/echo/partners/x", &[("X-Api-Key", key)])
            .status
    };
    assert_eq!(partners(&key), 200);
    assert_eq!(
        admin(&gw, "GET", "/clients/acme", None).json()["groups"],
        json!(["partners", "eu"])
    );
    assert_eq!(partners("file-client-key-0123456789"), 403, "in no group");
    let usage = admin(&gw, "GET", "/clients/acme/usage", None).json();
    assert_eq!(usage["groups"], json!(["partners", "eu"]), "{usage}");
    assert_eq!(put(json!(["eu"])).status, 200);
    assert_eq!(
        partners(&key),
        403,
        "out of the group at once at this gateway"
    );
    for bad in [json!(["a b"]), json!(["x", "x"]), json!([":"])] {
        let refused = put(bad.clone());
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
    assert_eq!(with_key(&gw, &key), 200, "the client is as it was");

    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients.toml");
    std::fs::write(&clients, "").unwrap();
    let gw = Gateway::start_full(
        &format!("clients_file = \"{}\"", clients.display()),
        &format!("tokens = {{ ops = \"{TOKEN}\" }}"),
        &config(&up, "", route),
    );
    let put = admin(
        &gw,
        "PUT",
        "/clients/acme",
        Some(json!({"plan": "small", "groups": ["partners"]})),
    );
    assert_eq!(put.status, 201, "{}", put.text());
    let written = std::fs::read_to_string(&clients).unwrap();
    assert!(written.contains("groups = [\"partners\"]"), "{written}");
}

#[test]
fn writes_need_a_named_token() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let text = config(&up, &redis_store(&redis), "");
    let gw = start(&text);
    let anonymous = http::request(
        gw.admin_port,
        "PUT",
        "/clients/x",
        &[],
        br#"{"plan":"small"}"#,
    );
    assert_eq!(anonymous.status, 401);
    let wrong = http::request(
        gw.admin_port,
        "PUT",
        "/clients/x",
        &[("Authorization", "Bearer not-the-token-at-all")],
        br#"{"plan":"small"}"#,
    );
    assert_eq!(wrong.status, 401);
    // Without any token configured, reads work and writes are refused.
    let open = Gateway::start(&text);
    assert_eq!(
        http::request(open.admin_port, "GET", "/clients", &[], b"").status,
        200
    );
    let write = http::request(
        open.admin_port,
        "PUT",
        "/clients/x",
        &[("Content-Type", "application/json")],
        br#"{"plan":"small"}"#,
    );
    assert_eq!(write.status, 403, "{}", write.text());
}

#[test]
fn the_quota_endpoint_says_what_the_next_requests_will_find() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let text = config(&up, &redis_store(&redis), "");
    let gw = Gateway::start_full(
        "quota_path = \"/_turnstile/quota\"",
        &format!("tokens = {{ ops = \"{TOKEN}\" }}"),
        &text,
    );
    let key = "file-client-key-0123456789";
    assert_eq!(with_key(&gw, key), 200);
    let quota = |gw: &Gateway| {
        let r = gw.get_with("/_turnstile/quota", &[("X-Api-Key", key)]);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["routes"][0]["limits"][0]["remaining"]
            .as_u64()
            .unwrap()
    };
    let left = quota(&gw);
    assert_eq!(left, 4);
    // Asking does not count: still 4.
    assert_eq!(quota(&gw), 4);
    for _ in 0..left {
        assert_eq!(with_key(&gw, key), 200);
    }
    assert_eq!(with_key(&gw, key), 429);
    assert_eq!(quota(&gw), 0);
    // The admin view reads the same state.
    let usage = admin(&gw, "GET", "/clients/from-file/usage", None).json();
    assert_eq!(usage["routes"][0]["limits"][0]["remaining"], 0);
    assert_eq!(gw.get("/_turnstile/quota").status, 401);
}

#[test]
fn exempt_addresses_and_clients_skip_the_limits_they_name() {
    let up = Upstream::start("api");
    let extra = r#"ip_limit = { rate = "1/h", burst = 2 }
exempt = [
  { ips = ["127.0.0.5"] },
  { clients = ["from-file"], limits = ["per-hour"] },
]"#;
    let gw = Gateway::start(
        &config(&up, "", extra).replace("[registry]\npoll = \"200ms\"\nresync = \"5s\"", ""),
    );
    let from = |ip: [u8; 4], key: &str| {
        let req = format!(
            "GET /echo/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: {key}\r\nConnection: close\r\n\r\n"
        );
        http::raw_from(Some(ip.into()), gw.port, req.as_bytes())
            .unwrap()
            .status
    };
    // The client's per-hour limit (5) does not apply to it; the per-IP bucket (2) does.
    let key = "file-client-key-0123456789";
    let normal: Vec<u16> = (0..4).map(|_| from([127, 0, 0, 6], key)).collect();
    assert_eq!(normal, [200, 200, 429, 429]);
    // From the exempt address, nothing applies.
    let exempt: Vec<u16> = (0..8).map(|_| from([127, 0, 0, 5], key)).collect();
    assert!(exempt.iter().all(|s| *s == 200), "{exempt:?}");
    assert!(
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[("policy", "per-hour"), ("outcome", "exempt")]
        ) >= 8.0
    );
    assert!(
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[("policy", "ip"), ("outcome", "exempt")]
        ) >= 8.0
    );
}

/// The OpenAPI validator, installed into a virtual environment under `target/` once.
fn openapi_validator() -> std::path::PathBuf {
    crate::common::python::venv("openapi-validate", &["openapi-spec-validator==0.9.0"])
        .join("openapi-spec-validator")
}

#[test]
fn the_admin_api_description_is_valid_openapi_and_names_every_operation() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/admin-api.yaml");
    let out = std::process::Command::new(openapi_validator())
        .arg(&file)
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    // Every operation the admin listener serves (control/admin.rs, control/clients_api.rs).
    for (method, path) in [
        ("get", "/metrics"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/config"),
        ("post", "/reload"),
        ("get", "/clients"),
        ("get", "/clients/{id}"),
        ("put", "/clients/{id}"),
        ("delete", "/clients/{id}"),
        ("post", "/clients/{id}/keys"),
        ("delete", "/clients/{id}/keys/{key_id}"),
        ("get", "/clients/{id}/usage"),
        ("post", "/registry/restore"),
    ] {
        assert!(
            doc["paths"][path][method].is_mapping(),
            "docs/admin-api.yaml lacks {method} {path}"
        );
    }
}

/// The README's customer lifecycle, run by bash against the demo's configuration (the
/// ports and the clients file moved to this test's own).
#[test]
fn the_readmes_customer_lifecycle_runs_against_the_demo_configuration() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    let admin_var = blocks
        .iter()
        .find(|b| b.starts_with("A="))
        .expect("the README sets A");
    let lifecycle = blocks
        .iter()
        .find(|b| b.contains("/clients/acme/keys"))
        .expect("the README's lifecycle");
    let up = Upstream::start("orders");
    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients.toml");
    std::fs::write(&clients, "").unwrap();
    let demo = std::fs::read_to_string(root.join("conf/demo.toml")).unwrap();
    let tables = demo[demo.find("[registry]").unwrap()..].replace(
        "\"127.0.0.1:9001\", \"127.0.0.1:9002\"",
        &format!("\"{}\"", up.addr()),
    );
    let gw = Gateway::start_full(
        &format!(
            "clients_file = \"{}\"\nquota_path = \"/_turnstile/quota\"",
            clients.display()
        ),
        "tokens = { demo = \"demo-admin-token-0001\" }",
        &tables,
    );
    let script = format!(
        "set -euo pipefail\n{}\n{}",
        admin_var.lines().next().unwrap(),
        lifecycle
    )
    .replace("127.0.0.1:9090", &format!("127.0.0.1:{}", gw.admin_port))
    .replace("127.0.0.1:8080", &format!("127.0.0.1:{}", gw.port));
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run bash");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let codes: Vec<&str> = text
        .lines()
        .filter(|l| l.len() == 3 && l.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    assert_eq!(codes, ["200", "401"], "{text}");
    assert!(text.contains("\"remaining\""), "the quota answer: {text}");
    assert!(
        text.contains("\"plan\": \"partner\""),
        "the plan change: {text}"
    );
}

#[test]
fn on_a_redis_cluster_the_registry_is_one_slot_and_works_the_same() {
    let up = Upstream::start("api");
    let cluster = common::redis::RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"1s\"\n",
        nodes.join(", ")
    );
    let text = config(&up, &store, "");
    let (a, b) = (start(&text), start(&text));
    assert_eq!(
        admin(&a, "PUT", "/clients/acme", Some(json!({"plan": "small"}))).status,
        201
    );
    let key = admin(&a, "POST", "/clients/acme/keys", None).json()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until("the key at B", || with_key(&b, &key) == 200);
    let registry_keys: Vec<(u16, String)> = cluster
        .all_keys()
        .into_iter()
        .filter(|(_, k)| k.contains(":registry}"))
        .collect();
    assert_eq!(registry_keys.len(), 2, "{registry_keys:?}");
    assert_eq!(registry_keys[0].0, registry_keys[1].0, "one node, one slot");
}

#[test]
fn an_edit_that_did_not_move_the_version_is_healed_by_the_resync() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let text = config(&up, &redis_store(&redis), "").replace("resync = \"5s\"", "resync = \"1s\"");
    let gw = start(&text);
    assert_eq!(
        admin(&gw, "PUT", "/clients/acme", Some(json!({"plan": "small"}))).status,
        201
    );
    // An entry written behind the gateways' backs (a restore by hand, a script), the version
    // left alone: polling sees no change; the whole read every `resync` does.
    let key = "hand-written-key-0123456789";
    let digest = {
        use std::fmt::Write;
        let mut hex = String::new();
        for b in <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()) {
            write!(hex, "{b:02x}").unwrap();
        }
        hex
    };
    let entry = format!(r#"{{"plan":"small","keys":[{{"sha256":"{digest}","created":1}}]}}"#);
    let _: i64 = redis.cmd(&["HSET", "{turnstile:registry}:clients", "by-hand", &entry]);
    wait_until("the resync", || with_key(&gw, key) == 200);
}
