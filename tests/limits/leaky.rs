//! The leaky bucket that delays, through real gateways on a real Redis, a Redis Cluster and
//! the memory store: a burst sent to three gateways at once reaches the upstream at the rate (one, then `burst` held and let out one
//! per turn, the rest refused), and in process with the `local` failure mode; a client that leaves while its request waits — an HTTP/1
//! connection closed, an HTTP/2 stream reset — gives its turn back; beyond
//! `server.max_delayed` waiting requests the gateway answers 503 before the store counts them.

use crate::common;

use common::redis::{RedisCluster, RedisServer};
use common::{wait_until, Gateway, Upstream};
use std::io::{Read, Write};
use std::net::TcpStream;

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"",
        redis.url()
    )
}

/// Plans with one leaky bucket each (`limit` per `window`, `burst`), one client per plan.
fn config(up: &Upstream, redis: &RedisServer, buckets: &[(&str, u64, &str, u64)]) -> String {
    config_on(up, &redis_store(redis), "", buckets)
}

/// [`config`] on any `store` block, with `route` lines added to the route.
fn config_on(
    up: &Upstream,
    store: &str,
    route: &str,
    buckets: &[(&str, u64, &str, u64)],
) -> String {
    let mut text = format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
{route}

{store}
"#,
        addr = up.addr(),
    );
    for (client, limit, window, burst) in buckets {
        text.push_str(&format!(
            r#"
[plans.{client}]
limits = [{{ name = "smooth", algorithm = "leaky_bucket", limit = {limit}, window = "{window}", burst = {burst} }}]

[[clients]]
id = "{client}"
plan = "{client}"
api_keys = ["{client}-key-0123456789abcdef"]
"#
        ));
    }
    text
}

fn key(client: &str) -> String {
    format!("{client}-key-0123456789abcdef")
}

fn request(client: &str) -> Vec<u8> {
    format!(
        "GET /orders HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nConnection: close\r\n\r\n",
        key(client)
    )
    .into_bytes()
}

/// Reads one whole response (the gateway closes the connection after it).
fn read_response(mut stream: TcpStream) -> common::http::Response {
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).expect("a response");
    common::http::parse(&buf).expect("an HTTP response").0
}

/// `n` of `client`'s requests sent at once, spread over `ports`: the connections opened
/// first, then the requests written back to back; their responses.
fn at_once(ports: &[u16], n: usize, client: &str) -> Vec<common::http::Response> {
    let mut streams: Vec<TcpStream> = (0..n)
        .map(|i| TcpStream::connect(("127.0.0.1", ports[i % ports.len()])).unwrap())
        .collect();
    for s in &mut streams {
        s.write_all(&request(client)).unwrap();
    }
    let readers: Vec<_> = streams
        .into_iter()
        .map(|s| std::thread::spawn(move || read_response(s)))
        .collect();
    readers.into_iter().map(|r| r.join().unwrap()).collect()
}

/// `client`'s limiter keys (not the markers of refunds applied once: `:once:`).
fn bucket_keys(redis: &RedisServer, client: &str) -> Vec<String> {
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("turnstile:{{{client}}}:*")]);
    keys.into_iter().filter(|k| !k.contains(":once:")).collect()
}

/// The backlog Redis holds for `client`'s bucket (request·ms, as last stored; `None` once
/// the bucket has drained and expired).
fn level(redis: &RedisServer, client: &str) -> Option<u64> {
    let keys = bucket_keys(redis, client);
    assert!(keys.len() <= 1, "one bucket: {keys:?}");
    // "<level> <updated>[ <turn> …]"
    let bucket: Option<String> = redis.cmd(&["GET", keys.first()?]);
    bucket?.split(' ').next()?.parse().ok()
}

/// The turns given back that `client`'s bucket remembers.
fn holes(redis: &RedisServer, client: &str) -> usize {
    let keys = bucket_keys(redis, client);
    let Some(key) = keys.first() else { return 0 };
    let bucket: Option<String> = redis.cmd(&["GET", key]);
    bucket.map_or(0, |b| b.split_whitespace().skip(2).count())
}

fn admitted(gw: &Gateway) -> f64 {
    gw.metric(
        "turnstile_limiter_decisions_total",
        &[
            ("route", "orders"),
            ("policy", "smooth"),
            ("outcome", "allowed"),
        ],
    )
}

