//! What happens after a decision, through stalls, breakers and restarts (a real redis-server
//! paused, frozen, its scripts flushed, restarted): no concurrency slot left behind, every
//! charge applied exactly once, decisions never starved by the calls that follow them.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};
use std::time::Duration;

const ADA: &str = "after-ada-key-0123456789abcdef";
const BOB: &str = "after-bob-key-0123456789abcdef";

/// `ada` on a plan of `max_concurrent` slots, `bob` on a plan without; two routes, one per
/// failure mode; `store_extra` in `[store]` (a slot that leaked lives 10 minutes, far longer
/// than these tests).
fn config(up: &Upstream, redis: &RedisServer, store_extra: &str, max_concurrent: u32) -> String {
    let route = |name: &str, mode: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"/echo/{name}\"\nupstream = \"orders\"\nauth = \"api_key\"\non_store_error = \"{mode}\"\n"
        )
    };
    format!(
        r#"
[store]
kind = "redis"
url = "{url}"
concurrency_slot_ttl = "10m"
heartbeat_interval = "10s"
{store_extra}

[upstreams.orders]
servers = ["{addr}"]

[plans.slots]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 100000, window = "1h" }}]
max_concurrent = {max_concurrent}

[plans.plain]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 100000, window = "1h" }}]

[[clients]]
id = "ada"
plan = "slots"
api_keys = ["{ADA}"]

[[clients]]
id = "bob"
plan = "plain"
api_keys = ["{BOB}"]

{open}
{closed}
"#,
        url = redis.url(),
        addr = up.addr(),
        open = route("open", "fail_open"),
        closed = route("closed", "fail_closed"),
    )
}

fn get(gw: &Gateway, path: &str, key: &str) -> u16 {
    gw.get_with(path, &[("X-Api-Key", key)]).status
}

/// `n` requests of `key` at once, each answered after the upstream's delay; their statuses.
fn at_once(gw: &Gateway, path: &str, key: &'static str, n: usize) -> Vec<u16> {
    sent_at_once(gw.port, path, key, n).join().unwrap()
}

/// `n` requests of `key` sent at once, from a thread; it ends with their statuses, sorted.
fn sent_at_once(
    port: u16,
    path: &str,
    key: &'static str,
    n: usize,
) -> std::thread::JoinHandle<Vec<u16>> {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || {
                    http::get_with(port, &path, &[("X-Api-Key", key)]).status
                })
            })
            .collect();
        let mut statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        statuses.sort_unstable();
        statuses
    })
}

/// The slots `ada` holds in Redis now.
fn slots_held(redis: &RedisServer) -> i64 {
    let keys: Vec<String> = redis.cmd(&["KEYS", "*{ada}*concurrency*"]);
    keys.iter().map(|k| redis.cmd::<i64>(&["ZCARD", k])).sum()
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Pauses every client of `redis` for `ms`, from a thread (the test's own command waits too).
fn pause(redis: &RedisServer, ms: u64) {
    let _: String = redis.cmd(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
}

/// The stalled checks of a burst that opened the breaker took their slots when Redis woke;
/// a release sent for them (unanswered checks) that fails — cut at the store timeout while
/// the connection is marked lost, or refused by an open breaker — is sent again until
/// acknowledged: every slot comes back, and the client gets its two.
#[test]
fn slots_taken_by_stalled_checks_are_released_though_the_breaker_opened() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &redis, "timeout = \"50ms\"", 2));
    assert_eq!(get(&gw, "/echo/closed/warm", ADA), 200);
    // Redis itself asleep (it answers nobody, its connections stay open).
    let url = redis.url();
    let asleep = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query::<String>(&mut c)
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(20));
    let during = at_once(&gw, "/echo/closed/x", ADA, 12);
    assert!(during.iter().all(|s| *s == 503), "{during:?}");
    asleep.join().unwrap();
    wait_until("every slot released", || slots_held(&redis) == 0);
    // The breaker closes after its cooldown (bob holds no slots).
    wait_until("the breaker closed", || {
        get(&gw, "/echo/closed/y", BOB) == 200
    });
    up.set_delay(1500);
    assert_eq!(at_once(&gw, "/echo/closed/x", ADA, 3), [200, 200, 429]);
    up.set_delay(0);
}

/// Requests that end while Redis sleeps for 1.5 s, after the breaker opened (bob's
/// decisions, one after another, opened it, and the connection is marked lost): a release
/// waits for the repair under way, which fails while Redis sleeps (it is bounded by ~0.6 s)
/// — and is sent again until Redis answers, not dropped after that one attempt.
#[test]
fn releases_of_requests_ending_during_a_stall_are_sent_again() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &redis, "timeout = \"50ms\"", 2));
    up.set_delay(600);
    let port = gw.port;
    let both = sent_at_once(port, "/echo/closed/x", ADA, 2);
    wait_until("both slots taken", || slots_held(&redis) == 2);
    // Redis asleep for 1.5 s. Bob's decisions time out one by one (five open the breaker,
    // ~0.3 s in); ada's requests end ~0.6 s in, while the repair started when the breaker
    // opened is failing.
    let url = redis.url();
    let asleep = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1.5")
            .query::<String>(&mut c)
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(20));
    let bob: Vec<u16> = (0..8).map(|_| get(&gw, "/echo/closed/y", BOB)).collect();
    assert!(bob.iter().all(|s| *s == 503), "{bob:?}");
    assert_eq!(both.join().unwrap(), [200, 200]);
    asleep.join().unwrap();
    up.set_delay(0);
    wait_until("both slots released", || slots_held(&redis) == 0);
}

