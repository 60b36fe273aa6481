//! Reaching Redis the way managed and self-run deployments require: TLS (`rediss://`, a CA
//! file, a client certificate when the server asks for one), an ACL user with a password from
//! the environment, and Sentinel (one primary, one replica, three sentinels, all local
//! processes) with a forced failover under traffic — the limiter follows the new primary,
//! and the requests during the switch get the route's failure mode.

use crate::common;

use common::redis::{cli, redis, SentinelSetup};
use common::tls::Ca;
use common::{free_port, wait_until, Gateway, Proc, Upstream};
use std::process::Command;

const KEY: &str = "redis-transport-key-012345";

fn routes(up: &Upstream, store: &str) -> String {
    format!(
        r#"
{store}

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 3, window = "1m" }}]

[plans.big]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 100000, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[clients]]
id = "bulk"
plan = "big"
api_keys = ["bulk-key-0123456789abcdefg"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_closed"
"#,
        addr = up.addr()
    )
}

fn statuses(gw: &Gateway, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| gw.get_with("/orders", &[("X-Api-Key", KEY)]).status)
        .collect()
}

/// A redis-server with its own arguments, in `dir`.
/// A number of `INFO replication` (e.g. `master_repl_offset`) of the server on `port`.
fn replication_offset(port: u16, field: &str) -> Option<u64> {
    let info = cli(&["-p", &port.to_string(), "INFO", "replication"])?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn tls_with_a_ca_file_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "redis", "redis", &["127.0.0.1", "localhost"]);
    let client = ca.issue(dir.path(), "client", "gateway", &["gateway.test"]);
    let port = free_port();
    let mut proc = redis(
        dir.path(),
        "tls",
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            server.cert.to_str().unwrap(),
            "--tls-key-file",
            server.key.to_str().unwrap(),
            "--tls-ca-cert-file",
            ca_file.to_str().unwrap(),
            "--tls-auth-clients",
            "yes",
        ],
    );
    wait_until("the TLS redis-server", || {
        proc.assert_running();
        common::port_open(port)
    });
    let up = Upstream::start("orders");
    let gw = Gateway::start(&routes(
        &up,
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:{port}\"\ntimeout = \"1s\"\ntls_ca_file = \"{}\"\ntls_client_cert = \"{}\"\ntls_client_key = \"{}\"",
            ca_file.display(),
            client.cert.display(),
            client.key.display()
        ),
    ));
    assert_eq!(statuses(&gw, 4), [200, 200, 200, 429]);
    assert_eq!(
        gw.metric("turnstile_store_calls_total", &[("result", "ok")]),
        4.0
    );
    // Without the client certificate the server refuses the handshake: fail closed.
    let refused = Gateway::start(&routes(
        &up,
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:{port}\"\ntimeout = \"1s\"\ntls_ca_file = \"{}\"",
            ca_file.display()
        ),
    ));
    assert_eq!(statuses(&refused, 1), [503]);
}

