//! Secrets out of the configuration file: API keys and the admin token from environment
//! variables and files, clients in a file of their own — reloaded when those files change,
//! never shown by `/config`, the logs or the metrics; a missing variable or file is reported
//! with its TOML path.

use crate::common;

use common::{wait_until, Gateway, Upstream};

const FROM_FILE: &str = "key-from-a-file-0123456789";
const ROTATED: &str = "key-rotated-0123456789abcd";
const FROM_ENV: &str = "key-from-the-env-012345678";
const LATER: &str = "key-added-later-0123456789";
const TOKEN: &str = "admin-token-from-a-file-0123";

fn clients(dir: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
[[clients]]
id = "filed"
plan = "basic"
api_keys = [{{ file = "{}" }}]

[[clients]]
id = "envy"
plan = "basic"
api_keys = [{{ env = "TURNSTILE_TEST_CLIENT_KEY" }}]
{extra}"#,
        dir.join("filed.key").display()
    )
}

#[test]
fn keys_and_tokens_come_from_files_and_the_environment_and_follow_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("filed.key"), format!("{FROM_FILE}\n")).unwrap();
    std::fs::write(dir.path().join("token"), TOKEN).unwrap();
    let clients_path = dir.path().join("clients.toml");
    std::fs::write(&clients_path, clients(dir.path(), "")).unwrap();
    let up = Upstream::start("orders");
    let gw = Gateway::start_env(
        &format!("clients_file = \"{}\"", clients_path.display()),
        &format!(
            "token = {{ file = \"{}\" }}",
            dir.path().join("token").display()
        ),
        &format!(
            r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.basic]
limits = [{{ name = "per-minute", algorithm = "sliding_window", limit = 100, window = "1m" }}]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
"#,
            addr = up.addr()
        ),
        &[("TURNSTILE_TEST_CLIENT_KEY", FROM_ENV)],
    );
    let status = |key: &str| gw.get_with("/orders", &[("X-Api-Key", key)]).status;
    assert_eq!(status(FROM_FILE), 200);
    assert_eq!(status(FROM_ENV), 200);
    assert_eq!(status(LATER), 401);
    // The admin token came from its file.
    assert_eq!(gw.admin("/config").status, 401);
    let admin = |path: &str| {
        common::http::get_with(
            gw.admin_port,
            path,
            &[("Authorization", &format!("Bearer {TOKEN}"))],
        )
    };
    let config = admin("/config").text();
    let metrics = admin("/metrics").text();
    for secret in [FROM_FILE, FROM_ENV, TOKEN] {
        assert!(!config.contains(secret), "{secret} in /config");
        assert!(!metrics.contains(secret), "{secret} in /metrics");
        assert!(!gw.proc.log_text().contains(secret), "{secret} in the log");
    }

    // A client added to the clients file: picked up without touching the main file.
    std::fs::write(
        &clients_path,
        clients(
            dir.path(),
            &format!("\n[[clients]]\nid = \"later\"\nplan = \"basic\"\napi_keys = [\"{LATER}\"]\n"),
        ),
    )
    .unwrap();
    wait_until("the added client to be accepted", || status(LATER) == 200);
    // The key file rotated: the old key stops working, the new one works.
    std::fs::write(dir.path().join("filed.key"), ROTATED).unwrap();
    wait_until("the rotated key to be accepted", || status(ROTATED) == 200);
    assert_eq!(status(FROM_FILE), 401);
}

#[test]
fn a_missing_variable_or_file_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    let write = |extra: &str| {
        std::fs::write(
            &path,
            format!(
                "{extra}\n[upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[plans.p]\nlimits = [{{ name = \"m\", algorithm = \"fixed_window\", limit = 1, window = \"1m\" }}]\n[[clients]]\nid = \"c\"\nplan = \"p\"\napi_keys = [{{ env = \"TURNSTILE_TEST_SURELY_UNSET\" }}]\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
            ),
        )
        .unwrap();
        common::turnstile(&["check", path.to_str().unwrap()])
    };
    let (code, _, err) = write("");
    assert_eq!(code, 2);
    assert!(
        err.contains("clients[0].api_keys[0]") && err.contains("TURNSTILE_TEST_SURELY_UNSET"),
        "{err}"
    );
    let (code, _, err) = write("[server]\nclients_file = \"/nonexistent/clients.toml\"");
    assert_eq!(code, 2);
    assert!(
        err.contains("clients_file") && err.contains("/nonexistent/clients.toml"),
        "{err}"
    );
    let (code, _, err) = write("[server]\nclients_file = \"relative.toml\"");
    assert_eq!(code, 2);
    assert!(err.contains("absolute"), "{err}");
}
