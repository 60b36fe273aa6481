//! A Redis slower to connect to than `store.timeout` (a TLS handshake across zones, a busy
//! machine where a gateway has just started): a real redis-server behind a relay that holds
//! every new connection a while before passing it on. The requests that find no connection
//! give up at their timeout (their route's failure mode), but the connection is made in a
//! task of its own and the requests after are decided by Redis. Made inside each request, it
//! was cancelled with every request that gave up, and the gateway never limited anyone.

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

#[test]
fn a_redis_slower_to_connect_to_than_the_store_timeout_is_connected_all_the_same() {
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

[[routes]]
name = "open"
path_prefix = "/echo/open"
upstream = "orders"
auth = "api_key"
on_store_error = "fail_open"
"#,
        addr = up.addr(),
    ));
    // The first requests wait 50 ms for a connection that takes 300 ms and pass by the
    // route's failure mode; once it is made, the fourth decision Redis takes refuses.
    wait_until("a request refused by Redis's count", || {
        http::get_with(gw.port, "/echo/open", &[("X-Api-Key", KEY)]).status == 429
    });
    assert_eq!(
        gw.metric("turnstile_store_calls_total", &[("result", "ok")]),
        4.0,
        "three admitted and one refused by Redis"
    );
    assert!(gw.metric("turnstile_store_calls_total", &[("result", "timeout")]) >= 1.0);
    assert!(!gw.proc.log_text().contains("panicked"));
}
