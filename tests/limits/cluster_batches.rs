//! Batches on a Redis Cluster: many clients' decisions, whose keys span slots of one node,
//! decided in one `batch.lua` call (keys passed as arguments: Redis refuses declared keys
//! that span slots with `CROSSSLOT`, even with `allow-cross-slot-keys`), every client held
//! exactly to its limit.

use crate::common;

use common::redis::RedisCluster;
use common::{http, Gateway, Upstream};

const CLIENTS: usize = 40;
const LIMIT: usize = 25;
const SENT: usize = 30;

fn key(i: usize) -> String {
    format!("cluster-batch-key-{i:04}-0123456789abcdef")
}

fn config(up: &Upstream, cluster: &RedisCluster) -> String {
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let mut text = format!(
        r#"
[store]
kind = "redis_cluster"
nodes = [{nodes}]
timeout = "2s"
batch_in_flight = 1

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = {LIMIT}, window = "1h" }}]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_closed"
"#,
        nodes = nodes.join(", "),
        addr = up.addr(),
    );
    for i in 0..CLIENTS {
        text.push_str(&format!(
            "\n[[clients]]\nid = \"c{i}\"\nplan = \"small\"\napi_keys = [\"{}\"]\n",
            key(i)
        ));
    }
    text
}

/// Forty clients (their keys in slots all over the three masters) sending at once through
/// one gateway that keeps one call in flight per node: most decisions ride in batches that
/// Redis runs (batched, not sent again alone), and every client gets exactly its limit.
#[test]
fn many_clients_decisions_are_batched_on_a_cluster_and_stay_exact() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &cluster));
    let port = gw.port;
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::thread::spawn(move || {
                let key = key(i);
                (0..SENT)
                    .filter(|_| {
                        let r = http::get_with(port, "/orders", &[("X-Api-Key", &key)]);
                        assert!(matches!(r.status, 200 | 429), "{}", r.status);
                        r.status == 200
                    })
                    .count()
            })
        })
        .collect();
    let admitted: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(admitted.iter().all(|&n| n == LIMIT), "{admitted:?}");
    let batched = gw.metric("turnstile_store_batched_decisions_total", &[]);
    let alone = gw.metric("turnstile_store_batch_fallbacks_total", &[]);
    let decisions = (CLIENTS * SENT) as f64;
    let share = (batched - alone) / decisions;
    eprintln!("{batched} batched, {alone} sent alone after their batch, of {decisions}");
    assert!(
        share > 0.5,
        "only {:.0} % of the decisions decided in batches ({batched} batched, {alone} sent again alone)",
        share * 100.0
    );
}
