//! A Redis slower to connect to than `store.timeout` (a TLS handshake across zones, a busy
//! machine where a gateway has just started): a real redis-server behind a relay that holds
//! every new connection a while before passing it on. The connection is made in a task of its
//! own (never cancelled by a request giving up), and until the store's first decision has
//! ended, decisions wait for it before their own timeout: a freshly started gateway limits
//! exactly from its first request. Made inside each request, the connection was cancelled
//! with every request that gave up and the gateway never limited anyone; then, made in a
//! task of its own, the first requests still fell to their routes' failure mode (let past
//! the limit on `fail_open`, refused on `fail_closed`) while it was being made.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const KEY: &str = "slow-connect-key-0123456789";

/// A relay on a free port to `target`, holding each new connection `delay` before connecting
/// on (what the client sent meanwhile waits in the socket); then bytes pass both ways.
fn slow_relay(target: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    return;
                };
                let (Ok(mut up), Ok(mut down)) = (client.try_clone(), server.try_clone()) else {
                    return;
                };
                let (mut client, mut server) = (client, server);
                std::thread::spawn(move || std::io::copy(&mut up, &mut server));
                let _ = std::io::copy(&mut down, &mut client);
            });
        }
    });
    port
}

const BOB: &str = "slow-connect-key-bob-0123456789";

#[test]
fn a_fresh_gateway_limits_exactly_from_its_first_requests_while_redis_is_slow_to_connect_to() {
    let redis = RedisServer::start();
    let relay = slow_relay(redis.port, Duration::from_millis(300));
    let up = Upstream::start("a");
    let gw = Gateway::start(&format!(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:{relay}"
timeout = "50ms"
breaker_failures = 100000
heartbeat_interval = "10s"

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-day", algorithm = "fixed_window", limit = 3, window = "1d" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[clients]]
id = "bob"
plan = "small"
api_keys = ["{BOB}"]

[[routes]]
name = "open"
path_prefix = "/echo/open"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_open"

[[routes]]
name = "closed"
path_prefix = "/echo/closed"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_closed"
"#,
        addr = up.addr(),
    ));
    // The gateway's very first requests, all at once: ada's route lets through when the
    // store fails, bob's refuses. Each waits for the connection (300 ms to make, six times
    // its 50 ms timeout) and is decided by Redis: three admitted, the fourth refused, on both.
    let port = gw.port;
    let asks: Vec<_> = (0..8)
        .map(|i| {
            let (path, key) = match i % 2 {
                0 => ("/echo/open", KEY),
                _ => ("/echo/closed", BOB),
            };
            std::thread::spawn(move || (i % 2, http::get_with(port, path, &[("X-Api-Key", key)])))
        })
        .collect();
    let mut statuses = [Vec::new(), Vec::new()];
    for ask in asks {
        let (who, response) = ask.join().unwrap();
        statuses[who].push(response.status);
    }
    for (who, mut seen) in statuses.into_iter().enumerate() {
        seen.sort();
        assert_eq!(
            seen,
            [200, 200, 200, 429],
            "client {who}: three admitted by Redis's count"
        );
    }
    assert_eq!(
        gw.metric("turnstile_store_calls_total", &[("result", "ok")]),
        8.0
    );
    assert_eq!(
        gw.metric("turnstile_store_calls_total", &[("result", "timeout")]),
        0.0,
        "no first decision gave up while the connection was being made"
    );
    // Once a decision has ended, each is bounded by store.timeout alone again: a Redis
    // that stops answering is given up on within it (the route's failure mode).
    redis.freeze();
    let open = http::get_with(gw.port, "/echo/open", &[("X-Api-Key", KEY)]);
    redis.thaw();
    assert_eq!(
        open.status, 200,
        "fail_open lets through a request Redis would refuse"
    );
    assert!(gw.metric("turnstile_store_calls_total", &[("result", "timeout")]) >= 1.0);
    wait_until("the degraded decision logged", || {
        gw.proc.log_text().contains("timed out after 50ms")
    });
    assert!(!gw.proc.log_text().contains("panicked"));
}
