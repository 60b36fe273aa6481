//! Hot reload under traffic: the config file rewritten many times (limits, upstreams, keys)
//! through all three triggers (file change, SIGHUP, POST /reload) while requests flow — zero
//! failed requests, every new limit observed; invalid files rejected whole; unchanged
//! counters kept; restart-only settings reported; /config free of secrets; the access log.

use crate::common;

use common::{http, upstream_of, wait_until, Gateway, Upstream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const STEADY: &str = "steady-key-0123456789abc";

fn probe_key(i: usize) -> String {
    format!("probe-key-{i:04}-abcdefghij")
}

/// `/echo` → pool `main` (the given servers). Client `steady` has a huge limit; client
/// `probe` has `probe_limit` per hour and the key `probe_key(key)`.
/// For tests that reload on purpose and check what that reload did: with the file watcher
/// on, it can apply the change first (the explicit reload then answers "unchanged").
const NO_WATCH: &str = "watch_config = false";

fn config(servers: &[&Upstream], probe_limit: u64, key: usize, extra_route: bool) -> String {
    let list: Vec<String> = servers.iter().map(|u| format!("{:?}", u.addr())).collect();
    let extra = if extra_route {
        "[[routes]]\nname = \"extra\"\npath_prefix = \"/orders\"\nupstream = \"main\"\n"
    } else {
        ""
    };
    format!(
        r#"
[upstreams.main]
servers = [{servers}]

[plans.steady]
limits = [{{ name = "per-day", algorithm = "sliding_window", limit = 1000000, window = "1d" }}]

[plans.probe]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = {probe_limit}, window = "1h" }}]

[[clients]]
id = "steady"
plan = "steady"
api_keys = ["{STEADY}"]

[[clients]]
id = "probe"
plan = "probe"
api_keys = ["{probe}"]

[[routes]]
name = "echo"
path_prefix = "/echo"
upstream = "main"
auth = "api_key"
ip_limit = {{ rate = "1/h", burst = 3 }}
{extra}
"#,
        servers = list.join(", "),
        probe = probe_key(key),
    )
}

/// Like `config` but without the per-IP limit (the traffic test sends thousands of requests).
fn traffic_config(servers: &[&Upstream], probe_limit: u64, key: usize) -> String {
    config(servers, probe_limit, key, false)
        .replace("ip_limit = { rate = \"1/h\", burst = 3 }\n", "")
}

fn probe(gw: &Gateway, key: &str) -> u16 {
    gw.get_with("/echo/probe", &[("X-Api-Key", key)]).status
}