/// A release that waited alone in the queue while another call was in flight, sent once
/// Redis had forgotten every script (`SCRIPT FLUSH`): it is sent as `release.lua`, loaded
/// again after `NOSCRIPT` (it was labelled as the decision script, whose loading could not
/// make its SHA known). And after a Redis restart, the connection made again loads the
/// scripts before its first call.
#[test]
fn a_lone_queued_release_after_its_scripts_were_flushed_still_frees_its_slot() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("a");
    // One call in flight at a time, and long enough a timeout for one to outlast the pause.
    let store = "timeout = \"3s\"\nbatch_in_flight = 1";
    let gw = Gateway::start(&config(&up, &redis, store, 1));
    assert_eq!(get(&gw, "/echo/closed/warm", ADA), 200);
    // Its release runs after the response, as a task of its own.
    wait_until("the first slot released", || slots_held(&redis) == 0);
    up.set_delay(700);
    let port = gw.port;
    let holding = std::thread::spawn(move || {
        http::get_with(port, "/echo/closed/a", &[("X-Api-Key", ADA)]).status
    });
    wait_until("ada's slot taken", || slots_held(&redis) == 1);
    let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
    // Redis stops answering; bob's decision takes the connection's only place meanwhile.
    pause(&redis, 1500);
    let bob = std::thread::spawn(move || {
        http::get_with(port, "/echo/closed/b", &[("X-Api-Key", BOB)]).status
    });
    // Ada's request ends (700 ms) during the pause: its release queues behind bob's call.
    assert_eq!(holding.join().unwrap(), 200);
    assert_eq!(bob.join().unwrap(), 200);
    up.set_delay(0);
    wait_until("ada's slot released", || slots_held(&redis) == 0);
    assert_eq!(get(&gw, "/echo/closed/c", ADA), 200);

    // Restarted (empty, no script): the next requests and their releases just work.
    redis.restart();
    let mut statuses = Vec::new();
    wait_until("decided again after the restart", || {
        let status = get(&gw, "/echo/closed/d", ADA);
        statuses.push(status);
        status == 200
    });
    wait_until("the slot released after the restart", || {
        slots_held(&redis) == 0
    });
    assert_eq!(get(&gw, "/echo/closed/e", ADA), 200, "{statuses:?}");
}

/// Redis frozen with two releases in flight: they hold the connection's places no longer
/// than a decision would, so the decisions behind them are sent, time out, and open the
/// breaker (calls short-circuited), as without releases in flight; once Redis thaws, the
/// releases are sent again and the slots come back.
#[test]
fn a_frozen_redis_with_releases_in_flight_opens_the_breaker_for_decisions() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &redis, "timeout = \"50ms\"", 2));
    up.set_delay(300);
    let port = gw.port;
    let both = sent_at_once(port, "/echo/closed/x", ADA, 2);
    wait_until("both slots taken", || slots_held(&redis) == 2);
    redis.freeze();
    assert_eq!(both.join().unwrap(), [200, 200]);
    up.set_delay(0);
    let before = gw.metric("turnstile_store_short_circuits_total", &[]);
    let during: Vec<u16> = (0..30).map(|_| get(&gw, "/echo/closed/y", BOB)).collect();
    assert!(during.iter().all(|s| *s == 503), "{during:?}");
    assert!(
        gw.metric("turnstile_store_short_circuits_total", &[]) > before,
        "the breaker never opened"
    );
    // Eight clients keep calling through the freeze: the queue does not grow without bound.
    let rss_before = rss_kib(gw.proc.pid());
    let flood: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..400 {
                    http::get_with(port, "/echo/closed/y", &[("X-Api-Key", BOB)]);
                }
            })
        })
        .collect();
    flood.into_iter().for_each(|t| t.join().unwrap());
    let grown = rss_kib(gw.proc.pid()).saturating_sub(rss_before);
    assert!(
        grown < 32 * 1024,
        "RSS grew by {grown} KiB during the freeze"
    );
    redis.thaw();
    wait_until("both slots released after the thaw", || {
        slots_held(&redis) == 0
    });
}

/// A response reporting 500 tokens while Redis stalls: its charge times out, runs anyway
/// when Redis wakes, and is sent again — applied once, not once per attempt.
#[test]
fn a_charge_sent_again_after_a_timeout_is_applied_once() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(&up, &redis, "timeout = \"50ms\"", 2).replace(
        "[plans.plain]\nlimits = [{ name = \"per-hour\", algorithm = \"fixed_window\", limit = 100000, window = \"1h\" }]",
        "[plans.plain]\nlimits = [{ name = \"tokens\", algorithm = \"fixed_window\", limit = 1000000, window = \"1h\", cost_from_response = \"header:x-tokens-used\" }]",
    );
    let gw = Gateway::start(&text);
    assert_eq!(get(&gw, "/echo/open/warm?tokens=1", BOB), 200);
    let port = gw.port;
    let slow = std::thread::spawn(move || {
        http::get_with(
            port,
            "/echo/open/x?tokens=500&delay_ms=300",
            &[("X-Api-Key", BOB)],
        )
        .status
    });
    std::thread::sleep(Duration::from_millis(150));
    // The response (at 300 ms) arrives while Redis sleeps for 500: the charge times out.
    pause(&redis, 500);
    assert_eq!(slow.join().unwrap(), 200);
    let key = "turnstile:{bob}:open:tokens@fw1000000/3600000";
    let count = || redis.cmd::<Option<u64>>(&["HGET", key, "c"]).unwrap_or(0);
    // The warm-up's 1 and this request's 500.
    wait_until("the charge counted", || count() >= 501);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(count(), 501, "a charge counted once per attempt");
}
