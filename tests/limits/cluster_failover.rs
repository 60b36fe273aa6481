//! Redis Cluster on an operator's bad day, through real gateways on a real Cluster: a master
//! frozen (SIGSTOP) until its replica is promoted, and a slot moved under traffic (`ASK` during
//! the migration, `MOVED` after it). What must hold: the frozen shard's clients are decided
//! again by the promoted replica while the old master is still frozen; clients on healthy
//! shards are never refused; a slot move costs no request; and nothing is admitted over a
//! limit. Counts and states are asserted, never time (the time to the first answer after the
//! promotion is printed).

use crate::common;

use common::redis::RedisCluster;
use common::{wait_until, Gateway, Upstream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Client ids to choose from: the test picks two whose keys live on different masters.
const CANDIDATES: [&str; 8] = [
    "xavier", "yvonne", "zoe", "walt", "uma", "tom", "sam", "rita",
];
/// X's budget for the whole test (a day's token bucket: nothing refills meanwhile).
const X_LIMIT: usize = 600;

fn config(
    up: &Upstream,
    cluster: &RedisCluster,
    ids: &[&str],
    limit: usize,
    timeout: &str,
) -> String {
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let clients: String = ids
        .iter()
        .map(|id| {
            format!("[[clients]]\nid = \"{id}\"\nplan = \"daily\"\napi_keys = [\"{id}-key-0123456789abcdef\"]\n\n")
        })
        .collect();
    format!(
        r#"
[store]
kind = "redis_cluster"
nodes = [{seeds}]
timeout = "{timeout}"
breaker_failures = 3
breaker_cooldown = "500ms"

[upstreams.orders]
servers = ["{addr}"]

[plans.daily]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = {limit}, window = "1d" }}]

{clients}
[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_closed"
"#,
        seeds = seeds.join(", "),
        addr = up.addr(),
    )
}

/// A client, and how many of its requests were admitted or answered 503 (every request of
/// the test counted).
struct Client {
    id: &'static str,
    admitted: AtomicUsize,
    unavailable: AtomicUsize,
}

impl Client {
    fn new(id: &'static str) -> Arc<Client> {
        Arc::new(Client {
            id,
            admitted: AtomicUsize::new(0),
            unavailable: AtomicUsize::new(0),
        })
    }

    fn get(&self, gw: &Gateway) -> u16 {
        self.get_on(gw.port)
    }

    fn get_on(&self, port: u16) -> u16 {
        let key = format!("{}-key-0123456789abcdef", self.id);
        let status = common::http::get_with(port, "/orders", &[("X-Api-Key", &key)]).status;
        match status {
            200 => self.admitted.fetch_add(1, Ordering::SeqCst),
            503 => self.unavailable.fetch_add(1, Ordering::SeqCst),
            _ => 0,
        };
        status
    }

    fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }
}

/// Two candidate ids whose slots are on different masters (as `cluster` has them now).
fn two_shards(cluster: &RedisCluster) -> (&'static str, &'static str) {
    let x = CANDIDATES[0];
    let x_primary = cluster.primary_of(cluster.slot_of(x), 0);
    let y = CANDIDATES[1..]
        .iter()
        .find(|id| cluster.primary_of(cluster.slot_of(id), 0) != x_primary)
        .expect("two candidates on different masters");
    (x, y)
}

/// Requests from one client, one every `every`, alternating gateways (by port: the test
/// thread owns the gateways, so a failing test still stops them), until `stop`: (when sent,
/// status) of each.
fn traffic(
    ports: Vec<u16>,
    client: Arc<Client>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, u16)>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            // When it was sent: one sent to the old primary just before the switch ends
            // in a timeout after it.
            let sent = Instant::now();
            let status = client.get_on(ports[i % ports.len()]);
            seen.push((sent, status));
            i += 1;
            std::thread::sleep(every);
        }
        seen
    })
}