#[test]
fn rewriting_the_config_under_traffic_drops_no_request_and_applies_every_change() {
    let a = Upstream::start("a");
    let b = Upstream::start("b");
    let gw = Gateway::start(&traffic_config(&[&a], 2, 0));
    let port = gw.port;

    // Continuous traffic from four threads until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let traffic: Vec<_> = (0..4)
        .map(|_| {
            let (stop, sent, failures) = (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&failures));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let req = format!("GET /echo/steady HTTP/1.1\r\nHost: x\r\nX-Api-Key: {STEADY}\r\nConnection: close\r\n\r\n");
                    match http::raw(port, req.as_bytes()) {
                        Ok(resp) if resp.status == 200 => {}
                        Ok(resp) => failures.lock().unwrap().push(format!("{}: {}", resp.status, resp.text())),
                        Err(e) => failures.lock().unwrap().push(format!("io: {e}")),
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    let pools: [&[&Upstream]; 3] = [&[&a], &[&b], &[&a, &b]];
    for i in 1..=15usize {
        let servers = pools[i % 3];
        let limit = 2 + (i as u64 % 5) + i as u64; // differs every time
        gw.rewrite(&traffic_config(servers, limit, i));
        match i % 3 {
            0 => {} // the file watcher picks it up
            1 => gw.proc.signal("HUP"),
            _ => {
                let resp = gw.reload();
                assert_eq!(resp.status, 200, "{}", resp.text());
            }
        }
        wait_until(&format!("version {}", i + 1), || {
            gw.config_version() == i as u64 + 1
        });

        // The new key works and the old one is gone...
        assert_eq!(
            probe(&gw, &probe_key(i - 1)),
            401,
            "iteration {i}: the old key still works"
        );
        // ...and the new limit is exactly in effect (a changed limit starts fresh).
        let statuses: Vec<u16> = (0..limit + 2).map(|_| probe(&gw, &probe_key(i))).collect();
        let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
        assert_eq!(admitted, limit, "iteration {i}: {statuses:?}");
        // The upstream pool changed too: only its servers answer, and (round robin shared
        // with the traffic threads) each of them eventually.
        let expected: std::collections::HashSet<String> =
            servers.iter().map(|u| u.name.clone()).collect();
        let mut seen = std::collections::HashSet::new();
        wait_until(
            &format!("iteration {i}: every server of the new pool"),
            || {
                let name = upstream_of(&gw.get_with("/echo/x", &[("X-Api-Key", STEADY)]));
                assert!(
                    expected.contains(&name),
                    "iteration {i}: {name} is not in the new pool"
                );
                seen.insert(name);
                seen == expected
            },
        );
    }
    stop.store(true, Ordering::SeqCst);
    for t in traffic {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed requests, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        sent.load(Ordering::SeqCst) > 100,
        "the traffic really flowed"
    );
    assert_eq!(
        gw.metric("turnstile_config_reloads_total", &[("result", "ok")]),
        15.0
    );
    assert_eq!(gw.metric("turnstile_config_version", &[]), 16.0);
    let log = gw.proc.log_text();
    for trigger in ["(file changed)", "(SIGHUP)", "(POST /reload)"] {
        assert!(
            log.contains(&format!("reloaded {trigger}")),
            "no reload by {trigger}"
        );
    }
}

#[test]
fn an_invalid_file_is_rejected_whole_and_the_next_valid_one_is_picked_up() {
    let a = Upstream::start("a");
    let gw = Gateway::start(&config(&[&a], 5, 0, false));
    let good = config(&[&a], 5, 0, false);
    let broken = [
        ("syntax", good.replace("[plans.probe]", "[plans.probe"), "."),
        (
            "unknown field",
            good.replace("auth = \"api_key\"", "auth = \"api_key\"\ncolour = \"red\""),
            "routes[0].colour",
        ),
        (
            "dangling upstream",
            good.replace("upstream = \"main\"", "upstream = \"missing\""),
            "routes[0].upstream",
        ),
    ];
    for (n, (what, text, path)) in broken.iter().enumerate() {
        gw.rewrite(text);
        let resp = gw.reload();
        assert_eq!(resp.status, 422, "{what}: {}", resp.text());
        let body = resp.json();
        assert_eq!(body["result"], "rejected");
        let problems = body["problems"].to_string();
        assert!(problems.contains(path), "{what}: {problems}");
        // The file watcher also sees the bad file (and rejects it); the old config serves on.
        wait_until("the failures to be counted", || {
            gw.metric("turnstile_config_reloads_total", &[("result", "error")]) >= (n + 1) as f64
        });
        assert_eq!(gw.config_version(), 1, "{what}");
        assert_eq!(
            gw.metric("turnstile_config_last_reload_success", &[]),
            0.0,
            "{what}"
        );
        assert_eq!(
            gw.get_with("/echo/x", &[("X-Api-Key", STEADY)]).status,
            200,
            "{what}"
        );
    }
    assert!(
        gw.proc.log_text().contains("rejected"),
        "failures are logged"
    );
    // Fixed: picked up by the watcher.
    gw.rewrite(&config(&[&a], 6, 0, false));
    wait_until("the fixed file to be loaded", || gw.config_version() == 2);
    assert_eq!(gw.metric("turnstile_config_version", &[]), 2.0);
}

#[test]
fn unchanged_limits_keep_their_counts_and_changed_ones_apply() {
    let a = Upstream::start("a");
    let gw = Gateway::start_with(NO_WATCH, &config(&[&a], 5, 0, false));
    let key = probe_key(0);
    // Two requests: 2 of the 5 per-hour units and 2 of the 3 per-IP tokens used.
    assert_eq!([probe(&gw, &key), probe(&gw, &key)], [200, 200]);
    // An unrelated change (a new route): counters of unchanged limits survive.
    gw.rewrite(&config(&[&a], 5, 0, true));
    assert_eq!(gw.reload().json()["result"], "applied");
    assert_eq!(
        probe(&gw, &key),
        200,
        "one per-IP token must be left after the reload"
    );
    assert_eq!(
        probe(&gw, &key),
        429,
        "the per-IP bucket was kept: it is empty now"
    );
    let body = gw.get_with("/echo/probe", &[("X-Api-Key", &key)]).json();
    assert_eq!(body["violated-policies"], serde_json::json!(["ip"]));

    // Lift the per-IP limit (a changed definition) and check the plan's count survived too.
    let no_ip = |limit: u64| {
        config(&[&a], limit, 0, true).replace("ip_limit = { rate = \"1/h\", burst = 3 }\n", "")
    };
    gw.rewrite(&no_ip(5));
    assert_eq!(gw.reload().json()["result"], "applied");
    let left: Vec<u16> = (0..4).map(|_| probe(&gw, &key)).collect();
    assert_eq!(
        left,
        [200, 200, 429, 429],
        "3 of 5 were used before the reloads"
    );
    // A changed limit takes effect for the next request (and starts from its own count).
    gw.rewrite(&no_ip(8));
    assert_eq!(gw.reload().json()["result"], "applied");
    let fresh: Vec<u16> = (0..9).map(|_| probe(&gw, &key)).collect();
    assert_eq!(fresh.iter().filter(|s| **s == 200).count(), 8, "{fresh:?}");
}

#[test]
fn restart_only_settings_are_reported_and_config_shows_no_secret() {
    let a = Upstream::start("a");
    let gw = Gateway::start_with(NO_WATCH, &config(&[&a], 5, 0, false));
    let view = gw.admin("/config");
    assert_eq!(view.status, 200);
    let text = view.text();
    assert!(
        !text.contains(STEADY) && !text.contains(&probe_key(0)),
        "a key leaked: {text}"
    );
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(STEADY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(!text.contains(&digest[..16]), "a key digest leaked");
    let json = view.json();
    assert_eq!(json["version"], 1);
    assert_eq!(json["config"]["clients"][0]["api_keys"], "1 redacted");
    assert_eq!(json["hash"].as_str().unwrap().len(), 16);

    // Change the listen address: reported, not applied; everything else is applied.
    let new_port = common::free_port();
    let header = gw.header().replace(
        &format!("listen = \"127.0.0.1:{}\"", gw.port),
        &format!("listen = \"127.0.0.1:{new_port}\""),
    );
    gw.rewrite_raw(&format!("{header}{}", config(&[&a], 7, 1, false)));
    let resp = gw.reload().json();
    assert_eq!(resp["result"], "applied");
    assert_eq!(
        resp["pending_restart"],
        serde_json::json!(["server.listen"])
    );
    assert_eq!(
        gw.admin("/config").json()["pending_restart"],
        serde_json::json!(["server.listen"])
    );
    assert_eq!(
        probe(&gw, &probe_key(1)),
        200,
        "the rest of the file was applied, on the old port"
    );
    assert!(!common::port_open(new_port));
    assert!(gw
        .proc
        .log_text()
        .contains("only take(s) effect after a restart"));
    // Reloading identical content changes nothing.
    assert_eq!(gw.reload().json()["result"], "unchanged");
    assert_eq!(gw.config_version(), 2);
}

#[test]
fn the_access_log_writes_one_json_line_per_request_off_on_or_sampled() {
    let a = Upstream::start("a");
    let gw = Gateway::start_with(NO_WATCH, &config(&[&a], 1, 0, false));
    let log_path = gw.dir().join("access.log");
    let with_log = |mode: &str| {
        format!(
            "[access_log]\nmode = \"{mode}\"\npath = \"{}\"\n{}{}",
            log_path.display(),
            if mode == "sampled" {
                "sample = 0.5\n"
            } else {
                ""
            },
            config(&[&a], 1, 0, false)
        )
    };
    gw.rewrite(&with_log("on"));
    assert_eq!(gw.reload().json()["result"], "applied");
    let key = probe_key(0);
    let statuses = [
        probe(&gw, &key),
        probe(&gw, &key),
        gw.get("/echo/nokey").status,
        gw.get("/nothing").status,
    ];
    assert_eq!(statuses, [200, 429, 401, 404]);
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect()
    };
    wait_until("4 access log lines", || lines().len() == 4);
    let l = lines();
    assert_eq!(l[0]["route"], "echo");
    assert_eq!(l[0]["client_id"], "probe");
    assert_eq!(l[0]["decision"], "allowed");
    assert_eq!(l[0]["status"], 200);
    assert_eq!(l[0]["client_ip"], "127.0.0.1");
    assert!(l[0]["latency_ms"].as_f64().unwrap() > 0.0);
    assert!(l[0]["request_id"].as_str().unwrap().len() == 32);
    assert_eq!(l[0]["upstream"], a.addr());
    assert_eq!(l[1]["decision"], "rejected");
    assert_eq!(l[1]["status"], 429);
    assert_eq!(l[1]["limited_by"], "per-hour");
    assert_eq!(l[0]["limited_by"], serde_json::Value::Null);
    assert_eq!(l[2]["decision"], "unauthorized");
    assert_eq!(l[3]["route"], serde_json::Value::Null);
    let raw = std::fs::read_to_string(&log_path).unwrap();
    assert!(!raw.contains(&key), "the API key must never be logged");

    gw.rewrite(&with_log("sampled"));
    assert_eq!(gw.reload().json()["result"], "applied");
    for _ in 0..10 {
        gw.get("/nothing");
    }
    wait_until("5 sampled lines more", || lines().len() == 4 + 5);

    gw.rewrite(&with_log("off"));
    assert_eq!(gw.reload().json()["result"], "applied");
    for _ in 0..5 {
        gw.get("/nothing");
    }
    // Lines are flushed within the writer's 200 ms idle tick; one request logged after
    // turning the log on again proves nothing was pending from the "off" period.
    gw.rewrite(&with_log("on"));
    assert_eq!(gw.reload().json()["result"], "applied");
    gw.get("/marker");
    wait_until("the marker line", || {
        lines().last().is_some_and(|l| l["path"] == "/marker")
    });
    assert_eq!(lines().len(), 4 + 5 + 1);
}

#[test]
fn with_watching_off_a_change_on_disk_waits_for_an_explicit_reload() {
    let a = Upstream::start("a");
    let gw = Gateway::start_with(NO_WATCH, &config(&[&a], 5, 0, false));
    gw.rewrite(&config(&[&a], 6, 1, false));
    // The watcher polls every 250 ms and applies a change after two polls agree: four times
    // that is ample for it to have acted, had it been on.
    std::thread::sleep(std::time::Duration::from_millis(2_000));
    assert_eq!(gw.config_version(), 1, "the file watcher is off");
    assert_eq!(
        probe(&gw, &probe_key(1)),
        401,
        "the new key is not live yet"
    );
    gw.proc.signal("HUP");
    wait_until("the SIGHUP reload", || gw.config_version() == 2);
    assert_eq!(probe(&gw, &probe_key(1)), 200);
}

/// A Kubernetes ConfigMap (or Secret) volume, as the kubelet lays it out and updates it: the
/// file is a symlink into `..data`, itself a symlink to a timestamped directory, and an update
/// writes a new directory and swaps `..data` in one rename. The watcher follows the swap.
#[test]
fn a_configmap_style_symlink_swap_is_picked_up() {
    use std::os::unix::fs::symlink;
    let up = Upstream::start("a");
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (common::free_port(), common::free_port());
    let text = |limit: u64| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\npid_file = \"{d}/pid\"\nupgrade_sock = \"{d}/sock\"\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n[upstreams.u]\nservers = [\"{}\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\nip_limit = {{ rate = \"{limit}/h\" }}\n",
            up.addr(),
            d = dir.path().display()
        )
    };
    let version = |name: &str, limit: u64| {
        let v = dir.path().join(name);
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("turnstile.toml"), text(limit)).unwrap();
    };
    version("..2026_12_01_00_00_00.1", 1000);
    symlink("..2026_12_01_00_00_00.1", dir.path().join("..data")).unwrap();
    symlink("..data/turnstile.toml", dir.path().join("turnstile.toml")).unwrap();
    let mut gw = common::Proc::spawn(
        "turnstile (configmap)",
        std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .arg("--config")
            .arg(dir.path().join("turnstile.toml")),
        dir.path().join("gw.log"),
    );
    wait_until("the gateway", || {
        gw.assert_running();
        common::port_open(port) && common::port_open(admin)
    });
    let version_of = || http::get(admin, "/config").json()["version"].as_u64();
    assert_eq!(version_of(), Some(1));
    // The kubelet's update: a new directory, `..data` swapped to it in one rename, the old
    // one removed.
    version("..2026_12_01_00_01_00.2", 2000);
    symlink("..2026_12_01_00_01_00.2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    std::fs::remove_dir_all(dir.path().join("..2026_12_01_00_00_00.1")).unwrap();
    wait_until("the swapped file to be applied", || version_of() == Some(2));
    let policy = http::get(port, "/x")
        .header("ratelimit-policy")
        .map(str::to_owned);
    assert_eq!(policy.as_deref(), Some("\"ip\";q=2000;w=3600"));
}

