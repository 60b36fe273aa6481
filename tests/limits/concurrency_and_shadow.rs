//! Concurrency limits and shadow (dry-run) limits, end to end through several gateway
//! processes sharing a real Redis.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use std::io::Write;
use std::net::TcpStream;

const KEY: &str = "advanced-key-0123456789";

fn config(up: &Upstream, redis: &RedisServer, plan: &str, routes: &str) -> String {
    format!(
        r#"
[store]
kind = "redis"
url = "{url}"
timeout = "2s"

[upstreams.orders]
servers = ["{addr}"]

[upstreams.dead]
servers = ["127.0.0.1:{dead}"]

[plans.p]
{plan}

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

{routes}
"#,
        url = redis.url(),
        addr = up.addr(),
        dead = common::free_port(),
    )
}

fn route(name: &str, prefix: &str, upstream: &str, extra: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"{upstream}\"\nauth = \"api_key\"\nread_timeout = \"5s\"\n{extra}\n")
}

fn get(gw: &Gateway, path: &str) -> http::Response {
    gw.get_with(path, &[("X-Api-Key", KEY)])
}

/// A request left running on a raw socket (the upstream delays its answer).
fn start_slow(gw: &Gateway, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Calls `request` until it answers something other than 429, at most 200 times, 50 ms apart
/// (about 10 s or more: well below the 60 s slot lease). Returns every status seen.
fn retry_while_429(mut request: impl FnMut() -> u16) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen.push(request());
        if seen.last() != Some(&429) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    seen
}

#[test]
fn a_concurrency_limit_holds_across_instances_and_slots_come_back() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(
        &up,
        &redis,
        "limits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000, window = \"1h\" }]\nmax_concurrent = 2",
        &[route("echo", "/echo", "orders", ""), route("dead", "/dead", "dead", "")].concat(),
    );
    let a = Gateway::start(&text);
    let b = Gateway::start(&text);

    // Two slow requests, one through each gateway: the client's two slots.
    let slow = [
        start_slow(&a, "/echo/slow?delay_ms=2000"),
        start_slow(&b, "/echo/slow?delay_ms=2000"),
    ];
    wait_until("both slow requests at the upstream", || up.served() == 2);
    for gw in [&a, &b] {
        let resp = get(gw, "/echo/x");
        assert_eq!(resp.status, 429, "{}", resp.text());
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some(r#""per-hour";q=1000;w=3600, "concurrency";q=2;qu="concurrent-requests""#)
        );
        assert!(resp
            .header("ratelimit")
            .unwrap()
            .contains(r#""concurrency";r=0"#));
        assert_eq!(
            resp.json()["violated-policies"],
            serde_json::json!(["concurrency"])
        );
    }
    // When they end, their slots come back.
    drop(slow);
    wait_until("the slots to be released after the responses", || {
        get(&a, "/echo/x").status == 200
    });
    let statuses: Vec<u16> = (0..5).map(|_| get(&b, "/echo/y").status).collect();
    assert_eq!(
        statuses, [200; 5],
        "sequential requests never hold more than one slot"
    );

    // An upstream failure releases the slot too: 502s, never 429s.
    let failures: Vec<u16> = (0..5).map(|_| get(&a, "/dead").status).collect();
    assert_eq!(failures, [502; 5]);
    assert_eq!(get(&a, "/echo/after-failures").status, 200);
}

#[test]
fn a_client_that_disconnects_gives_its_slot_back() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(
        &up,
        &redis,
        "limits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000, window = \"1h\" }]",
        &route("reports", "/echo", "orders", "max_concurrent = 1"),
    );
    let gw = Gateway::start(&text);
    let slow = start_slow(&gw, "/echo/report?delay_ms=1500");
    wait_until("the slow request at the upstream", || up.served() == 1);
    let held = get(&gw, "/echo/other");
    assert_eq!(held.status, 429, "the route's single slot is taken");
    assert_eq!(
        held.json()["violated-policies"],
        serde_json::json!(["route-concurrency"])
    );
    // The client goes away mid-request.
    drop(slow);
    let statuses = retry_while_429(|| get(&gw, "/echo/other").status);
    assert_eq!(
        statuses.last(),
        Some(&200),
        "the abandoned slot: {statuses:?}"
    );
    // Upstream timeouts release it as well.
    let timeout_text = text.replace("read_timeout = \"5s\"", "read_timeout = \"200ms\"");
    let gw2 = Gateway::start(&timeout_text);
    // A slot is released by a task spawned when its request ends, so the next request may
    // briefly still find it taken (429): retry, within far less than the 60 s slot lease
    // after which a leaked slot would come back by itself.
    for _ in 0..3 {
        let statuses = retry_while_429(|| get(&gw2, "/echo/slow?delay_ms=1000").status);
        assert_eq!(statuses.last(), Some(&504), "{statuses:?}");
    }
    let statuses = retry_while_429(|| get(&gw2, "/echo/fast").status);
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
}

