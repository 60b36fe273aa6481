//! When Redis is slow or gone: per-route fail-open / fail-closed / local fallback, the call
//! timeout, the circuit breaker, recovery. Real redis-server processes are killed, frozen
//! (SIGSTOP), restarted empty, or made to refuse writes. Assertions count requests and store
//! calls (from /metrics), never time.

use crate::common;

use common::redis::RedisServer;
use common::{http, wait_until, Gateway, Upstream};

const ADA: &str = "ada-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const CAROL: &str = "carol-key-0123456789abcde";

/// Three routes, one per failure mode, all with a plan of 10 per day (nothing refills).
fn config(up: &Upstream, store_url: &str, store_extra: &str) -> String {
    let route = |name: &str, mode: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"/echo/{name}\"\nupstream = \"orders\"\nauth = \"api_key\"\non_store_error = \"{mode}\"\n"
        )
    };
    format!(
        r#"
[store]
kind = "redis"
url = "{store_url}"
timeout = "200ms"
heartbeat_interval = "100ms"
{store_extra}

[upstreams.orders]
servers = ["{addr}"]

[plans.daily]
limits = [{{ name = "per-day", algorithm = "token_bucket", limit = 10, window = "1d" }}]

[[clients]]
id = "ada"
plan = "daily"
api_keys = ["{ADA}"]

[[clients]]
id = "bob"
plan = "daily"
api_keys = ["{BOB}"]

[[clients]]
id = "carol"
plan = "daily"
api_keys = ["{CAROL}"]

{open}
{closed}
{local}
"#,
        addr = up.addr(),
        open = route("open", "fail_open"),
        closed = route("closed", "fail_closed"),
        local = route("local", "local"),
    )
}

fn get(gw: &Gateway, path: &str, key: &str) -> http::Response {
    gw.get_with(path, &[("X-Api-Key", key)])
}

fn statuses(gw: &Gateway, path: &str, key: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| get(gw, path, key).status).collect()
}

fn count(list: &[u16], status: u16) -> usize {
    list.iter().filter(|s| **s == status).count()
}

fn decisions(gw: &Gateway, route: &str, outcome: &str) -> f64 {
    gw.metric(
        "turnstile_limiter_decisions_total",
        &[
            ("route", route),
            ("policy", "per-day"),
            ("outcome", outcome),
        ],
    )
}

fn store_failures(gw: &Gateway) -> f64 {
    ["timeout", "unavailable", "refused", "protocol"]
        .iter()
        .map(|r| gw.metric("turnstile_store_calls_total", &[("result", r)]))
        .sum()
}

fn assert_no_panic(gw: &Gateway) {
    let log = gw.proc.log_text();
    assert!(!log.contains("panicked"), "the gateway panicked:\n{log}");
}

#[test]
fn killing_redis_mid_traffic_applies_each_routes_failure_mode() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("a");
    let text = config(
        &up,
        &redis.url(),
        "breaker_failures = 3\nbreaker_cooldown = \"1h\"",
    );
    let a = Gateway::start(&text);
    let b = Gateway::start(&text);
    // Both instances announce themselves: each learns that two are alive.
    wait_until("both gateways to see two live instances", || {
        a.metric("turnstile_live_instances", &[]) == 2.0
            && b.metric("turnstile_live_instances", &[]) == 2.0
    });
    assert_eq!(statuses(&a, "/echo/open", ADA, 3), [200, 200, 200]);
    assert_eq!(decisions(&a, "open", "allowed"), 3.0);

    redis.kill();

    // fail_open: every request is admitted, none fails, each degraded decision is counted.
    let open = statuses(&a, "/echo/open", ADA, 20);
    assert_eq!(count(&open, 200), 20, "{open:?}");
    assert_eq!(decisions(&a, "open", "degraded_open"), 20.0);

    // fail_closed: 503 limiter-unavailable (not 429), with a short Retry-After.
    let resp = get(&a, "/echo/closed", ADA);
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(
        resp.json()["type"],
        "https://turnstile.dev/problems/limiter-unavailable"
    );
    assert_eq!(resp.header("retry-after"), Some("1"));
    assert_eq!(statuses(&a, "/echo/closed", ADA, 4), [503; 4]);
    assert_eq!(decisions(&a, "closed", "degraded_closed"), 5.0);

    // local: the in-process fallback limits at 10 / 2 live instances = 5 per client.
    let local = statuses(&a, "/echo/local", BOB, 8);
    assert_eq!(local, [200, 200, 200, 200, 200, 429, 429, 429]);
    let resp = get(&a, "/echo/local", BOB);
    assert_eq!(resp.status, 429);
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some(r#""per-day";q=5;w=86400"#)
    );
    assert_eq!(decisions(&a, "local", "local_fallback"), 9.0);

    // The breaker opened after 3 failed calls: everything after went straight to the mode.
    assert_eq!(store_failures(&a), 3.0);
    assert_eq!(
        a.metric("turnstile_circuit_breaker_state", &[("state", "open")]),
        1.0
    );
    assert_eq!(
        a.metric("turnstile_store_short_circuits_total", &[]),
        20.0 + 5.0 + 9.0 - 3.0
    );
    assert_no_panic(&a);
    assert_no_panic(&b);
}