/// Thirty requests sent at once, spread over `gws`, for a bucket of 2 per second (a turn
/// every 500 ms) with a burst of 5: one passes, five are held and let out one turn apart,
/// the other 24 are refused. (2/s rather than the issue's 10/s: a turn stays far longer
/// than the scheduling jitter of a loaded 2-core machine, so the spacing is the bucket's.)
fn a_burst_reaches_the_upstream_at_the_rate(store: &str, instances: usize) {
    let up = Upstream::start("orders");
    let text = config_on(&up, store, "", &[("burst", 2, "1s", 5)]);
    let gws: Vec<Gateway> = (0..instances).map(|_| Gateway::start(&text)).collect();
    let ports: Vec<u16> = gws.iter().map(|gw| gw.port).collect();
    let responses = at_once(&ports, 30, "burst");
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        6,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        24,
        "{statuses:?}"
    );
    for r in responses.iter().filter(|r| r.status == 429) {
        assert!(r.header("retry-after").is_some());
        assert!(r.header("x-turnstile-delay-ms").is_none());
    }
    let held = responses
        .iter()
        .filter(|r| r.status == 200 && r.header("x-turnstile-delay-ms").is_some())
        .count();
    assert_eq!(held, 5, "all but the first waited their turn");
    // The upstream got them one turn (500 ms) apart: held requests are let out by timers
    // that never fire early, so only the forwarding's own jitter (allowed up to half a
    // turn) can bring two closer, and the k-th is at least k - 1/2 turns after the first.
    let mut arrivals = up.arrivals();
    arrivals.sort_unstable();
    assert_eq!(arrivals.len(), 6, "{arrivals:?}");
    for pair in arrivals.windows(2) {
        assert!(pair[1] - pair[0] >= 250, "arrivals too close: {arrivals:?}");
    }
    for (k, t) in arrivals.iter().enumerate().skip(1) {
        assert!(t - arrivals[0] >= k as u64 * 500 - 250, "{arrivals:?}");
    }
    let delayed: f64 = gws
        .iter()
        .map(|gw| gw.metric("turnstile_delay_seconds_count", &[("route", "orders")]))
        .sum();
    assert_eq!(delayed, 5.0);
}

#[test]
fn a_burst_through_three_gateways_on_redis_reaches_the_upstream_at_the_rate() {
    let redis = RedisServer::start();
    a_burst_reaches_the_upstream_at_the_rate(&redis_store(&redis), 3);
}

#[test]
fn a_burst_through_three_gateways_on_a_redis_cluster_reaches_the_upstream_at_the_rate() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!(
        "[store]\nkind = \"redis_cluster\"\nnodes = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    );
    a_burst_reaches_the_upstream_at_the_rate(&store, 3);
}

#[test]
fn a_burst_through_the_memory_store_reaches_the_upstream_at_the_rate() {
    a_burst_reaches_the_upstream_at_the_rate("[store]\nkind = \"memory\"", 1);
}

/// With Redis unreachable, a route whose failure mode is `local` shapes in process: the
/// bucket divided by the instances expected (2 per second → 1 per second, burst 2 → 1).
#[test]
fn the_local_failure_mode_holds_requests_in_process() {
    let up = Upstream::start("orders");
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"200ms\"\nexpected_instances = 2",
        common::free_port()
    );
    let text = config_on(
        &up,
        &store,
        "on_store_error = \"local\"",
        &[("down", 2, "1s", 2)],
    );
    let gw = Gateway::start(&text);
    let a = gw.get_with("/orders", &[("X-Api-Key", &key("down"))]);
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a.header("x-turnstile-delay-ms").is_none());
    let port = gw.port;
    let b = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&request("down")).unwrap();
        read_response(s)
    });
    let local = || {
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[
                ("route", "orders"),
                ("policy", "smooth"),
                ("outcome", "local_fallback"),
            ],
        )
    };
    wait_until("B decided", || local() >= 2.0);
    let c = gw.get_with("/orders", &[("X-Api-Key", &key("down"))]);
    assert_eq!(c.status, 429, "{}", c.text());
    let b = b.join().unwrap();
    assert_eq!(b.status, 200, "{}", b.text());
    assert!(
        b.header("x-turnstile-delay-ms").is_some(),
        "B waited its turn"
    );
    assert_eq!(up.served(), 2);
}