#[test]
fn an_acl_user_with_a_password_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut proc = redis(
        dir.path(),
        "acl",
        &[
            "--port",
            &port.to_string(),
            "--user",
            "default",
            "off",
            "--user",
            "gateway",
            "on",
            ">acl-pass-0123456789",
            "~*",
            "&*",
            "+@all",
        ],
    );
    wait_until("the ACL redis-server", || {
        proc.assert_running();
        common::port_open(port)
    });
    let up = Upstream::start("orders");
    let store = |var: &str| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\ntimeout = \"1s\"\nusername = \"gateway\"\npassword = {{ env = \"{var}\" }}"
        )
    };
    // The gateway's environment holds the passwords.
    let env = [
        ("TURNSTILE_TEST_REDIS_PASSWORD", "acl-pass-0123456789"),
        ("TURNSTILE_TEST_REDIS_WRONG", "not-the-password"),
    ];
    let start = |text: &str| Gateway::start_env("", "", text, &env);
    let gw = start(&routes(&up, &store("TURNSTILE_TEST_REDIS_PASSWORD")));
    assert_eq!(statuses(&gw, 4), [200, 200, 200, 429]);
    let config = gw.admin("/config").text();
    assert!(!config.contains("acl-pass"), "{config}");
    assert!(!gw.proc.log_text().contains("acl-pass"));
    let wrong = start(&routes(&up, &store("TURNSTILE_TEST_REDIS_WRONG")));
    assert_eq!(statuses(&wrong, 1), [503]);
    assert!(wrong.metric("turnstile_store_calls_total", &[("result", "refused")]) >= 1.0);
    // A variable that is not set: the file is refused, naming the setting.
    let path = dir.path().join("unset.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:1\"\n{}",
            routes(&up, &store("TURNSTILE_TEST_SURELY_UNSET"))
        ),
    )
    .unwrap();
    let (code, _, err) = common::turnstile(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("store.password") && err.contains("TURNSTILE_TEST_SURELY_UNSET"),
        "{err}"
    );
}

/// Three gateways finding the primary through the sentinels, 600 parallel requests (batched
/// where they arrive while another call is in flight): exactly the limit admitted.
#[test]
fn three_gateways_on_a_sentinel_primary_admit_exactly_the_limit() {
    use crate::distributed::{config, hammer, LIMIT};
    let dir = tempfile::tempdir().unwrap();
    let setup = SentinelSetup::start(dir.path());
    let up = Upstream::start("orders");
    let text = config(&up, &setup.store("timeout = \"2s\""));
    let gateways: Vec<Gateway> = (0..3).map(|_| Gateway::start(&text)).collect();
    let (ok, limited) = hammer(&gateways, 600);
    assert_eq!((ok, limited), (LIMIT, 600 - LIMIT));
}

#[test]
fn sentinel_the_limiter_follows_a_failover_under_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let setup = SentinelSetup::start(dir.path());
    let SentinelSetup {
        ref sentinels,
        primary,
        replica,
        ..
    } = setup;
    let up = Upstream::start("orders");
    let gw = Gateway::start(&routes(
        &up,
        &setup.store("timeout = \"500ms\"\nbreaker_cooldown = \"200ms\""),
    ));
    let bulk = || {
        gw.get_with("/orders", &[("X-Api-Key", "bulk-key-0123456789abcdefg")])
            .status
    };
    assert_eq!(statuses(&gw, 2), [200, 200]);
    assert_eq!(bulk(), 200);
    // Forced failover: the replica becomes the primary, the old primary a replica. A sentinel
    // that has listed the replica but not yet read its INFO answers NOGOODSLAVE (and starts
    // nothing): ask again until it accepts.
    wait_until("a sentinel to accept the failover", || {
        cli(&[
            "-p",
            &sentinels[0].to_string(),
            "SENTINEL",
            "failover",
            "main",
        ])
        .is_some_and(|reply| reply == "OK")
    });
    wait_until("the failover to complete", || {
        cli(&["-p", &replica.to_string(), "ROLE"]).is_some_and(|r| r.starts_with("master"))
            && cli(&["-p", &primary.to_string(), "ROLE"]).is_some_and(|r| r.starts_with("slave"))
    });
    // Under traffic: each answer is either a decision (200) or the route's failure mode
    // (503) — until the limiter writes to the new primary.
    wait_until("decisions on the new primary", || {
        let status = bulk();
        assert!(status == 200 || status == 503, "{status}");
        status == 200
            && cli(&["-p", &replica.to_string(), "DBSIZE"])
                .is_some_and(|n| n.parse::<u64>().unwrap_or(0) > 0)
    });
    // Counts continue on the new primary (it had them by replication): ada's third request
    // is admitted, her fourth refused.
    assert_eq!(statuses(&gw, 2), [200, 429]);
    let mut procs = setup.procs;
    for p in &mut procs {
        p.assert_running();
    }
}