#[test]
fn shadow_limits_never_reject_count_globally_and_can_be_switched_on() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let plan = "limits = [\n  { name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000, window = \"1h\" },\n  { name = \"trial\", algorithm = \"fixed_window\", limit = 10, window = \"1h\", shadow = true },\n]";
    let text = config(&up, &redis, plan, &route("echo", "/echo", "orders", ""));
    // `a` reloads on purpose below: no file watcher racing that reload.
    let a = Gateway::start_with("watch_config = false", &text);
    let b = Gateway::start(&text);
    // 30 requests over two gateways: none rejected; the shared count says 20 would have been.
    let mut flagged = 0;
    for i in 0..30 {
        let gw = if i % 2 == 0 { &a } else { &b };
        let resp = get(gw, "/echo/x");
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        // Clients are shown the enforced limit only.
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some(r#""per-hour";q=1000;w=3600"#)
        );
        if let Some(would) = resp.header("x-turnstile-would-limit") {
            assert_eq!(would, "trial");
            flagged += 1;
        }
    }
    assert_eq!(flagged, 20);
    let shadow_rejected = |gw: &Gateway| {
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[
                ("route", "echo"),
                ("policy", "trial"),
                ("outcome", "shadow_rejected"),
            ],
        )
    };
    assert_eq!(shadow_rejected(&a) + shadow_rejected(&b), 20.0);

    // Rolling the limit out: the same definition, enforced. Its count is kept.
    a.rewrite(&text.replace(", shadow = true", ""));
    assert_eq!(a.reload().json()["result"], "applied");
    let resp = get(&a, "/echo/x");
    assert_eq!(resp.status, 429);
    assert_eq!(
        resp.json()["violated-policies"],
        serde_json::json!(["trial"])
    );

    // A whole route in shadow: nothing rejects there, not even the per-IP limit.
    let shadow_route = route(
        "dry",
        "/echo",
        "orders",
        "shadow = true\nip_limit = { rate = \"1/h\", burst = 1 }",
    );
    let c = Gateway::start(&config(
        &up,
        &redis,
        "limits = [{ name = \"tiny\", algorithm = \"fixed_window\", limit = 1, window = \"1h\" }]",
        &shadow_route,
    ));
    let resps: Vec<http::Response> = (0..3).map(|_| get(&c, "/echo/z")).collect();
    assert!(resps.iter().all(|r| r.status == 200));
    assert_eq!(resps[0].header("x-turnstile-would-limit"), None);
    assert_eq!(resps[2].header("x-turnstile-would-limit"), Some("ip, tiny"));
    assert!(
        resps[2].header("ratelimit").is_none(),
        "no quota headers for limits that are not enforced"
    );
}

/// A request that sends its body one byte at a time (every `every`, `bytes` in all) and
/// reads its answer: the status.
fn trickled(
    gw: &Gateway,
    bytes: usize,
    every: std::time::Duration,
) -> std::thread::JoinHandle<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let head = format!(
        "POST /echo/upload HTTP/1.1\r\nHost: x\r\nX-Api-Key: {KEY}\r\nContent-Length: {bytes}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    std::thread::spawn(move || {
        for _ in 0..bytes {
            std::thread::sleep(every);
            if s.write_all(b"x").is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut answer);
        http::parse(&answer).map_or(0, |(r, _)| r.status)
    })
}

