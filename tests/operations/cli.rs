//! The command line, as an operator types it: `-c`/`--config` names the TOML file (for
//! running and for `check`, which also follows `TURNSTILE_CONFIG`), the default is the
//! image's `/etc/turnstile/turnstile.toml`, a missing file is reported as missing, a typo in a
//! key gets the likely name, the help is ours, the version names the commit, and the exit
//! codes are the documented ones.

use crate::common::{self, free_port, port_open, turnstile, turnstile_env, wait_until, Proc};
use std::process::Command;

fn valid(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("gw.toml");
    let (port, admin) = (free_port(), free_port());
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\npid_file = \"{d}/pid\"\nupgrade_sock = \"{d}/sock\"\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n[upstreams.u]\nservers = [\"127.0.0.1:9\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn check_validates_the_file_the_gateway_would_run_with() {
    let dir = tempfile::tempdir().unwrap();
    let file = valid(dir.path());
    let file = file.to_str().unwrap();
    for args in [
        vec!["check", file],
        vec!["check", "-c", file],
        vec!["-c", file, "check"],
        vec!["--config", file, "check"],
    ] {
        let (code, out, err) = turnstile(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(": ok (1 routes, 1 upstreams)"), "{out}");
    }
    let (code, out, _) = turnstile_env(&["check"], &[("TURNSTILE_CONFIG", file)]);
    assert_eq!(code, 0);
    assert!(out.contains(file), "{out}");
}

#[test]
fn a_missing_file_is_missing_and_the_default_is_the_images_path() {
    let (code, _, err) = turnstile(&["check", "/nonexistent/turnstile.toml"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read config file /nonexistent/turnstile.toml"),
        "{err}"
    );
    assert!(!err.contains("invalid configuration"), "{err}");
    // Nothing named: /etc/turnstile/turnstile.toml (absent on a test machine, or present).
    let (code, out, err) = turnstile(&["check"]);
    let named = format!("{out}{err}");
    assert!(named.contains("/etc/turnstile/turnstile.toml"), "{named}");
    assert!(code == 0 || code == 2, "{code}");
}

#[test]
fn a_typo_in_a_key_names_the_likely_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = valid(dir.path());
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("[admin]", "keepalive_timout = \"5s\"\n\n[admin]");
    std::fs::write(&file, text).unwrap();
    let (code, _, err) = turnstile(&["check", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("server.keepalive_timout: unknown field `keepalive_timout`: did you mean `keepalive_timeout`?"),
        "{err}"
    );
}

#[test]
fn help_and_version_are_turnstiles() {
    let (code, out, _) = turnstile(&["--help"]);
    assert_eq!(code, 0);
    assert!(!out.contains("pingora-based service"), "{out}");
    for expected in [
        "-c, --config <FILE>",
        "/etc/turnstile/turnstile.toml",
        "Exit codes",
        "--pingora-conf",
    ] {
        assert!(out.contains(expected), "{expected}: {out}");
    }
    let (code, out, _) = turnstile(&["--version"]);
    assert_eq!(code, 0);
    let version = format!("turnstile {} (", env!("CARGO_PKG_VERSION"));
    assert!(out.starts_with(&version), "{out}");
    let commit = out
        .trim()
        .trim_start_matches(&version)
        .trim_end_matches(')');
    assert!(!commit.is_empty(), "{out}");
    // A wrong command line is a usage error: exit 2, with the usage.
    let (code, _, err) = turnstile(&["--conf", "x.yaml"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Usage: turnstile"), "{err}");
}

#[test]
fn dash_c_runs_the_toml_file_and_a_bad_pingora_file_is_another_failure() {
    let dir = tempfile::tempdir().unwrap();
    let file = valid(dir.path());
    let text = std::fs::read_to_string(&file).unwrap();
    let admin: u16 = text
        .split("[admin]\nlisten = \"127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let mut gw = Proc::spawn(
        "turnstile -c",
        Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .arg("-c")
            .arg(&file)
            .env_remove("TURNSTILE_CONFIG"),
        dir.path().join("gw.log"),
    );
    wait_until("the gateway run with -c", || {
        gw.assert_running();
        port_open(admin)
    });
    assert_eq!(common::http::get(admin, "/healthz").status, 200);
    gw.kill();
    let yaml = dir.path().join("pingora.yaml");
    std::fs::write(&yaml, "threads: [not, a, number]\n").unwrap();
    let (code, _, err) = turnstile(&[
        "-c",
        file.to_str().unwrap(),
        "--pingora-conf",
        yaml.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot load Pingora configuration"), "{err}");
}
