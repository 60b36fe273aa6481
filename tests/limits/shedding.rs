//! Load shedding against real orders-api processes: the adaptive limit follows the upstream's
//! latency (down when it slows, up when it recovers); on a saturated upstream, sheddable
//! requests are shed (503 problem+json, never sent upstream, their units given back in
//! Redis) while critical ones keep being served; settings are validated and hot-reloaded.
//! Client threads send requests one after another (bounded load); assertions count
//! responses and read /metrics, never time.

use crate::common;

use common::redis::RedisServer;
use common::{free_port, http, turnstile, wait_until, Gateway, Upstream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

const OPS: &str = "ops-key-0123456789abcdef01";
const BATCH: &str = "batch-key-0123456789abcdef";

fn limit_of(gw: &Gateway) -> f64 {
    gw.metric(
        "turnstile_shedding",
        &[("upstream", "orders"), ("state", "limit")],
    )
}

/// `threads` clients sending `path` one request after another until `stop`; counts answers.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    other: Arc<AtomicU64>,
    handles: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, path: &str, headers: &[(&str, &str)], threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let other = Arc::new(AtomicU64::new(0));
        let owned: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let handles = (0..threads)
            .map(|_| {
                let (stop, ok, other) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&other));
                let (path, owned) = (path.to_owned(), owned.clone());
                thread::spawn(move || {
                    let headers: Vec<(&str, &str)> = owned
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    while !stop.load(Ordering::Relaxed) {
                        match http::get_with(port, &path, &headers).status {
                            200 => ok.fetch_add(1, Ordering::Relaxed),
                            _ => other.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            other,
            handles,
        }
    }

    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.join().expect("load thread");
        }
        (
            self.ok.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn the_limit_comes_down_as_the_upstream_slows_and_goes_back_up_when_it_recovers() {
    let up = Upstream::start_args(
        "orders",
        free_port(),
        &["--threads", "2", "--delay-ms", "5"],
    );
    let gw = Gateway::start(&format!(
        r#"
[upstreams.orders]
servers = ["{}"]

[upstreams.orders.shedding]
min_limit = 2
max_limit = 60
initial_limit = 10
window = "100ms"
baseline_interval = "10m"
queue = 1000
queue_timeout = "30s"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
"#,
        up.addr()
    ));
    // It starts with a probe at min_limit (measuring the baseline), then 10.
    assert_eq!(limit_of(&gw), 2.0);
    let load = Load::start(gw.port, "/orders", &[], 8);
    // At the baseline (5 ms) the limit probes upwards.
    wait_until("the limit to grow at the baseline latency", || {
        limit_of(&gw) >= 30.0
    });
    let baseline = gw.metric(
        "turnstile_shedding_latency_seconds",
        &[("upstream", "orders"), ("kind", "baseline")],
    );
    assert!(baseline > 0.0 && baseline < 0.1, "baseline {baseline}s");
    // Twenty times slower: the limit comes down.
    up.set_delay(100);
    wait_until("the limit to come down as latency rises", || {
        limit_of(&gw) <= 8.0
    });
    let window = gw.metric(
        "turnstile_shedding_latency_seconds",
        &[("upstream", "orders"), ("kind", "window")],
    );
    assert!(window >= 0.1, "last window's latency {window}s");
    assert!(limit_of(&gw) >= 2.0, "never below min_limit");
    // Back to normal: it climbs again.
    up.set_delay(0);
    wait_until("the limit to go back up when the delay is removed", || {
        limit_of(&gw) >= 30.0
    });
    let (ok, other) = load.finish();
    // The queue was long and patient enough: nothing was shed, only paced.
    assert_eq!(other, 0, "{ok} served, {other} not");
    assert_eq!(
        gw.metric("turnstile_shed_total", &[("upstream", "orders")]),
        0.0
    );
}

#[test]
fn on_a_saturated_upstream_sheddable_requests_are_shed_and_critical_ones_served() {
    let redis = RedisServer::start();
    // Four requests at a time, 50 ms each: 80 requests per second at most.
    let up = Upstream::start_args(
        "orders",
        free_port(),
        &["--threads", "2", "--capacity", "4", "--delay-ms", "50"],
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    // A fixed limit of 8: sheddable requests may fill 4 slots, critical ones all 8. The
    // route is critical; the batch plan says sheddable, which wins for its clients.
    let gw = Gateway::start(&format!(
        r#"
[access_log]
mode = "on"
path = "{log}"

[store]
kind = "redis"
url = "{redis}"
timeout = "500ms"

[upstreams.orders]
servers = ["{addr}"]

[upstreams.orders.shedding]
min_limit = 8
max_limit = 8
initial_limit = 8
reserve_critical = 0.25
reserve_default = 0.25
queue = 4
queue_timeout = "20ms"

[plans.ops]
limits = [{{ name = "per-day", algorithm = "fixed_window", limit = 100000, window = "1d" }}]

[plans.batch]
priority = "sheddable"
limits = [{{ name = "per-day", algorithm = "fixed_window", limit = 100000, window = "1d" }}]

[[clients]]
id = "ops"
plan = "ops"
api_keys = ["{OPS}"]

[[clients]]
id = "batch"
plan = "batch"
api_keys = ["{BATCH}"]

[[routes]]
name = "work"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
priority = "critical"
"#,
        log = log.display(),
        redis = redis.url(),
        addr = up.addr(),
    ));
    let batch = Load::start(gw.port, "/orders", &[("X-Api-Key", BATCH)], 12);
    let critical = Load::start(gw.port, "/orders", &[("X-Api-Key", OPS)], 4);
    wait_until("sheddable requests to be shed", || {
        gw.metric(
            "turnstile_shed_total",
            &[("upstream", "orders"), ("priority", "sheddable")],
        ) >= 20.0
    });
    // A shed request, as the client sees it.
    let mut probes_ok = 0;
    let shed = loop {
        let resp = gw.get_with("/orders", &[("X-Api-Key", BATCH)]);
        if resp.status != 200 {
            break resp;
        }
        probes_ok += 1;
    };
    let (batch_ok, batch_shed) = batch.finish();
    let batch_ok = batch_ok + probes_ok;
    let (critical_ok, critical_other) = critical.finish();
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert_eq!(
        shed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(shed.header("retry-after"), Some("1"));
    let body = shed.json();
    assert!(
        body["type"].as_str().unwrap().ends_with("/overloaded"),
        "{body}"
    );
    assert!(batch_shed > 0);
    // Critical requests always found room: sheddable ones never hold more than half.
    assert_eq!(critical_other, 0, "{critical_ok} served");
    assert!(critical_ok > 0);
    assert_eq!(
        gw.metric(
            "turnstile_shed_total",
            &[("upstream", "orders"), ("priority", "critical")],
        ),
        0.0
    );
    // Shed requests never reached the upstream: it served exactly the 200s.
    let served = batch_ok + critical_ok;
    assert_eq!(up.served(), served);
    // Their units were given back: the batch client's count is what it was served.
    let day_key = |client: &str| -> u64 {
        let keys: Vec<String> = redis.cmd(&["KEYS", &format!("*{{{client}}}*per-day*")]);
        keys.iter()
            .map(|k| {
                let v: Option<String> = redis.cmd(&["HGET", k, "c"]);
                v.map_or(0, |v| v.parse().unwrap())
            })
            .sum()
    };
    wait_until("the shed requests' units to be given back", || {
        day_key("batch") == batch_ok
    });
    assert_eq!(day_key("ops"), critical_ok);
    // The access log marks them.
    wait_until("the access log to hold the shed requests", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(r#""decision":"shed""#))
            .count() as u64
            > batch_shed
    });
}

#[test]
fn shedding_is_validated_by_check_and_turned_on_by_a_reload() {
    let up = Upstream::start("orders");
    let route = "[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"orders\"\npriority = \"sheddable\"\n";
    let plain = format!(
        "[upstreams.orders]\nservers = [\"{}\"]\n\n{route}",
        up.addr()
    );
    let gw = Gateway::start_with("watch_config = false", &plain);
    // Off by default: no gate, no metrics, the priority does nothing (and check says so).
    assert_eq!(gw.get("/orders").status, 200);
    assert!(!gw.admin("/metrics").text().contains("turnstile_shedding{"));
    let (code, out, err) = turnstile(&["check", gw.config_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("routes[0].priority"),
        "{out}{err}"
    );
    // Broken settings: refused by name, and a reload keeps the running config.
    let broken = format!(
        "[upstreams.orders]\nservers = [\"{}\"]\n\n[upstreams.orders.shedding]\nmin_limit = 10\nmax_limit = 5\nreserve_critical = 0.7\nreserve_default = 0.4\nsurprise = 1\n\n{route}",
        up.addr()
    );
    gw.rewrite(&broken);
    let (code, out, err) = turnstile(&["check", gw.config_path.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(format!("{out}{err}").contains("surprise"), "{out}{err}");
    let broken = broken.replace("surprise = 1\n", "");
    gw.rewrite(&broken);
    let (code, out, err) = turnstile(&["check", gw.config_path.to_str().unwrap()]);
    assert_ne!(code, 0);
    let said = format!("{out}{err}");
    for field in ["shedding.max_limit", "shedding.reserve_default"] {
        assert!(said.contains(field), "{field} not in {said}");
    }
    assert_eq!(gw.reload().status, 422);
    assert_eq!(gw.config_version(), 1);
    // Turned on by a reload: a fixed limit of 3, as the metrics show.
    gw.rewrite(&format!(
        "[upstreams.orders]\nservers = [\"{}\"]\n\n[upstreams.orders.shedding]\nmin_limit = 3\nmax_limit = 3\ninitial_limit = 3\n\n{route}",
        up.addr()
    ));
    assert_eq!(gw.reload().status, 200);
    assert_eq!(limit_of(&gw), 3.0);
    assert_eq!(gw.get("/orders").status, 200);
    let config = gw.admin("/config").json()["config"].clone();
    let shedding = &config["upstreams"][0]["shedding"];
    assert_eq!(shedding["max_limit"], 3, "{config}");
    assert_eq!(config["routes"][0]["priority"], "sheddable", "{config}");
}