#[test]
fn a_frozen_redis_costs_at_most_the_timeout_and_then_nothing() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &redis.url(),
        "breaker_failures = 3\nbreaker_cooldown = \"1h\"",
    ));
    assert_eq!(get(&gw, "/echo/open", ADA).status, 200);
    assert_eq!(
        gw.metric("turnstile_store_calls_total", &[("result", "ok")]),
        1.0
    );

    // SIGSTOP: connections stay open, nothing answers. Each request waits at most the
    // 200 ms timeout (the test client would fail after 30 s of hanging)...
    redis.freeze();
    let open = statuses(&gw, "/echo/open", ADA, 10);
    assert_eq!(open, [200; 10]);
    // ...and only the first three reached the store: then the breaker opened and the rest
    // did not wait at all.
    assert_eq!(store_failures(&gw), 3.0);
    assert_eq!(gw.metric("turnstile_store_short_circuits_total", &[]), 7.0);
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "open")]),
        1.0
    );
    assert_eq!(
        gw.metric(
            "turnstile_circuit_breaker_transitions_total",
            &[("to", "open")]
        ),
        1.0
    );
    let closed = statuses(&gw, "/echo/closed", ADA, 3);
    assert_eq!(closed, [503; 3]);
    assert_eq!(gw.metric("turnstile_store_short_circuits_total", &[]), 10.0);
    assert_eq!(store_failures(&gw), 3.0);
    redis.thaw();
    assert_no_panic(&gw);
}

/// The breaker counts calls to Redis, and a batch is one call: a burst of concurrent
/// decisions behind a frozen Redis — two sent at once (`batch_in_flight`), the rest queued and
/// sent as one batch — counts about three timeouts, not one per decision, so a breaker that
/// opens after six stays closed through a burst of twelve; it still opens once calls (not
/// decisions) have failed six times in a row.
#[test]
fn a_frozen_batch_counts_once_toward_the_breaker() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(
        &config(
            &up,
            &redis.url(),
            "breaker_failures = 6\nbreaker_cooldown = \"1h\"",
        )
        .replace("timeout = \"200ms\"", "timeout = \"1s\""),
    );
    let port = gw.port;
    let burst = || {
        let threads: Vec<_> = (0..12)
            .map(|i| {
                std::thread::spawn(move || {
                    let key = [ADA, BOB, CAROL][i % 3];
                    http::get_with(port, "/echo/open", &[("X-Api-Key", key)]).status
                })
            })
            .collect();
        let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(statuses, [200; 12], "fail_open answers every decision");
    };
    let open = || gw.metric("turnstile_circuit_breaker_state", &[("state", "open")]);
    assert_eq!(get(&gw, "/echo/open", ADA).status, 200);
    redis.freeze();
    burst();
    assert_eq!(store_failures(&gw), 12.0, "every decision failed");
    assert!(
        gw.metric("turnstile_store_batched_decisions_total", &[]) >= 2.0,
        "the queued decisions went as a batch"
    );
    assert_eq!(
        open(),
        0.0,
        "twelve failed decisions in a few calls opened the breaker"
    );
    let mut bursts = 1;
    while open() == 0.0 && bursts < 6 {
        burst();
        bursts += 1;
    }
    assert_eq!(
        open(),
        1.0,
        "{bursts} bursts of failed calls never opened the breaker"
    );
    redis.thaw();
    assert_no_panic(&gw);
}