/// Every request in flight keeps its slot until it ends, however long it lasts: a body
/// trickled one byte per 0.5 s (9 s) and an answer 12 s slow outlive a 3 s slot three and
/// four times over, and the client's third request is refused all along (before, the slots expired and 8
/// such requests were in flight at once). A crashed instance's slots still free themselves
/// within the slot time to live.
#[test]
fn slots_are_kept_for_as_long_as_requests_last_and_a_crashed_instance_frees_them() {
    use std::time::Duration;
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(
        &up,
        &redis,
        // A large hourly limit: the waits below poll, and every request they admit counts.
        "limits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 1000000, window = \"1h\" }]\nmax_concurrent = 2",
        &route("echo", "/echo", "orders", "").replace("read_timeout = \"5s\"", "read_timeout = \"30s\""),
    )
    .replace("timeout = \"2s\"", "timeout = \"2s\"\nconcurrency_slot_ttl = \"3s\"");
    let a = Gateway::start(&text);
    let b = Gateway::start(&text);
    let slow_body = trickled(&a, 18, Duration::from_millis(500));
    // The answer outlasts the body by 3 s: the loop below ends with the body, and a loaded
    // machine's drift in the body's 18 sleeps must not let the answer end first (its slot
    // freed while the loop still expects both taken: seen under `stress-ng --cpu 2`).
    let slow_answer = start_slow(&a, "/echo/slow?delay_ms=12000");
    wait_until("the slow answer at the upstream", || up.served() >= 1);
    // Both requests last at least 9 s: three slot lives. A third request, through either
    // gateway, is refused the whole time.
    let mut refused = 0;
    while !slow_body.is_finished() {
        let gw = if refused % 2 == 0 { &a } else { &b };
        let resp = get(gw, "/echo/third");
        if slow_body.is_finished() {
            break;
        }
        assert_eq!(
            resp.status,
            429,
            "after {refused} refusals: {}",
            resp.text()
        );
        assert_eq!(
            resp.json()["violated-policies"],
            serde_json::json!(["concurrency"])
        );
        refused += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(slow_body.join().unwrap(), 200);
    assert!(
        refused >= 20,
        "the check ran through the requests' lives: {refused}"
    );
    // The slow answer ends (with its slot kept all along) before the next part: a slot it
    // still held would leave the crashed instance only one (its second request refused).
    let mut slow_answer = slow_answer;
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut slow_answer, &mut answer).unwrap();
    assert_eq!(http::parse(&answer).map_or(0, |(r, _)| r.status), 200);
    let statuses = retry_while_429(|| get(&b, "/echo/after").status);
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");

    // An instance that dies holding both slots: nothing renews them, and they free within
    // their time to live. First every slot free (a finished request's release may reach
    // Redis just after its answer), then the two taken — watched in Redis, not by probing
    // through a gateway, whose probe would itself take a slot for a moment.
    let slots_taken = || -> i64 {
        let keys: Vec<String> = redis.cmd(&["KEYS", "*concurrency*"]);
        keys.iter().map(|k| redis.cmd::<i64>(&["ZCARD", k])).sum()
    };
    wait_until("every slot free", || slots_taken() == 0);
    let mut c = Gateway::start(&text);
    let held = [
        trickled(&c, 1000, Duration::from_millis(200)),
        trickled(&c, 1000, Duration::from_millis(200)),
    ];
    wait_until("both slots taken", || {
        assert!(
            held.iter().all(|h| !h.is_finished()),
            "one of the crashing instance's requests was answered (refused?)"
        );
        slots_taken() == 2
    });
    assert_eq!(get(&b, "/echo/probe").status, 429);
    c.proc.kill();
    let statuses = retry_while_429(|| get(&b, "/echo/after-crash").status);
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    drop(held);
}