/// Stops the traffic threads when dropped (also when the test fails).
struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_frozen_master_is_left_for_its_promoted_replica_and_healthy_shards_are_never_refused() {
    let cluster = RedisCluster::with_replicas();
    let up = Upstream::start("a");
    let (x, y) = two_shards(&cluster);
    let text = config(&up, &cluster, &[x, y], X_LIMIT, "200ms");
    let gateways = [Gateway::start(&text), Gateway::start(&text)];
    let ports: Vec<u16> = gateways.iter().map(|g| g.port).collect();
    let (x, y) = (Client::new(x), Client::new(y));
    for gw in gateways.iter() {
        assert_eq!(x.get(gw), 200);
        assert_eq!(y.get(gw), 200);
    }
    let x_primary = cluster.primary_of(cluster.slot_of(x.id), 0);
    let x_replica = cluster.replica_of(x_primary);
    let primary = &cluster.nodes[x_primary];
    // Everything X's master took is on its replica before the freeze.
    let _: () = primary.cmd(&["SET", &format!("{{{}}}:synced", x.id), "1"]);
    let acked: i64 = primary.cmd(&["WAIT", "1", "5000"]);
    assert_eq!(acked, 1, "the replica acknowledged the writes");

    let stop = Stop(Arc::new(AtomicBool::new(false)));
    let every = |ms| Duration::from_millis(ms);
    let x_traffic = traffic(
        ports.clone(),
        Arc::clone(&x),
        every(33),
        Arc::clone(&stop.0),
    );
    let y_traffic = traffic(
        ports.clone(),
        Arc::clone(&y),
        every(100),
        Arc::clone(&stop.0),
    );
    std::thread::sleep(Duration::from_millis(500));
    primary.freeze();
    let frozen_at = Instant::now();
    // Each gateway opens X's node's breaker, and only that one.
    let primary_addr = format!("127.0.0.1:{}", primary.port);
    for gw in gateways.iter() {
        wait_until("X's master's breaker opens in every gateway", || {
            gw.metric(
                "turnstile_store_node_breaker_state",
                &[("node", &primary_addr), ("state", "open")],
            ) == 1.0
        });
    }
    let readyz = gateways[0].admin("/readyz").text();
    let ready: serde_json::Value = serde_json::from_str(&readyz).unwrap();
    for node in ready["store"]["nodes"].as_array().unwrap() {
        let open = node["circuit_breaker"] == "open";
        assert_eq!(open, node["node"] == primary_addr.as_str(), "{readyz}");
    }
    wait_until("the replica is promoted", || {
        let info: String = cluster.nodes[x_replica].cmd(&["INFO", "replication"]);
        info.contains("role:master")
    });
    let promoted_at = Instant::now();
    // Both gateways follow the promoted replica while the old master is still frozen.
    for gw in gateways.iter() {
        wait_until("X is decided again while its old master is frozen", || {
            x.get(gw) != 503
        });
    }
    println!(
        "frozen -> promoted: {:?}; promoted -> X decided again by both gateways: {:?}",
        promoted_at - frozen_at,
        promoted_at.elapsed()
    );
    let answered_at = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    primary.thaw();
    std::thread::sleep(Duration::from_secs(2));
    stop.0.store(true, Ordering::SeqCst);
    let xs = x_traffic.join().unwrap();
    let ys = y_traffic.join().unwrap();

    let y_refused: Vec<u16> = ys.iter().map(|(_, s)| *s).filter(|s| *s != 200).collect();
    assert!(
        y_refused.is_empty(),
        "Y (on a healthy shard) was refused: {y_refused:?}"
    );
    assert!(ys.len() > 10, "Y kept sending: {}", ys.len());
    let x_after: Vec<u16> = xs
        .iter()
        .filter(|(t, _)| *t > answered_at)
        .map(|(_, s)| *s)
        .collect();
    assert!(
        !x_after.is_empty() && x_after.iter().all(|s| *s == 200),
        "X after its shard failed over (and its old master thawed): {x_after:?}"
    );
    // Nothing over the limit. What is missing of it was taken by requests answered 503: a
    // call Redis ran whose answer the gateway had stopped waiting for (at the freeze, or a
    // timeout under load) still counted (docs/limits.md, "When Redis is slow or gone").
    for i in 0.. {
        match x.get(&gateways[i % 2]) {
            200 => assert!(x.admitted() <= X_LIMIT, "X admitted beyond its limit"),
            429 => break,
            other => panic!("X got {other} after the failover"),
        }
    }
    let unavailable = x.unavailable.load(Ordering::SeqCst);
    assert!(
        x.admitted() <= X_LIMIT && x.admitted() + unavailable >= X_LIMIT,
        "X admitted {} of {X_LIMIT}, {unavailable} answered 503",
        x.admitted()
    );
}