/// A primary that stops answering for a moment, not long enough for the sentinels to call it
/// down: the calls meanwhile time out (the route's failure mode), the sentinels are asked
/// where the primary is, name the same node, and the connection is kept — nothing to make
/// again when it answers. (Dropping it on two timeouts in a row refused the requests behind
/// it while a new one was made: `timeouts.rs`, `sentinel.rs`.)
#[test]
fn sentinel_a_primary_late_for_a_moment_keeps_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let setup = SentinelSetup::start(dir.path());
    let up = Upstream::start("orders");
    let gw = Gateway::start(&routes(
        &up,
        &setup.store("timeout = \"50ms\"\nbreaker_failures = 100"),
    ));
    let bulk = || {
        gw.get_with("/orders", &[("X-Api-Key", "bulk-key-0123456789abcdefg")])
            .status
    };
    assert_eq!(bulk(), 200);
    let store = || gw.admin("/readyz").json()["store"].clone();
    assert_eq!(store()["sentinel_questions"]["asked"], 0);
    let primary = &setup.procs[0];
    primary.signal("STOP");
    // Requests one after another while it is stopped (well under the sentinels' 1 s).
    let stopped = std::time::Instant::now();
    let mut late = 0;
    while stopped.elapsed() < std::time::Duration::from_millis(300) {
        match bulk() {
            503 => late += 1,
            200 => {}
            other => panic!("{other}"),
        }
    }
    primary.signal("CONT");
    assert!(
        late >= 2,
        "{late} calls timed out while the primary was stopped"
    );
    wait_until("decisions again", || bulk() == 200);
    wait_until("the question to be answered", || {
        store()["sentinel_questions"]["asked"].as_u64() >= Some(1)
    });
    let store = store();
    assert_eq!(store["sentinel_questions"]["moved"], 0, "{store}");
    assert_eq!(
        store["connection_repairs"], 0,
        "kept, not made again: {store}"
    );
    assert_eq!(store["connection"], "up", "{store}");
}

/// A primary that is frozen but still connected: the sentinels promote the replica, and the
/// gateway — asking them again after its calls time out — decides on the new primary; when
/// the old one thaws (a primary for a moment, until it is demoted and its data replaced),
/// nothing is decided there. Exact: the limit admits exactly its count across all of it.
#[test]
fn sentinel_a_frozen_primary_is_left_for_the_promoted_replica() {
    const LIMIT: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let setup = SentinelSetup::start(dir.path());
    let up = Upstream::start("orders");
    let text = routes(
        &up,
        &setup.store("timeout = \"300ms\"\nbreaker_failures = 3\nbreaker_cooldown = \"300ms\""),
    )
    .replace(
        "name = \"per-minute\", algorithm = \"sliding_log\", limit = 3, window = \"1m\"",
        &format!(
            "name = \"per-hour\", algorithm = \"sliding_log\", limit = {LIMIT}, window = \"1h\""
        ),
    );
    assert!(text.contains("per-hour"));
    let gw = Gateway::start(&text);
    let ada = || gw.get_with("/orders", &[("X-Api-Key", KEY)]).status;
    let mut admitted = (0..5).filter(|_| ada() == 200).count();
    assert_eq!(admitted, 5);
    // The five are on the replica too before the primary stops. (Not `WAIT`: from a
    // connection of its own it waits for that connection's writes, i.e. none.)
    wait_until("the replica to have the primary's writes", || {
        let written = replication_offset(setup.primary, "master_repl_offset");
        written.is_some() && replication_offset(setup.replica, "slave_repl_offset") >= written
    });
    let primary = &setup.procs[0];
    primary.signal("STOP");
    // Until the sentinels promote the replica, requests get the failure mode; then decisions.
    wait_until("decisions on the promoted replica", || {
        let status = ada();
        assert!(status == 200 || status == 503, "{status}");
        if status == 200 {
            admitted += 1;
        }
        status == 200
            && cli(&["-p", &setup.replica.to_string(), "ROLE"])
                .is_some_and(|r| r.starts_with("master"))
    });
    // The old primary thaws while requests keep coming: none is decided there.
    primary.signal("CONT");
    for _ in 0..(LIMIT + 10) {
        match ada() {
            200 => admitted += 1,
            429 | 503 => {}
            other => panic!("{other}"),
        }
    }
    assert_eq!(
        admitted, LIMIT,
        "admitted across the freeze, the failover and the thaw"
    );
    assert_eq!(ada(), 429);
}

