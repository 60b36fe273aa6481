//! The deployment topology: docker-compose.yml checked against the configs it mounts (there
//! is no Docker engine where tests run), and the same topology run for real by
//! `scripts/cluster.sh` — Redis, two orders-api, three gateways, HAProxy — with requests
//! through the balancer.

use crate::common;

use common::{free_port, http, wait_until, Proc};
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const KEY: &str = "demo-cluster-key-0001";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn compose() -> Value {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let mut value: Value = serde_yaml::from_str(&text).expect("docker-compose.yml is valid YAML");
    // Expand `<<: *gateway` merge keys, as docker compose does.
    value.apply_merge().expect("merge keys resolve");
    value
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_compose_file_agrees_with_the_configs_it_mounts() {
    let compose = compose();
    let services = compose["services"].as_mapping().expect("services");
    let names: BTreeSet<String> = services
        .keys()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    for expected in [
        "redis",
        "orders-1",
        "orders-2",
        "turnstile-1",
        "turnstile-2",
        "turnstile-3",
        "lb",
    ] {
        assert!(
            names.contains(expected),
            "service {expected} missing: {names:?}"
        );
    }

    // Every mounted file exists; every mounted gateway config passes `turnstile check`.
    let mut gateway_configs = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        for volume in strings(&service["volumes"]) {
            let host = volume.split(':').next().unwrap();
            let path = root().join(host);
            assert!(path.exists(), "{name} mounts {host}, which does not exist");
            if volume.contains("/etc/turnstile/") {
                let (code, out, err) = common::turnstile(&["check", path.to_str().unwrap()]);
                assert_eq!(code, 0, "{name}: turnstile check {host}: {out}{err}");
                gateway_configs.insert(host.to_owned());
            }
        }
    }
    assert_eq!(
        gateway_configs.len(),
        1,
        "the three replicas share one config"
    );
    let config_path = root().join(gateway_configs.iter().next().unwrap());
    let config = turnstile::config::Config::load(&config_path).unwrap();

    // The config names the services, on the ports those services use.
    let turnstile::config::StoreConfig::Redis(redis, _) = &config.store else {
        panic!("the cluster config must use the shared Redis");
    };
    assert_eq!(
        redis.topology,
        turnstile::limit::store::redis::Topology::Single("redis://redis:6379".into())
    );
    let redis_cmd = strings(&services["redis"]["command"]).join(" ");
    assert!(
        redis_cmd.contains("--maxmemory-policy noeviction"),
        "{redis_cmd}"
    );
    let servers = &config.upstreams["orders"].servers;
    for (i, server) in servers.iter().enumerate() {
        let (host, port) = server.split_once(':').unwrap();
        let command = strings(&services[host]["command"]);
        let listens_on = command
            .windows(2)
            .find(|w| w[0] == "--port")
            .map(|w| w[1].clone());
        assert_eq!(
            listens_on.as_deref(),
            Some(port),
            "upstreams.orders.servers[{i}] = {server}"
        );
        assert!(
            command.contains(&"0.0.0.0".to_owned()),
            "{host} must listen beyond its loopback"
        );
    }
    assert_eq!(config.server.listen.port(), 8080);
    assert_eq!(config.admin.listen.port(), 9090);

    // Published ports: the balancer publishes the only public one; admin ports stay on the
    // host's loopback.
    for (name, service) in services {
        let name = name.as_str().unwrap();
        for port in strings(&service["ports"]) {
            if name == "lb" {
                assert_eq!(port, "8080:8080");
            } else {
                assert!(
                    port.starts_with("127.0.0.1:"),
                    "{name} publishes {port} beyond the host"
                );
                assert!(
                    port.ends_with(":9090"),
                    "{name} publishes {port}: only the admin port"
                );
            }
        }
    }

    // The balancer: its backends are the three gateway services on the gateway port, checked
    // on the admin port; its fixed address is the one trusted proxy.
    let haproxy = std::fs::read_to_string(root().join("conf/cluster/haproxy.cfg")).unwrap();
    for i in 1..=3 {
        let line = format!(
            "server turnstile-{i} turnstile-{i}:{} check port {}",
            config.server.listen.port(),
            config.admin.listen.port()
        );
        assert!(haproxy.contains(&line), "haproxy.cfg lacks `{line}`");
    }
    assert!(haproxy.contains("bind *:8080") && haproxy.contains("option forwardfor"));
    let lb_ip = compose["services"]["lb"]["networks"]["turnstile"]["ipv4_address"]
        .as_str()
        .unwrap();
    assert!(haproxy.contains(&format!("source {lb_ip}")));
    let trusted: Vec<String> = config
        .server
        .trusted_proxies
        .nets()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(trusted, [format!("{lb_ip}/32")]);
    let subnet = compose["networks"]["turnstile"]["ipam"]["config"][0]["subnet"]
        .as_str()
        .unwrap();
    let subnet: ipnet::IpNet = subnet.parse().unwrap();
    assert!(subnet.contains(&lb_ip.parse::<std::net::IpAddr>().unwrap()));
}