/// Decisions queued behind a frozen Redis (batched with others while a call is in flight)
/// each end by their own route's failure mode: under concurrent traffic on a fail-open and a
/// fail-closed route at once, every open answer is 200 and every closed one 503 — none waits
/// past its timeout for another's — and after the thaw both routes are decided again.
#[test]
fn a_frozen_redis_fails_queued_decisions_each_by_its_own_routes_mode() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &redis.url(),
        "breaker_failures = 100000\nbreaker_cooldown = \"1h\"",
    ));
    let port = gw.port;
    let burst = |path: &'static str| {
        std::thread::spawn(move || {
            (0..3)
                .map(|i| {
                    let key = [ADA, BOB, CAROL][i % 3];
                    http::get_with(port, path, &[("X-Api-Key", key)]).status
                })
                .collect::<Vec<u16>>()
        })
    };
    assert_eq!(get(&gw, "/echo/open", ADA).status, 200);
    redis.freeze();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            burst(if t % 2 == 0 {
                "/echo/open"
            } else {
                "/echo/closed"
            })
        })
        .collect();
    let answers: Vec<Vec<u16>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    redis.thaw();
    for (t, statuses) in answers.iter().enumerate() {
        let expected = if t % 2 == 0 { 200 } else { 503 };
        assert_eq!(statuses, &[expected; 3], "thread {t}");
    }
    println!(
        "batches while frozen: {} ({} decisions)",
        gw.metric("turnstile_store_batches_total", &[]),
        gw.metric("turnstile_store_batched_decisions_total", &[])
    );
    // Decided again (200, or 429 once what Redis ran after the thaw spent the budget).
    wait_until("the fail-closed route decided again", || {
        get(&gw, "/echo/closed", BOB).status != 503
    });
    assert_no_panic(&gw);
}

#[test]
fn limiting_resumes_by_itself_after_redis_restarts_empty() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &redis.url(),
        "breaker_failures = 2\nbreaker_cooldown = \"200ms\"",
    ));
    assert_eq!(get(&gw, "/echo/closed", ADA).status, 200);

    redis.kill();
    assert_eq!(statuses(&gw, "/echo/closed", ADA, 3), [503; 3]);
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "open")]),
        1.0
    );

    // A new, empty Redis (no data, no scripts loaded) on the same port.
    redis.restart();
    wait_until("limiting to resume after the restart", || {
        get(&gw, "/echo/closed", CAROL).status == 200
    });
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "closed")]),
        1.0
    );
    assert!(
        gw.metric(
            "turnstile_circuit_breaker_transitions_total",
            &[("to", "closed")]
        ) >= 1.0
    );
    // The script was loaded again (NOSCRIPT handled) and limits are exact again: carol has
    // used one or more of her 10 while waiting; the rest are admitted, then 429.
    let carol = statuses(&gw, "/echo/closed", CAROL, 12);
    assert!(
        count(&carol, 200) <= 9 && count(&carol, 429) >= 3,
        "{carol:?}"
    );
    assert!(carol.iter().all(|s| *s == 200 || *s == 429), "{carol:?}");
    let sha = redis::Script::new(turnstile::limit::store::redis::scripts::CHECK_SOURCE)
        .get_hash()
        .to_owned();
    let loaded: Vec<i64> = redis.cmd(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(loaded, [1]);
    // bob, untouched so far, gets exactly his 10.
    let bob = statuses(&gw, "/echo/closed", BOB, 12);
    assert_eq!((count(&bob, 200), count(&bob, 429)), (10, 2));
    assert_no_panic(&gw);
}

fn connection(gw: &Gateway) -> (String, u64) {
    let store = &gw.admin("/readyz").json()["store"];
    (
        store["connection"].as_str().unwrap_or("").to_owned(),
        store["connection_repairs"].as_u64().unwrap_or(0),
    )
}

/// Redis comes back while the breaker is open (for an hour): the gateway notices by itself
/// (its own ping through the connection requests use), closes the breaker, and from then
/// on no request fails — none probes a stale connection.
#[test]
fn after_a_restart_the_request_connection_is_repaired_before_requests_need_it() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(
        &up,
        &redis.url(),
        "breaker_failures = 2\nbreaker_cooldown = \"1h\"",
    ));
    assert_eq!(get(&gw, "/echo/closed", ADA).status, 200);
    redis.kill();
    assert_eq!(statuses(&gw, "/echo/closed", ADA, 3), [503; 3]);
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "open")]),
        1.0
    );
    redis.restart();
    wait_until("the gateway to repair its connection", || {
        connection(&gw) == ("up".to_owned(), 1)
    });
    let after = statuses(&gw, "/echo/closed", BOB, 10);
    assert_eq!(
        after, [200; 10],
        "no request fails once Redis answered the gateway"
    );
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "closed")]),
        1.0
    );
    assert_no_panic(&gw);
}