#[test]
fn a_redis_cluster_over_tls_with_an_acl_user_is_reached_node_by_node() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "redis", "redis", &["127.0.0.1", "localhost"]);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut procs: Vec<Proc> = ports
        .iter()
        .map(|port| {
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            redis(
                &node_dir,
                &format!("cluster-tls-{port}"),
                &[
                    "--port",
                    "0",
                    "--tls-port",
                    &port.to_string(),
                    "--tls-cert-file",
                    server.cert.to_str().unwrap(),
                    "--tls-key-file",
                    server.key.to_str().unwrap(),
                    "--tls-ca-cert-file",
                    ca_file.to_str().unwrap(),
                    "--tls-auth-clients",
                    "no",
                    "--tls-cluster",
                    "yes",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--user",
                    "gateway",
                    "on",
                    ">cluster-pass-0123456789",
                    "~*",
                    "&*",
                    "+@all",
                    "--masteruser",
                    "gateway",
                    "--masterauth",
                    "cluster-pass-0123456789",
                ],
            )
        })
        .collect();
    for (proc, port) in procs.iter_mut().zip(&ports) {
        wait_until("a TLS cluster node", || {
            proc.assert_running();
            common::port_open(*port)
        });
    }
    let tls = ["--tls", "--cacert", ca_file.to_str().unwrap()];
    let auth = ["--user", "gateway", "--pass", "cluster-pass-0123456789"];
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("redis-cli")
        .args(tls)
        .args(auth)
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for port in &ports {
        wait_until("the TLS cluster is ok", || {
            let p = port.to_string();
            let mut args = vec!["-p", &p];
            args.extend(tls);
            args.extend(auth);
            args.extend(["CLUSTER", "INFO"]);
            cli(&args).is_some_and(|info| info.contains("cluster_state:ok"))
        });
    }
    let up = Upstream::start("orders");
    let seeds: Vec<String> = ports
        .iter()
        .map(|p| format!("\"rediss://127.0.0.1:{p}\""))
        .collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"1s\"\ntls_ca_file = \"{}\"\nusername = \"gateway\"\npassword = {{ env = \"CLUSTER_PASS\" }}",
        seeds.join(", "),
        ca_file.display()
    );
    let gw = Gateway::start_env(
        "",
        "",
        &routes(&up, &store),
        &[("CLUSTER_PASS", "cluster-pass-0123456789")],
    );
    assert_eq!(statuses(&gw, 4), [200, 200, 200, 429]);
    // The bulk client's keys live in another slot: the calls spread over the nodes.
    for _ in 0..20 {
        let status = gw
            .get_with("/orders", &[("X-Api-Key", "bulk-key-0123456789abcdefg")])
            .status;
        assert_eq!(status, 200);
    }
    let readyz: serde_json::Value = serde_json::from_str(&gw.admin("/readyz").text()).unwrap();
    let nodes = readyz["store"]["nodes"].as_array().unwrap();
    let serving: Vec<&serde_json::Value> = nodes.iter().filter(|n| n["slots"] != 0).collect();
    assert_eq!(serving.len(), 3, "{readyz}");
    assert!(
        serving.iter().all(|n| n["circuit_breaker"] == "closed"),
        "{readyz}"
    );
}
