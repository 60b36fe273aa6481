//! The Redis store against a local redis-server it starts itself (free port, temporary
//! directory, no persistence): decisions per second over one multiplexed connection at
//! several concurrency levels, and Redis round trips per decision (from `INFO commandstats`)
//! for plans of 1 and 4 limits. Run with `cargo bench --bench redis`; results in
//! BENCHMARKS.md. Under `cargo test` (no `--bench`) it does a short smoke run.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::chain::body::BodyFields;
use turnstile::chain::partition::{KeyHasher, KeyInputs, KeyPart, Missing};
use turnstile::limit::store::redis::{RedisConfig, RedisStore, Topology};
use turnstile::limit::store::request::Partition;
use turnstile::limit::store::CheckRequest;
use turnstile::limit::{Algorithm, Policy};

/// The redis-server process, killed on drop, and its directory, removed after it.
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> (Server, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt install redis-server)");
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..500 {
        if redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .is_ok()
        {
            return (Server { child, _dir: dir }, port);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("redis-server did not start");
}

fn evalsha_calls(url: &str) -> u64 {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `keyed`: the last policy is a keyed limit (per account, key hashed per request as the
/// gateway does); the others are the client's.
async fn run(
    store: Arc<RedisStore>,
    policies: Arc<Vec<Policy>>,
    keyed: bool,
    concurrency: usize,
    duration: Duration,
) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (store, policies, done) =
                (Arc::clone(&store), Arc::clone(&policies), Arc::clone(&done));
            tokio::spawn(async move {
                let client: Arc<str> = format!("client-{}", t % 64).into();
                let route: Arc<str> = "orders".into();
                let hasher = KeyHasher::new(b"bench-key-hash-secret");
                let headers = http::HeaderMap::new();
                let account = format!("user-{}@example.com", t % 64);
                let body = BodyFields::from_pairs([("username", account.as_str())]);
                let parts = [KeyPart::parse("body:username").expect("a key part")];
                while Instant::now() < deadline {
                    let mut partitions = Vec::new();
                    if keyed {
                        let inputs = KeyInputs {
                            ip: None,
                            addr: None,
                            client: None,
                            route: &route,
                            headers: &headers,
                            query: None,
                            body: Some(&body),
                            token: None,
                            cert: None,
                        };
                        let key = hasher
                            .partition(&parts, Missing::Reject, &inputs)
                            .expect("a key");
                        partitions = vec![Partition::Client; policies.len() - 1];
                        partitions.push(Partition::Keyed(key.into()));
                    }
                    let request = CheckRequest {
                        partitions: &partitions,
                        ..CheckRequest::new(&client, &route, &policies, 1)
                    };
                    store.check(&request).await.expect("store call");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let duration = if bench {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(200)
    };
    let (_server, port) = start_redis();
    let url = format!("redis://127.0.0.1:{port}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Batching on (the default) and off, each its own store and connection.
    let store = |batch_max| {
        Arc::new(
            RedisStore::new(RedisConfig {
                topology: Topology::Single(url.clone()),
                auth: Default::default(),
                tls: Default::default(),
                prefix: "bench".into(),
                timeout: Duration::from_secs(1),
                slot_ttl: Duration::from_secs(60),
                batch_max,
                batch_in_flight: 2,
                startup_grace: std::time::Duration::from_secs(5),
                decide_with: Default::default(),
            })
            .unwrap(),
        )
    };
    let stores = [(64, store(64)), (1, store(1))];
    // Limits high enough that nothing is rejected.
    let one = Arc::new(vec![Policy::new(
        "per-minute",
        Algorithm::SlidingWindow,
        1 << 40,
        60_000,
        1 << 40,
    )]);
    let four = Arc::new(vec![
        Policy::new("per-second", Algorithm::TokenBucket, 1 << 30, 1000, 1 << 30),
        Policy::new(
            "per-minute",
            Algorithm::SlidingWindow,
            1 << 40,
            60_000,
            1 << 40,
        ),
        Policy::new(
            "per-hour",
            Algorithm::FixedWindow,
            1 << 40,
            3_600_000,
            1 << 40,
        ),
        Policy::new(
            "per-day",
            Algorithm::SlidingWindow,
            1 << 40,
            86_400_000,
            1 << 40,
        ),
    ]);
    runtime.block_on(async {
        // Connect and load the script before measuring.
        let (client, route): (Arc<str>, Arc<str>) = ("warmup".into(), "orders".into());
        for (_, store) in &stores {
            store
                .check(&CheckRequest::new(&client, &route, &one, 1))
                .await
                .unwrap();
        }
    });
    println!("redis store, one multiplexed connection, 1 tokio worker, {duration:?} per row");
    println!(
        "{:<8} {:>9} {:>11} {:>14} {:>22} {:>10}",
        "limits", "batch_max", "concurrency", "decisions/s", "EVALSHA per decision", "mean batch"
    );
    // A plan limit and a keyed limit (per account) decided together, in one call.
    let plan_and_keyed = Arc::new(vec![
        one[0].clone(),
        Policy::new(
            "per-account",
            Algorithm::SlidingWindow,
            1 << 40,
            60_000,
            1 << 40,
        ),
    ]);
    for (name, policies, keyed) in [
        ("1", &one, false),
        ("4", &four, false),
        ("1+keyed", &plan_and_keyed, true),
    ] {
        for (concurrency, (batch_max, store)) in [1, 16, 64]
            .into_iter()
            .flat_map(|c| stores.iter().map(move |s| (c, s)))
        {
            let before = evalsha_calls(&url);
            let was = store.batches();
            let start = Instant::now();
            let done = runtime.block_on(run(
                Arc::clone(store),
                Arc::clone(policies),
                keyed,
                concurrency,
                duration,
            ));
            let rate = done as f64 / start.elapsed().as_secs_f64();
            let calls = evalsha_calls(&url) - before;
            let now = store.batches();
            let (batches, batched) = (now.batches - was.batches, now.decisions - was.decisions);
            let mean = if batches > 0 {
                format!("{:.1}", batched as f64 / batches as f64)
            } else {
                "-".to_owned()
            };
            println!(
                "{name:<8} {batch_max:>9} {concurrency:>11} {rate:>14.0} {:>22.3} {mean:>10}",
                calls as f64 / done as f64
            );
            // Every decision made exactly once: alone, or as one member of one batch.
            assert_eq!(calls - batches + batched, done, "one decision per request");
        }
    }
}