#[test]
fn a_slot_moved_under_traffic_costs_no_request_and_the_count_continues() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("a");
    let limit = 100;
    let z = Client::new(CANDIDATES[2]);
    let text = config(&up, &cluster, &[z.id], limit, "2s");
    let gateways = [Gateway::start(&text), Gateway::start(&text)];
    let send = |n: usize| {
        for i in 0..n {
            assert_eq!(z.get(&gateways[i % 2]), 200, "request {i} of {n}");
        }
    };
    send(10);
    let slot = cluster.slot_of(z.id);
    let source = cluster.primary_of(slot, 0);
    let target = (source + 1) % cluster.nodes.len();
    let (from, to) = (&cluster.nodes[source], &cluster.nodes[target]);
    let from_addr = format!("127.0.0.1:{}", from.port);
    let slots_of_source =
        |gw: &Gateway| gw.metric("turnstile_store_node_slots", &[("node", &from_addr)]);
    let source_slots: Vec<f64> = gateways.iter().map(slots_of_source).collect();
    let id = |node: &common::redis::RedisServer| -> String { node.cmd(&["CLUSTER", "MYID"]) };
    let slot_arg = slot.to_string();
    let _: () = to.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &id(from)]);
    let _: () = from.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &id(to)]);
    // Migrating, its key still on the source: the source decides.
    send(5);
    // The key moves: the source answers ASK, the gateways follow it to the target.
    let keys: Vec<String> = from.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]);
    assert_eq!(keys.len(), 1, "one key for a one-limit plan: {keys:?}");
    let _: () = from.cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &to.port.to_string(),
        "",
        "0",
        "5000",
        "KEYS",
        &keys[0],
    ]);
    send(5);
    let asked: f64 = gateways
        .iter()
        .map(|g| g.metric("turnstile_store_redirects_total", &[("kind", "ask")]))
        .sum();
    assert!(asked >= 5.0, "ASK redirects followed: {asked}");
    // The move completes: every node names the target; the gateways' maps still say the
    // source, which answers MOVED.
    for node in &cluster.nodes {
        let _: () = node.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &id(to)]);
    }
    send(10);
    let moved: f64 = gateways
        .iter()
        .map(|g| g.metric("turnstile_store_redirects_total", &[("kind", "moved")]))
        .sum();
    assert!(moved >= 1.0, "MOVED redirects followed: {moved}");
    // The count continued across the move: exactly the limit in all.
    for i in 0.. {
        match z.get(&gateways[i % 2]) {
            200 => assert!(z.admitted() <= limit, "admitted beyond the limit"),
            429 => break,
            other => panic!("got {other} after the move"),
        }
    }
    assert_eq!(z.admitted(), limit);
    // Once the maps are read again (after the first MOVED), nothing is redirected any more.
    for (gw, before) in gateways.iter().zip(&source_slots) {
        wait_until("the gateway's map moved the slot", || {
            slots_of_source(gw) == before - 1.0
        });
    }
    let before: f64 = gateways
        .iter()
        .map(|g| g.metric("turnstile_store_redirects_total", &[("kind", "moved")]))
        .sum();
    for gw in &gateways {
        assert_eq!(z.get(gw), 429);
    }
    let after: f64 = gateways
        .iter()
        .map(|g| g.metric("turnstile_store_redirects_total", &[("kind", "moved")]))
        .sum();
    assert_eq!(before, after, "the gateways' maps name the new primary");
}