/// Sends `client`'s request A (passes) then B (held), lets `leave` end B while it waits,
/// and checks B's turn was given back: C takes it (held), D right after it is refused (the
/// bucket is as full as before B left), and the upstream sees A and C only.
fn a_client_that_leaves_gives_its_turn_back(
    gw: &Gateway,
    up: &Upstream,
    redis: &RedisServer,
    client: &str,
    leave: impl FnOnce(&Gateway, &dyn Fn() -> bool),
) {
    let served = up.served();
    let before = admitted(gw);
    let a = gw.get_with("/orders", &[("X-Api-Key", &key(client))]);
    assert_eq!(a.status, 200, "{}", a.text());
    let b_counted = || admitted(gw) >= before + 2.0;
    leave(gw, &b_counted);
    // B's turn, given back, is remembered for the next request.
    wait_until("B's turn given back", || holes(redis, client) == 1);
    let port = gw.port;
    let c_request = request(client);
    let c = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&c_request).unwrap();
        read_response(s)
    });
    wait_until("C admitted", || admitted(gw) >= before + 3.0);
    assert_eq!(holes(redis, client), 0, "C took B's turn");
    let d = gw.get_with("/orders", &[("X-Api-Key", &key(client))]);
    assert_eq!(d.status, 429, "the bucket is full again: {}", d.text());
    let c = c.join().unwrap();
    assert_eq!(c.status, 200, "{}", c.text());
    assert!(c.header("x-turnstile-delay-ms").is_some(), "C waited");
    assert_eq!(up.served() - served, 2, "B was never forwarded");
}

#[test]
fn a_client_leaving_while_held_gives_its_turn_back_on_http1_and_http2() {
    let up = Upstream::start("orders");
    let redis = RedisServer::start();
    // One per 4 s, one may wait: B waits about 4 s unless it leaves.
    let text = config(&up, &redis, &[("h1", 1, "4s", 1), ("h2", 1, "4s", 1)]);
    let gw = Gateway::start_with("h2c = true", &text);

    // HTTP/1: B's connection is closed while it waits.
    a_client_that_leaves_gives_its_turn_back(&gw, &up, &redis, "h1", |gw, counted| {
        let mut b = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
        b.write_all(&request("h1")).unwrap();
        wait_until("B admitted", counted);
        drop(b);
    });

    // HTTP/2: B's stream is reset (the connection stays).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = gw.port;
    let (client, conn) = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        h2::client::handshake(tcp).await.unwrap()
    });
    let conn = rt.spawn(conn);
    a_client_that_leaves_gives_its_turn_back(&gw, &up, &redis, "h2", |_, counted| {
        let (response, send) = rt.block_on(async {
            let mut client = client.clone().ready().await.unwrap();
            let req = http::Request::builder()
                .uri(format!("http://127.0.0.1:{port}/orders"))
                .header("x-api-key", key("h2"))
                .body(())
                .unwrap();
            client.send_request(req, true).unwrap()
        });
        // Let the connection's task run while B is decided.
        rt.block_on(async {
            while !counted() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        // Dropping an unfinished stream's handles resets it (RST_STREAM CANCEL).
        drop((response, send));
        rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(50)).await });
    });
    drop(client);
    conn.abort();
}

#[test]
fn beyond_max_delayed_waiting_requests_get_503_before_they_are_counted() {
    let up = Upstream::start("orders");
    let redis = RedisServer::start();
    // One per 3 s, up to 20 may wait in the store; this instance holds at most two.
    let text = config(&up, &redis, &[("busy", 1, "3s", 20)]);
    let gw = Gateway::start_with("max_delayed = 2\nmax_delayed_per_client = 2", &text);
    // A flood of 15 at once. The first counted passes (its place freed at once); at most two
    // are held; every other finds no place and is refused before the store counts it.
    let responses = at_once(&[gw.port], 15, "busy");
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let held = responses
        .iter()
        .filter(|r| r.status == 200 && r.header("x-turnstile-delay-ms").is_some())
        .count();
    // The first two always find a place: one passes, the other is held.
    assert!((1..=2).contains(&held), "{statuses:?}");
    assert_eq!(ok, held + 1, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 503).count(),
        15 - ok,
        "{statuses:?}"
    );
    for r in responses.iter().filter(|r| r.status == 503) {
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // Only the forwarded were counted: the backlog is at most their turns.
    let l = level(&redis, "busy").unwrap_or(0);
    assert!(l <= ok as u64 * 3000, "level {l} for {ok} counted");
    assert_eq!(up.served(), ok as u64);
}