/// The script's topology on free ports, killed (with everything it started) on drop.
struct Cluster {
    lb: u16,
    admin: [u16; 3],
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let lb = free_port();
        let gw = [free_port(), free_port(), free_port()];
        let admin = [free_port(), free_port(), free_port()];
        let bin = Path::new(env!("CARGO_BIN_EXE_turnstile")).parent().unwrap();
        let mut proc = Proc::spawn_group(
            "cluster.sh",
            Command::new(root().join("scripts/cluster.sh"))
                .env("BIN", bin)
                .env("WORK", dir.path())
                .env("LB_PORT", lb.to_string())
                .env("REDIS_PORT", free_port().to_string())
                .env("O1_PORT", free_port().to_string())
                .env("O2_PORT", free_port().to_string())
                .env("GW_PORTS", format!("{} {} {}", gw[0], gw[1], gw[2]))
                .env(
                    "ADMIN_PORTS",
                    format!("{} {} {}", admin[0], admin[1], admin[2]),
                ),
            dir.path().join("cluster.log"),
        );
        wait_until("the cluster to be ready", || {
            proc.assert_running();
            dir.path().join("ports.env").exists()
        });
        // HAProxy marks the gateways up after their readiness checks pass; until then it
        // sends everything to those already up. Wait until each replica has served a
        // request through it (from 127.0.0.1, a client the test does not use afterwards).
        wait_until("every gateway behind the balancer", || {
            let _ = http::get(lb, "/healthz");
            admin.iter().all(|port| {
                let text = http::get(*port, "/metrics").text();
                common::metric_value(&text, "turnstile_requests_total", &[]) >= 1.0
            })
        });
        Cluster {
            lb,
            admin,
            _proc: proc,
            _dir: dir,
        }
    }

    fn get_from(&self, source: Ipv4Addr, path: &str, headers: &[(&str, &str)]) -> http::Response {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("Connection: close\r\n\r\n");
        http::raw_from(Some(source), self.lb, req.as_bytes()).expect("request through the balancer")
    }

    fn served(&self, replica: usize, route: &str, status: &str) -> f64 {
        let text = http::get(self.admin[replica], "/metrics").text();
        common::metric_value(
            &text,
            "turnstile_requests_total",
            &[("route", route), ("status", status)],
        )
    }
}

#[test]
fn through_the_balancer_a_client_is_limited_once_and_by_its_real_address() {
    let cluster = Cluster::start();
    let client = Ipv4Addr::new(127, 0, 0, 5);

    // The plan allows 30 per minute: 60 requests, spread by the balancer over three replicas,
    // admit exactly 30 in total (one shared count, not 30 per replica). The limit is the
    // shipped sliding window, whose windows start on the minute (Redis's clock, this
    // machine's): past the next minute the last one's count weighs less and more requests
    // pass, as the algorithm intends. So the requests start early in a minute, with at least
    // 30 s to go, however slow this machine is today.
    while SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60
        >= 30
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let statuses: Vec<u16> = (0..60)
        .map(|_| {
            cluster
                .get_from(client, "/orders", &[("X-Api-Key", KEY)])
                .status
        })
        .collect();
    // The shipped config decides in the local fallback (limit ÷ 3 per replica) when Redis
    // does not answer within its 20 ms: on a loaded machine some decisions are local, and
    // only then may the count be off — by at most the number of local decisions.
    let local: f64 = (0..3)
        .map(|replica| {
            let text = common::http::get(cluster.admin[replica], "/metrics").text();
            common::metric_value(
                &text,
                "turnstile_limiter_decisions_total",
                &[
                    ("route", "orders"),
                    ("policy", "per-minute"),
                    ("outcome", "local_fallback"),
                ],
            )
        })
        .sum();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    if local == 0.0 {
        assert_eq!(admitted, 30, "{statuses:?}");
        assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 30);
    } else {
        eprintln!("{local} decisions were made in the local fallback (Redis slower than 20 ms)");
        assert!(
            admitted.abs_diff(30) as f64 <= local,
            "{admitted} admitted, {local} local decisions: {statuses:?}"
        );
    }
    for replica in 0..3 {
        let ok = cluster.served(replica, "orders", "200");
        assert!(
            ok >= 5.0,
            "replica {replica} admitted {ok}: the balancer should spread requests"
        );
    }

    // The per-IP limit (burst 5 on /healthz) keys on the client behind the balancer. It is
    // kept in each replica (coarse, in process), so a client gets 5 per replica: 30 requests
    // round robin over three replicas admit exactly 15. Another client through the same
    // balancer is untouched — which would not be so if the gateways keyed on the balancer.
    let a: Vec<u16> = (0..30)
        .map(|_| cluster.get_from(client, "/healthz", &[]).status)
        .collect();
    assert_eq!(a.iter().filter(|s| **s == 200).count(), 15, "{a:?}");
    assert_eq!(a.iter().filter(|s| **s == 429).count(), 15, "{a:?}");
    let other = Ipv4Addr::new(127, 0, 0, 6);
    let b: Vec<u16> = (0..3)
        .map(|_| cluster.get_from(other, "/healthz", &[]).status)
        .collect();
    assert_eq!(b, [200, 200, 200], "a different client has its own buckets");
    // A spoofed X-Forwarded-For does not move the client to a fresh bucket: the balancer adds
    // the real address, which is the one the gateways use.
    let spoofed = cluster.get_from(client, "/healthz", &[("X-Forwarded-For", "198.51.100.77")]);
    assert_eq!(spoofed.status, 429, "{}", spoofed.text());
    let body = spoofed.json();
    assert_eq!(body["violated-policies"], serde_json::json!(["ip"]));
}
