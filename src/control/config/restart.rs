//! Settings a running process cannot change: a reload keeps their running value and reports
//! them as pending a restart. [`RESTART_ONLY`] names them for the documentation's test
//! (`docs/configuration.md`'s reload column); [`keep_restart_only_settings`] applies them.

use super::Config;

/// The TOML paths a reload cannot apply. `tracing` is the whole table; `server.tls` is the
/// listener's presence (its certificates reload).
pub const RESTART_ONLY: &[&str] = &[
    "server.listen",
    "server.threads",
    "server.pid_file",
    "server.upgrade_sock",
    "server.grace_period",
    "server.graceful_shutdown_timeout",
    "server.upstream_keepalive_pool_size",
    "server.work_stealing",
    "server.log_format",
    "server.h2c",
    "server.tls",
    "server.tls.listen",
    "server.tls.h2",
    "admin.listen",
    "tracing",
];

/// Copies the settings a running process cannot change into `new` and returns the TOML
/// paths of those that differed.
pub fn keep_restart_only_settings(new: &mut Config, running: &Config) -> Vec<String> {
    let mut pending = Vec::new();
    macro_rules! keep {
        ($($field:ident).+, $path:expr) => {
            debug_assert!(RESTART_ONLY.contains(&$path), "{} missing from RESTART_ONLY", $path);
            if new.$($field).+ != running.$($field).+ {
                pending.push($path.to_owned());
                new.$($field).+ = running.$($field).+.clone();
            }
        };
    }
    keep!(server.listen, "server.listen");
    keep!(server.threads, "server.threads");
    keep!(server.pid_file, "server.pid_file");
    keep!(server.upgrade_sock, "server.upgrade_sock");
    keep!(server.grace_period, "server.grace_period");
    keep!(
        server.graceful_shutdown_timeout,
        "server.graceful_shutdown_timeout"
    );
    keep!(
        server.upstream_keepalive_pool_size,
        "server.upstream_keepalive_pool_size"
    );
    keep!(server.work_stealing, "server.work_stealing");
    keep!(admin.listen, "admin.listen");
    keep!(server.log_format, "server.log_format");
    keep!(tracing, "tracing");
    keep!(server.h2c, "server.h2c");
    // The TLS listener's address and ALPN are fixed at start; its certificates are not.
    match (&mut new.server.tls, &running.server.tls) {
        (Some(new_tls), Some(old)) => {
            if new_tls.listen != old.listen {
                pending.push(named("server.tls.listen"));
                new_tls.listen = old.listen;
            }
            if new_tls.h2 != old.h2 {
                pending.push(named("server.tls.h2"));
                new_tls.h2 = old.h2;
            }
        }
        (None, None) => {}
        (new_tls, old) => {
            pending.push(named("server.tls"));
            *new_tls = old.clone();
        }
    }
    pending
}

fn named(path: &str) -> String {
    debug_assert!(
        RESTART_ONLY.contains(&path),
        "{path} missing from RESTART_ONLY"
    );
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";

    #[test]
    fn restart_only_settings_keep_their_running_value_and_are_reported() {
        let running = Config::parse(&format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nthreads = 2\n{BASE}"
        ))
        .unwrap();
        let mut new = Config::parse(&format!("[server]\nlisten = \"127.0.0.1:9999\"\nthreads = 2\n[admin]\nlisten = \"127.0.0.1:7777\"\n{BASE}")).unwrap();
        let pending = keep_restart_only_settings(&mut new, &running);
        assert_eq!(pending, ["server.listen", "admin.listen"]);
        assert_eq!(new.server.listen, running.server.listen);
        assert_eq!(new.admin.listen, running.admin.listen);
        let mut same = running.clone();
        assert!(keep_restart_only_settings(&mut same, &running).is_empty());
    }

    /// Two files that differ in every restart-only setting: each is reported, and
    /// [`RESTART_ONLY`] names no setting that is not.
    #[test]
    fn every_restart_only_setting_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_path, cert.cert.pem()).unwrap();
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
        let tls = |listen: &str, h2: bool| {
            format!(
                "[server.tls]\nlisten = \"{listen}\"\nh2 = {h2}\n[[server.tls.certificates]]\ncert = {:?}\nkey = {:?}\n",
                cert_path.display().to_string(),
                key_path.display().to_string()
            )
        };
        let running = Config::parse(&format!("{}{BASE}", tls("127.0.0.1:8443", true))).unwrap();
        let changed = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nthreads = 7\npid_file = \"/tmp/x.pid\"\n\
             upgrade_sock = \"/tmp/x.sock\"\ngrace_period = \"1s\"\ngraceful_shutdown_timeout = \"1s\"\n\
             upstream_keepalive_pool_size = 3\nwork_stealing = false\nlog_format = \"json\"\nh2c = true\n\
             {}[admin]\nlisten = \"127.0.0.1:2\"\n[tracing]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\n{BASE}",
            tls("127.0.0.1:9443", false)
        );
        let mut new = Config::parse(&changed).unwrap();
        let mut pending = keep_restart_only_settings(&mut new, &running);
        // The listener's presence: a file without it.
        let mut without = Config::parse(BASE).unwrap();
        pending.extend(keep_restart_only_settings(&mut without, &running));
        pending.sort();
        let mut all: Vec<String> = RESTART_ONLY.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(pending, all);
    }
}