/// `n` requests from `source` (a loopback address: another caller), with the headers each
/// of them gets from `headers(i)`, on raw connections, written `pace` apart; their responses.
fn sent_from(
    port: u16,
    source: std::net::Ipv4Addr,
    n: usize,
    pace: std::time::Duration,
    headers: impl Fn(usize) -> String,
) -> Vec<std::thread::JoinHandle<common::http::Response>> {
    let mut streams: Vec<TcpStream> = (0..n)
        .map(|_| {
            let socket =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket
                .bind(&std::net::SocketAddr::from((source, 0)).into())
                .unwrap();
            socket
                .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
                .unwrap();
            socket.into()
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let req = format!(
            "GET /orders HTTP/1.1\r\nHost: t\r\n{}Connection: close\r\n\r\n",
            headers(i)
        );
        s.write_all(req.as_bytes()).unwrap();
        std::thread::sleep(pace);
    }
    streams
        .into_iter()
        .map(|s| std::thread::spawn(move || read_response(s)))
        .collect()
}

/// One caller cannot take every place an instance holds for leaky buckets: 72 requests from
/// one address over 12 made-up users (a limit keyed on `X-User`) hold at most its share
/// (`max_delayed_per_client`, a quarter of `max_delayed` by default: 5 of 20), the rest of its
/// requests are refused with 429, and another caller — whose own bucket is empty — is served
/// and held as usual (before: 503 for everyone once the 20 places were full). An API key is
/// held to the same share from any address.
#[test]
fn one_caller_holds_at_most_its_share_of_the_held_places() {
    let up = Upstream::start("orders");
    let redis = RedisServer::start();
    let text = format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[[routes]]
name = "public"
path_prefix = "/orders"
upstream = "orders"

[[routes.limits]]
name = "per-user"
algorithm = "leaky_bucket"
limit = 1
window = "2s"
burst = 5
key = ["header:x-user"]

{store}
"#,
        addr = up.addr(),
        store = redis_store(&redis),
    );
    let gw = Gateway::start_with(
        "max_delayed = 20\nkey_hash_secret = \"leaky-share-test-secret-0123456789\"",
        &text,
    );
    // The flood, user after user (each user's first passes, the next five would be held).
    let pace = std::time::Duration::from_millis(20);
    let flood = sent_from(gw.port, [127, 0, 0, 2].into(), 72, pace, |i| {
        format!("X-User: made-up-{}\r\n", i / 6)
    });
    // While the flood is held, another caller is served: its first request at once, its
    // second held its turn.
    let alice = sent_from(gw.port, [127, 0, 0, 3].into(), 2, pace, |_| {
        "X-User: alice\r\n".to_owned()
    });
    let alice: Vec<common::http::Response> = alice.into_iter().map(|h| h.join().unwrap()).collect();
    for r in &alice {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        alice
            .iter()
            .filter(|r| r.header("x-turnstile-delay-ms").is_some())
            .count(),
        1,
        "alice's second request waited its turn"
    );
    let flood: Vec<common::http::Response> = flood.into_iter().map(|h| h.join().unwrap()).collect();
    let held = flood
        .iter()
        .filter(|r| r.status == 200 && r.header("x-turnstile-delay-ms").is_some())
        .count();
    assert!(held <= 5, "the caller's share: {held} held");
    assert!(
        flood.iter().all(|r| r.status == 200 || r.status == 429),
        "{:?}",
        flood.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(flood.iter().any(|r| r.status == 429
        && r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("this client's requests")));
}

/// A held request with a body whose client leaves (the body never sent) gives its place
/// back, like a bodiless one: 30 such requests from callers that left, three places, and
/// every next one still finds a place (before, a request with a body was never watched: it
/// kept its place for its whole turn, and the callers after it got 503).
#[test]
fn a_held_request_with_a_body_whose_client_left_gives_its_place_back() {
    let up = Upstream::start("orders");
    let redis = RedisServer::start();
    // One per minute, up to 30 wait: a held request waits long unless its client leaves.
    let text = config(&up, &redis, &[("posts", 1, "60s", 30)]);
    let gw = Gateway::start_with("max_delayed = 3\nmax_delayed_per_client = 3", &text);
    let post = format!(
        "POST /orders HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nContent-Length: 100\r\nConnection: close\r\n\r\n",
        key("posts")
    );
    let first = gw.get_with("/orders", &[("X-Api-Key", &key("posts"))]);
    assert_eq!(first.status, 200);
    // A request with a body that never comes, held (no answer yet); 503 while every place
    // is taken, tried again.
    let hold_one = |round: usize| -> TcpStream {
        for _ in 0..100 {
            let mut probe = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            probe.write_all(post.as_bytes()).unwrap();
            probe
                .set_read_timeout(Some(std::time::Duration::from_millis(500)))
                .unwrap();
            let mut answer = Vec::new();
            let _ = probe.read_to_end(&mut answer);
            if answer.is_empty() {
                return probe;
            }
            let status = common::http::parse(&answer).map_or(0, |(r, _)| r.status);
            assert_eq!(
                status, 503,
                "round {round}: only 503 is answered at once here"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("round {round}: no place came back");
    };
    for round in 0..10 {
        let held: Vec<TcpStream> = (0..3).map(|_| hold_one(round)).collect();
        // Their clients leave.
        drop(held);
    }
    assert_eq!(up.served(), 1, "no held request was forwarded");
}