/// `GET /reloads`: the start, an applied reload naming what it changed (a plan's limit, a
/// client's key, a new route — never the key itself), a rejected one with its problem, an
/// unchanged one; newest first.
#[test]
fn the_reload_history_names_what_changed_and_why_a_file_was_rejected() {
    let a = Upstream::start("a");
    let gw = Gateway::start_with(NO_WATCH, &config(&[&a], 5, 0, false));
    gw.rewrite(&config(&[&a], 6, 1, true));
    assert_eq!(gw.reload().json()["result"], "applied");
    gw.rewrite(&config(&[&a], 6, 1, true).replace("[plans.probe]", "[plans.probe"));
    assert_eq!(gw.reload().status, 422);
    gw.rewrite(&config(&[&a], 6, 1, true));
    assert_eq!(gw.reload().json()["result"], "unchanged");

    let history = gw.admin("/reloads");
    assert_eq!(history.status, 200);
    let text = history.text();
    assert!(
        !text.contains(&probe_key(0)) && !text.contains(&probe_key(1)),
        "a key leaked: {text}"
    );
    let reloads = history.json()["reloads"].as_array().unwrap().clone();
    let results: Vec<&str> = reloads
        .iter()
        .map(|r| r["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["unchanged", "rejected", "applied", "loaded"]);
    let applied = &reloads[2];
    assert_eq!(applied["version"], 2);
    assert_eq!(applied["trigger"], "POST /reload");
    assert_eq!(
        applied["changed"],
        serde_json::json!([
            "plans.probe changed",
            "routes.extra added",
            "clients.probe keys changed"
        ])
    );
    let problems = reloads[1]["problems"].to_string();
    assert!(
        !problems.is_empty() && reloads[1]["changed"] == serde_json::json!([]),
        "{problems}"
    );
    assert_eq!(reloads[1]["version"], 2, "the running version stays");
    assert_eq!(reloads[3]["trigger"], "start");
}
