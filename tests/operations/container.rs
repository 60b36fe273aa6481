//! The container, without a Docker engine: the Dockerfile and docker-compose.yml checked
//! against the binary's real flags and configuration, and the image's command run as a
//! process with the image's environment and baked-in config.

use crate::common;

use common::{free_port, http, turnstile, wait_until, Proc};
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Dockerfile's instructions → arguments, in order (continuation lines joined).
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((l, ""));
            (op.to_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

/// The runtime stage of the Dockerfile.
fn runtime_stage() -> Vec<(String, String)> {
    let lines = instructions();
    let last_from = lines.iter().rposition(|(op, _)| op == "FROM").unwrap();
    lines[last_from..].to_vec()
}

fn exec_form(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("not exec form {args:?}: {e}"))
}

/// `--flag`s of `turnstile --help`.
fn help_flags() -> String {
    let (code, out, err) = turnstile(&["--help"]);
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn the_image_runs_as_a_non_root_user_with_its_own_config_and_a_health_check() {
    let stage = runtime_stage();
    let get = |op: &str| -> Vec<&String> {
        stage
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a)
            .collect()
    };
    // Non-root.
    let user = get("USER");
    let user = user.last().expect("a USER instruction");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "runs as {user}");
    // The environment the command sees.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in get("ENV") {
        for pair in e.split_whitespace() {
            let (k, v) = pair.split_once('=').expect("ENV k=v");
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    let config_path = env
        .get("TURNSTILE_CONFIG")
        .expect("TURNSTILE_CONFIG set in the image");
    // The config at that path comes from the repository, and passes check with the image's
    // environment applied.
    let copied = get("COPY")
        .into_iter()
        .find_map(|c| {
            let parts: Vec<&str> = c.split_whitespace().collect();
            (parts.last() == Some(&config_path.as_str())).then(|| parts[parts.len() - 2].to_owned())
        })
        .expect("the config file is copied into the image");
    let source = root().join(&copied);
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["check", source.to_str().unwrap()])
        .envs(&env)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config = turnstile::config::Config::load(&source)
        .unwrap()
        .overridden(|name| env.get(name).cloned())
        .unwrap();
    // The admin listener is reachable from outside the container, on the exposed port the
    // health check probes.
    assert!(
        config.admin.listen.ip().is_unspecified(),
        "{}",
        config.admin.listen
    );
    let exposed: Vec<u16> = get("EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    assert!(exposed.contains(&config.admin.listen.port()), "{exposed:?}");
    assert!(
        exposed.contains(&config.server.listen.port()),
        "{exposed:?}"
    );
    let health = get("HEALTHCHECK");
    let health = health.last().expect("a HEALTHCHECK");
    let url = format!("http://127.0.0.1:{}/healthz", config.admin.listen.port());
    assert!(health.contains(&url), "{health}");
    // The command: flags the binary has.
    let cmd = exec_form(get("CMD").last().expect("a CMD"));
    assert_eq!(cmd[0], "turnstile");
    let help = help_flags();
    for flag in cmd.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(flag.as_str()),
            "{flag} is not a flag of turnstile"
        );
    }
    assert!(help.contains("TURNSTILE_CONFIG"), "{help}");
    // The build copies everything the binaries are built from.
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    for dir in ["src", "lua", "benches"] {
        assert!(text.contains(&format!("COPY {dir} {dir}")), "COPY {dir}");
    }
}

#[test]
fn the_image_command_runs_with_the_image_config_and_environment() {
    // As in the image, with the addresses moved to free loopback ports (the same variables
    // an operator would set).
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let mut proc = Proc::spawn(
        "turnstile (image command)",
        Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .current_dir(dir.path())
            .env("TURNSTILE_CONFIG", root().join("conf/container.toml"))
            .env("TURNSTILE_LISTEN", format!("127.0.0.1:{port}"))
            .env("TURNSTILE_ADMIN_LISTEN", format!("127.0.0.1:{admin}")),
        dir.path().join("turnstile.log"),
    );
    wait_until("the image's command to listen", || {
        proc.assert_running();
        common::port_open(port) && common::port_open(admin)
    });
    assert_eq!(http::get(admin, "/healthz").status, 200);
    let config = http::get(admin, "/config").json();
    assert_eq!(
        config["config"]["admin"]["listen"],
        format!("127.0.0.1:{admin}")
    );
    // Nothing listens on 127.0.0.1:8000 here: the gateway answers for the absent app.
    let resp = http::get(port, "/anything");
    assert_eq!(resp.status, 502, "{}", resp.text());
    // A bad override is refused, naming the variable.
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .current_dir(dir.path())
        .env("TURNSTILE_CONFIG", root().join("conf/container.toml"))
        .env("TURNSTILE_ADMIN_LISTEN", "everywhere")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("TURNSTILE_ADMIN_LISTEN"), "{said}");
}

#[test]
fn compose_gateways_use_real_flags_and_probe_the_admin_listener() {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_yaml::from_str(&text).unwrap();
    compose.apply_merge().unwrap();
    let help = help_flags();
    let services = compose["services"].as_mapping().unwrap();
    let mut gateways = 0;
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let command: Vec<String> = service["command"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if command.first().map(String::as_str) != Some("turnstile") {
            continue;
        }
        gateways += 1;
        for flag in command.iter().filter(|a| a.starts_with("--")) {
            assert!(help.contains(flag.as_str()), "{name}: {flag} is not a flag");
        }
        let admin = service["environment"]["TURNSTILE_ADMIN_LISTEN"]
            .as_str()
            .expect("admin listen set");
        let port = admin.rsplit(':').next().unwrap();
        let probe: Vec<&str> = service["healthcheck"]["test"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let url = probe.last().unwrap();
        assert!(
            url == &format!("http://127.0.0.1:{port}/readyz")
                || url == &format!("http://127.0.0.1:{port}/healthz"),
            "{name} probes {url}"
        );
    }
    assert_eq!(gateways, 3);
}