/// Redis restarts between requests (no request saw it down, the breaker never opened): the
/// dropped connection reports itself and is made anew, so the next request does not fail.
#[test]
fn a_restart_between_requests_costs_no_request() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &redis.url(), "breaker_failures = 100"));
    assert_eq!(get(&gw, "/echo/closed", ADA).status, 200);
    for round in 1..=3 {
        // The first request right after Redis is back: answered.
        redis.restart();
        assert_eq!(
            statuses(&gw, "/echo/closed", ADA, 2),
            [200, 200],
            "round {round}"
        );
        assert_eq!(connection(&gw), ("up".to_owned(), round));
    }
    assert_eq!(store_failures(&gw), 0.0);
    assert_no_panic(&gw);
}

#[test]
fn a_redis_refused_or_unreachable_at_startup_does_not_stop_the_gateway() {
    let up = Upstream::start("a");
    let refused = format!("redis://127.0.0.1:{}", common::free_port());
    // 192.0.2.0/24 is TEST-NET-1: never routed, so connecting either fails or times out.
    for url in [refused.as_str(), "redis://192.0.2.1:6379"] {
        let gw = Gateway::start(&config(
            &up,
            url,
            "expected_instances = 2\nbreaker_failures = 2\nstartup_grace = \"1s\"",
        ));
        assert_eq!(statuses(&gw, "/echo/open", ADA, 5), [200; 5], "{url}");
        assert_eq!(statuses(&gw, "/echo/closed", ADA, 2), [503; 2], "{url}");
        // Never heard a heartbeat: the fallback divides by expected_instances.
        let local = statuses(&gw, "/echo/local", BOB, 7);
        assert_eq!(local, [200, 200, 200, 200, 200, 429, 429], "{url}");
        assert_eq!(gw.metric("turnstile_live_instances", &[]), 0.0);
        // Unready while the store warms, for its startup grace; then ready: every route
        // has decided what to do without the store.
        wait_until("ready after the startup grace", || {
            gw.admin("/readyz").status == 200
        });
        let ready = gw.admin("/readyz");
        assert_eq!(ready.json()["store"]["reachable"], false);
        assert_no_panic(&gw);
    }
}

/// A heartbeat that failed (Redis down when the gateway started) is tried again within a
/// second, not a whole `heartbeat_interval` later: the instance is registered soon after
/// Redis answers.
#[test]
fn a_failed_heartbeat_is_tried_again_soon() {
    let mut redis = RedisServer::start();
    redis.kill();
    let up = Upstream::start("a");
    let text = config(&up, &redis.url(), "startup_grace = \"1s\"").replace(
        "heartbeat_interval = \"100ms\"",
        "heartbeat_interval = \"1h\"",
    );
    let gw = Gateway::start(&text);
    wait_until("ready after the startup grace", || {
        gw.admin("/readyz").status == 200
    });
    redis.restart();
    wait_until("the gateway registered in Redis", || {
        let members: Vec<String> = redis.cmd(&["ZRANGE", "turnstile:instances", "0", "-1"]);
        members.len() == 1
    });
    assert_no_panic(&gw);
}

#[test]
fn errors_redis_answers_with_are_not_treated_as_allowed() {
    let redis = RedisServer::start();
    let up = Upstream::start("a");
    let gw = Gateway::start(&config(&up, &redis.url(), "breaker_failures = 2"));
    assert_eq!(get(&gw, "/echo/closed", ADA).status, 200);

    // A key of the wrong type where carol's counter lives: the script fails for her only.
    let key = "turnstile:{carol}:closed:per-day@tb2:10/86400000/10";
    let _: String = redis.cmd(&["SET", key, "not-a-bucket"]);
    let resp = get(&gw, "/echo/closed", CAROL);
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert!(gw.metric("turnstile_store_calls_total", &[("result", "refused")]) >= 1.0);
    // Not an outage: the breaker stays closed and other clients are limited normally.
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "closed")]),
        1.0
    );
    assert_eq!(get(&gw, "/echo/closed", ADA).status, 200);

    // Out of memory under noeviction: every write is refused.
    let _: String = redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: String = redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let closed = statuses(&gw, "/echo/closed", BOB, 3);
    assert_eq!(closed, [503; 3]);
    let open = statuses(&gw, "/echo/open", BOB, 3);
    assert_eq!(open, [200; 3]);
    assert_eq!(decisions(&gw, "open", "degraded_open"), 3.0);
    assert!(gw.metric("turnstile_store_calls_total", &[("result", "refused")]) >= 7.0);
    assert_eq!(
        gw.metric("turnstile_circuit_breaker_state", &[("state", "closed")]),
        1.0
    );
    assert!(
        gw.proc.log_text().contains("limiter store failing"),
        "degraded decisions are logged"
    );
    assert_no_panic(&gw);
}
