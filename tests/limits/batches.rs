//! Batched decisions (`lua/batch.lua`, `src/limit/store/redis/batch.rs`) decide exactly as
//! one call per request does: held to the Rust reference on random sequences cut at random
//! batch boundaries, with give-backs and charges between them (and concurrency checks with
//! releases), and a member Redis cannot decide never changes another's decision.

use crate::common;
use crate::lua_agrees::{random_policy, Rng};

use common::redis::RedisServer;
use std::sync::Arc;
use turnstile::clock::ManualClock;
use turnstile::limit::calendar::{Calendar, Unit};
use turnstile::limit::store::memory::MemoryStore;
use turnstile::limit::store::redis::scripts::{BATCH_SOURCE, CHECK_SOURCE};
use turnstile::limit::store::redis::{BatchTotals, RedisConfig, RedisStore, Topology};
use turnstile::limit::store::request::{CheckRequest, Counted, DecideAt};
use turnstile::limit::{Algorithm, Policy};

fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    store_with(server, prefix, 64, 2)
}

/// With `in_flight` calls at most on the connection before calls queue.
fn store_with(
    server: &RedisServer,
    prefix: &str,
    batch_max: usize,
    in_flight: usize,
) -> RedisStore {
    RedisStore::new(RedisConfig {
        topology: Topology::Single(server.url()),
        auth: Default::default(),
        tls: Default::default(),
        prefix: prefix.into(),
        timeout: std::time::Duration::from_secs(5),
        slot_ttl: std::time::Duration::from_secs(60),
        batch_max,
        batch_in_flight: in_flight,
        startup_grace: std::time::Duration::from_secs(5),
        decide_with: Default::default(),
    })
    .unwrap()
}

/// A call of the random sequence: a request's decision, or a charge or refund of a request
/// an earlier group admitted.
enum Op {
    Check(usize),
    Charge(usize, Vec<(usize, i64)>),
    Refund(usize),
}

/// Groups of 1 to 12 requests from three clients (one plan of up to three limits, every
/// algorithm, shadow limits, per-limit costs) are sent at once through one store, with the
/// charges and refunds of requests earlier groups admitted mixed in among them: the first
/// call finds the connection's place free and goes alone, the others arrive while it is in
/// flight and go as batches, in arrival order. The Rust reference runs the same calls one
/// after another in that order, each decision at the time its call reported; every verdict
/// must be equal.
///
/// One call in flight at a time (`batch_in_flight = 1`), so that Redis runs the calls in
/// arrival order: with two (the default), two calls in flight are sent by different tasks —
/// the caller's own call, a batch's driver — and under a loaded CPU the later one was seen to
/// reach Redis first (each call still atomic: the decisions are exact, in another order than
/// the reference's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_decisions_agree_with_rust_on_random_sequences_cut_into_random_batches() {
    let server = RedisServer::start();
    let redis = store_with(&server, "batch", 64, 1);
    let (mut compared, mut charges, mut refunds, mut calendars) = (0, 0, 0, 0);
    for seed in 1..=25u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let memory = MemoryStore::new(Arc::new(ManualClock::new(0)));
        let n = 1 + rng.below(3) as usize;
        // The five algorithms of the random plans, and now and then a calendar day (Kolkata:
        // a half-hour zone); concurrency limits have a test of their own (below).
        let policies: Vec<Policy> = (0..n)
            .map(|i| match rng.below(6) {
                0 => Policy::calendar_window(
                    &format!("p{i}"),
                    1 + rng.below(12),
                    Calendar::new(Unit::Day, "Asia/Kolkata").unwrap(),
                )
                .unwrap(),
                _ => random_policy(&mut rng, i),
            })
            .collect();
        calendars += policies.iter().filter(|p| p.calendar().is_some()).count();
        let shadow: Vec<bool> = (0..n).map(|_| rng.below(4) == 0).collect();
        let max_cost = policies.iter().map(Policy::capacity).min().unwrap().min(3);
        let clients: Vec<Arc<str>> = (0..3).map(|c| format!("s{seed}-c{c}").into()).collect();
        let route: Arc<str> = "route".into();
        let mut offset = 0u64;
        // Requests admitted by the last group: what they counted (`Counted`: not a shadow
        // limit that would have refused, which wrote nothing), to charge or give back.
        let mut taken: Vec<Counted> = Vec::new();
        for group in 0..30 {
            offset += rng.pick(&[0, 0, 1, 5, 40, 400, 1500]);
            let size = 1 + rng.below(12) as usize;
            let asks: Vec<(usize, u64, Vec<u64>)> = (0..size)
                .map(|_| {
                    let client = rng.below(3) as usize;
                    let cost = 1 + rng.below(max_cost);
                    let costs = if rng.below(3) == 0 {
                        (0..n).map(|_| 1 + rng.below(max_cost)).collect()
                    } else {
                        Vec::new()
                    };
                    (client, cost, costs)
                })
                .collect();
            let requests: Vec<CheckRequest<'_>> = asks
                .iter()
                .map(|(client, cost, costs)| CheckRequest {
                    shadow: &shadow,
                    costs,
                    at: DecideAt::StoreClockPlus(offset),
                    ..CheckRequest::new(&clients[*client], &route, &policies, *cost)
                })
                .collect();
            // Now and then an admitted request of the last group is given back, or charged
            // what its response said it cost (its fixed and sliding windows: more or less
            // than it was counted for) — as the gateway does both — at a random place among
            // this group's decisions.
            let mut ops: Vec<Op> = (0..size).map(Op::Check).collect();
            for (t, counted) in taken.iter().enumerate() {
                let op = match rng.below(6) {
                    0 => Op::Refund(t),
                    1 => Op::Charge(
                        t,
                        (0..counted.policies.len())
                            .filter(|&p| {
                                matches!(
                                    counted.policies[p].algorithm,
                                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                                )
                            })
                            .map(|p| (p, rng.below(9) as i64 - 3))
                            .collect(),
                    ),
                    _ => continue,
                };
                let at = rng.below(ops.len() as u64 + 1) as usize;
                ops.insert(at, op);
            }
            let calls = ops.iter().map(|op| async {
                match op {
                    Op::Check(i) => Some(redis.check(&requests[*i]).await.unwrap()),
                    Op::Charge(t, deltas) => {
                        let c = &taken[*t];
                        redis.charge(&c.request(), c.at_ms, deltas).await.unwrap();
                        None
                    }
                    Op::Refund(t) => {
                        let c = &taken[*t];
                        redis.refund(&c.request(), c.at_ms).await.unwrap();
                        None
                    }
                }
            });
            let outcomes = futures::future::join_all(calls).await;
            let mut admitted = Vec::new();
            for (op, outcome) in ops.iter().zip(outcomes) {
                let i = match op {
                    Op::Check(i) => *i,
                    Op::Charge(t, deltas) => {
                        let c = &taken[*t];
                        memory.charge(&c.request(), c.at_ms, deltas);
                        charges += deltas.iter().filter(|(_, d)| *d != 0).count();
                        continue;
                    }
                    Op::Refund(t) => {
                        memory.refund(&taken[*t].request(), taken[*t].at_ms);
                        refunds += 1;
                        continue;
                    }
                };
                let (request, actual) = (&requests[i], outcome.unwrap());
                let now = actual.at_ms;
                let expected = memory.check(&CheckRequest {
                    at: DecideAt::Fixed(now),
                    ..*request
                });
                assert_eq!(
                    actual, expected,
                    "seed {seed}, group {group}, member {i} of {size}, now {now}, asks {:?}, policies {policies:?}, shadow {shadow:?}",
                    asks[i]
                );
                compared += 1;
                if actual.admitted {
                    admitted.extend(Counted::of(request, &policies, &actual, false));
                }
            }
            taken = admitted;
        }
    }
    let totals = redis.batches();
    println!("{compared} decisions compared, {charges} limits charged and {refunds} requests given back among them; batches: {totals:?}; {calendars} calendar windows");
    assert!(compared > 25 * 30);
    assert!(charges > 50, "only {charges} limits were charged");
    assert!(refunds > 50, "only {refunds} requests were given back");
    assert!(calendars > 0, "no plan had a calendar window");
    // Groups of 3 or more requests sent at once form batches; the charges and refunds sent
    // among their decisions ride in them.
    assert_batched(totals, 100, 50);
}

/// A call of the concurrency sequence: a request's check (taking a slot), or the release of
/// a request an earlier group admitted.
enum Slot {
    Check(usize),
    Release(usize),
}

/// Concurrency limits ride in batches too, their checks and the releases of the requests
/// that ended: groups of 1 to 12 requests from three clients (a concurrency limit of 1 to 4,
/// per route or per client, now and then with a rate limit beside it) are sent at once with
/// the releases of some requests earlier groups admitted mixed in among them. The Rust
/// reference runs the same calls in the same order; every verdict must be equal — a release
/// that ran after the check behind it, or a check that lost its slot, would not be. One call
/// in flight at a time, for the order (see the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_checks_and_releases_in_batches_agree_with_rust() {
    use turnstile::limit::Scope;
    let server = RedisServer::start();
    let redis = store_with(&server, "slots", 64, 1);
    let (mut compared, mut released, mut refused) = (0, 0, 0);
    for seed in 1..=12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let memory = MemoryStore::new(Arc::new(ManualClock::new(0)));
        let scope = rng.pick(&[Scope::Route, Scope::Client]);
        let mut policies =
            vec![Policy::concurrency("cc", 1 + rng.below(4), 60_000, scope).unwrap()];
        if rng.below(3) == 0 {
            policies.push(Policy::new("rate", Algorithm::FixedWindow, 40, 60_000, 40));
        }
        let clients: Vec<Arc<str>> = (0..3).map(|c| format!("s{seed}-c{c}").into()).collect();
        let route: Arc<str> = "route".into();
        // Requests admitted and not yet released: (client, slot id).
        let mut held: Vec<(usize, String)> = Vec::new();
        for group in 0..25 {
            let size = 1 + rng.below(12) as usize;
            let asks: Vec<(usize, String)> = (0..size)
                .map(|i| (rng.below(3) as usize, format!("g{group}-{i}")))
                .collect();
            let requests: Vec<CheckRequest<'_>> = asks
                .iter()
                .map(|(client, slot_id)| CheckRequest {
                    slot_id,
                    ..CheckRequest::new(&clients[*client], &route, &policies, 1)
                })
                .collect();
            let mut ops: Vec<Slot> = (0..size).map(Slot::Check).collect();
            let mut ending = Vec::new();
            held.retain(|h| {
                if rng.below(2) == 0 {
                    ending.push(h.clone());
                    false
                } else {
                    true
                }
            });
            for t in 0..ending.len() {
                let at = rng.below(ops.len() as u64 + 1) as usize;
                ops.insert(at, Slot::Release(t));
            }
            let calls = ops.iter().map(|op| async {
                match op {
                    Slot::Check(i) => Some(redis.check(&requests[*i]).await.unwrap()),
                    Slot::Release(t) => {
                        let (client, slot_id) = &ending[*t];
                        redis
                            .release(&clients[*client], &route, &policies, slot_id)
                            .await
                            .unwrap();
                        None
                    }
                }
            });
            let outcomes = futures::future::join_all(calls).await;
            for (op, outcome) in ops.iter().zip(outcomes) {
                let i = match op {
                    Slot::Check(i) => *i,
                    Slot::Release(t) => {
                        memory.release(&clients[ending[*t].0], &route, &policies);
                        released += 1;
                        continue;
                    }
                };
                let actual = outcome.unwrap();
                let expected = memory.check(&CheckRequest {
                    at: DecideAt::Fixed(actual.at_ms),
                    ..requests[i]
                });
                assert_eq!(
                    actual, expected,
                    "seed {seed}, group {group}, member {i} of {size}, asks {asks:?}, policies {policies:?}"
                );
                compared += 1;
                if actual.admitted {
                    held.push(asks[i].clone());
                } else {
                    refused += 1;
                }
            }
        }
    }
    let totals = redis.batches();
    println!("{compared} checks compared ({refused} refused), {released} releases among them; batches: {totals:?}");
    assert!(
        refused > 20,
        "the limits were reached: only {refused} refused"
    );
    assert!(released > 50, "only {released} releases");
    // Checks taking slots ride in batches, and so do the releases sent among them.
    assert_batched(totals, 50, 20);
}

/// More than `batches` batches of two or more decisions each on average, more than
/// `settlements` charges, refunds or releases in them, and none refused whole.
fn assert_batched(totals: BatchTotals, batches: u64, settlements: u64) {
    assert!(
        totals.batches > batches && totals.decisions >= 2 * totals.batches,
        "decisions sent at once form batches: {totals:?}"
    );
    assert!(
        totals.settlements > settlements,
        "what settles a request rides in the batches: {totals:?}"
    );
    assert_eq!(totals.alone, 0, "no batch was refused whole");
}

/// Quota questions (`usage.lua`) sent among decisions ride in their batches and read the
/// state as it stands, writing nothing: client B asks six times while client A's six
/// requests are decided, all sent at once; every answer says what B's own two admitted
/// requests left, and A's decisions admit exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_questions_ride_in_batches_and_write_nothing() {
    let server = RedisServer::start();
    let redis = store(&server, "quota");
    let policy = Policy::new("p", Algorithm::FixedWindow, 4, 600_000, 4);
    let policies = [policy.clone()];
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    let route: Arc<str> = "r".into();
    for _ in 0..2 {
        let taken = redis
            .check(&CheckRequest::new(&b, &route, &policies, 1))
            .await;
        assert!(taken.unwrap().admitted);
    }
    let asks = [(Arc::clone(&route), policy)];
    let ask = || async {
        let queued = std::sync::atomic::AtomicBool::new(false);
        redis.usage(&b, &asks, &queued).await.unwrap()
    };
    let before = redis.batches();
    let request = CheckRequest::new(&a, &route, &policies, 1);
    let (redis, request, ask) = (&redis, &request, &ask);
    let calls = (0..12).map(|i| async move {
        match i % 2 {
            0 => (Some(redis.check(request).await.unwrap().admitted), None),
            _ => (None, Some(ask().await)),
        }
    });
    let outcomes = futures::future::join_all(calls).await;
    let admitted = outcomes.iter().filter(|(d, _)| *d == Some(true)).count();
    assert_eq!(admitted, 4, "A's limit, exactly");
    for (_, usage) in outcomes.iter().filter(|(_, u)| u.is_some()) {
        let usage = usage.as_ref().unwrap();
        assert_eq!(usage.len(), 1);
        assert_eq!(
            usage[0].remaining, 2,
            "B's two requests left 2 of 4: {usage:?}"
        );
    }
    let after = redis.batches();
    assert!(
        after.batches > before.batches && after.settlements > before.settlements,
        "quota questions rode in batches: {before:?} -> {after:?}"
    );
    // Nothing was written for B: its next request is admitted with 1 left.
    let next = redis
        .check(&CheckRequest::new(&b, &route, &policies, 1))
        .await;
    assert_eq!(next.unwrap().decisions[0].remaining, 1);
}

/// A release member of a batch frees its slot in every key it names, and one with a wrong
/// argument count fails alone.
#[test]
fn a_release_in_a_batch_frees_its_slot_and_a_broken_one_fails_alone() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for key in ["cc1:{x}", "cc2:{x}"] {
        let _: u64 = server.cmd(&["ZADD", key, "99999999999999", "slot-a"]);
        let _: u64 = server.cmd(&["ZADD", key, "99999999999999", "slot-b"]);
    }
    let script = redis::Script::new(BATCH_SOURCE);
    let mut batch = script.prepare_invoke();
    batch.key("cc1:{x}").key("cc2:{x}").key("cc1:{x}");
    batch.arg(2);
    batch.arg("l").arg(2).arg(1).arg("slot-a");
    batch.arg("l").arg(1).arg(2).arg("slot-b").arg("extra");
    let replies: Vec<String> = batch.invoke(&mut conn).unwrap();
    assert_eq!(replies[0], "2", "{replies:?}");
    assert!(
        replies[1].starts_with("E ") && replies[1].contains("expected 1 argument to release"),
        "{replies:?}"
    );
    for key in ["cc1:{x}", "cc2:{x}"] {
        let left: Vec<String> = server.cmd(&["ZRANGE", key, "0", "-1"]);
        assert_eq!(left, ["slot-b"], "{key}");
    }
}

/// One `batch.lua` call of three members, the middle one naming an algorithm that does not
/// exist: it alone answers an error, and the other two are decided exactly as two separate
/// `check.lua` calls decide them (on keys of their own).
#[test]
fn a_member_redis_cannot_decide_fails_alone() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let member = |key: &str, algorithm: &str| -> (Vec<String>, Vec<String>) {
        let args = ["1000", "1", "", "a", algorithm, "3", "1000", "3", "0"];
        (
            vec![key.to_owned()],
            args.iter().map(|a| a.to_string()).collect(),
        )
    };
    let members = [
        member("one:{x}:a", "tb"),
        member("two:{x}:a", "zz"),
        member("three:{x}:a", "fw"),
    ];
    let batch_script = redis::Script::new(BATCH_SOURCE);
    let mut batch = batch_script.prepare_invoke();
    batch.arg(members.len());
    for (keys, args) in &members {
        for k in keys {
            batch.key(k);
        }
        batch.arg(keys.len()).arg(args.len());
        for a in args {
            batch.arg(a);
        }
    }
    let replies: Vec<String> = batch.invoke(&mut conn).unwrap();
    assert_eq!(replies.len(), 3);
    assert!(
        replies[1].starts_with("E ") && replies[1].contains("unknown algorithm zz"),
        "{replies:?}"
    );
    let check = redis::Script::new(CHECK_SOURCE);
    for (i, (keys, args)) in members.iter().enumerate().filter(|(i, _)| *i != 1) {
        let mut alone = check.prepare_invoke();
        alone.key(format!("alone-{}", keys[0]));
        for a in args {
            alone.arg(a);
        }
        let reply: String = alone.invoke(&mut conn).unwrap();
        assert_eq!(replies[i], reply, "member {i}");
        assert!(
            reply.starts_with("1 1000 1 2 "),
            "admitted, 2 of 3 left: {reply}"
        );
    }
    // The broken member wrote nothing.
    let exists: u64 = server.cmd(&["EXISTS", "two:{x}:a"]);
    assert_eq!(exists, 0);
}

/// On Redis's clock (time spec ""), a batch formats its time once, for its replies and for
/// what a token bucket and a leaky bucket store as their last update: the stored time is the
/// one the replies tell, and the next decision reads it back exactly (a token bucket of 3 per
/// minute has 2 left, then 1 — a time stored wrong would have refilled it).
#[test]
fn a_batch_on_redis_time_stores_the_time_its_replies_tell() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let buckets = [("tb:{x}", "tb", "3"), ("lb:{x}", "lb", "3:3")];
    let mut send = || -> Vec<String> {
        let script = redis::Script::new(BATCH_SOURCE);
        let mut batch = script.prepare_invoke();
        batch.arg(buckets.len());
        for (key, algorithm, burst) in buckets {
            batch.key(key).arg(1).arg(9);
            for a in ["", "1", "", "a", algorithm, "3", "60000", burst, "0"] {
                batch.arg(a);
            }
        }
        batch.invoke(&mut conn).unwrap()
    };
    let field = |reply: &str, i: usize| reply.split(' ').nth(i).unwrap_or_default().to_owned();
    let first = send();
    for (reply, (key, _, _)) in first.iter().zip(buckets) {
        // Either bucket's string is "<level> <updated>…".
        let stored: String = server.cmd(&["GET", key]);
        let stored = stored.split(' ').nth(1).unwrap_or_default();
        assert_eq!(stored, field(reply, 1), "{key}: {reply}");
    }
    let second = send();
    assert_eq!(
        (field(&first[0], 3), field(&second[0], 3)),
        ("2".into(), "1".into())
    );
}

/// A batch mixing kinds: a decision (which names no kind), a charge naming an algorithm that cannot be charged
/// (a token bucket, after a fixed window it would otherwise have charged first), a refund of
/// an unknown algorithm, a good charge, and a member of no known kind. The three broken
/// members answer their errors and write nothing — not even the charge's first key — while
/// the decision and the good charge run as their own scripts would.
#[test]
fn a_charge_or_refund_redis_cannot_run_fails_alone_in_a_batch() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let decision = ["", "1", "", "a", "fw", "5", "60000", "5", "0"];
    let members: [(&str, &[&str], &[&str]); 5] = [
        ("", &["fw:{x}"], &decision),
        // A charge's and a refund's last key is its marker (applied once: lib.lua).
        (
            "c",
            &["bad-fw:{x}", "bad-tb:{x}", "once:{x}:1"],
            &["", "0", "fw", "5", "60000", "2", "tb", "5", "1000", "2"],
        ),
        (
            "r",
            &["fw:{x}", "once:{x}:2"],
            &["0", "", "zz", "1", "5", "60000", "5"],
        ),
        (
            "c",
            &["fw:{x}", "once:{x}:3"],
            &["", "0", "fw", "5", "60000", "2"],
        ),
        ("x", &["fw:{x}"], &decision),
    ];
    let script = redis::Script::new(BATCH_SOURCE);
    let mut batch = script.prepare_invoke();
    batch.arg(members.len());
    for (kind, keys, args) in members {
        keys.iter().for_each(|k| {
            batch.key(*k);
        });
        if !kind.is_empty() {
            batch.arg(kind);
        }
        batch.arg(keys.len()).arg(args.len());
        args.iter().for_each(|a| {
            batch.arg(*a);
        });
    }
    let replies: Vec<String> = batch.invoke(&mut conn).unwrap();
    assert!(replies[0].starts_with("1 "), "{replies:?}");
    assert!(
        replies[1].starts_with("E ") && replies[1].contains("cannot charge tb"),
        "{replies:?}"
    );
    assert!(
        replies[2].starts_with("E ") && replies[2].contains("unknown algorithm zz"),
        "{replies:?}"
    );
    assert_eq!(replies[3], "1", "the good charge changed its one key");
    assert_eq!(replies[4], "E unknown member kind x");
    let exists: u64 = server.cmd(&["EXISTS", "bad-fw:{x}", "bad-tb:{x}"]);
    assert_eq!(exists, 0, "the broken charge wrote nothing");
    // The decision counted 1 and the charge 2 more: 3 of 5 in the window.
    let count: String = server.cmd(&["HGET", "fw:{x}", "c"]);
    assert_eq!(count, "3");
    // Only the charge that was applied left its marker.
    let markers: u64 = server.cmd(&["EXISTS", "once:{x}:1", "once:{x}:2", "once:{x}:3"]);
    assert_eq!(markers, 1);
}

/// `store.batch_max = 1`: requests sent at once are each their own `check.lua` call, and
/// together still admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_max_one_sends_every_decision_alone() {
    let server = RedisServer::start();
    let redis = store_with(&server, "alone", 1, 2);
    let policies = [Policy::new(
        "p",
        turnstile::limit::Algorithm::FixedWindow,
        5,
        60_000,
        5,
    )];
    let client: Arc<str> = "c".into();
    let route: Arc<str> = "r".into();
    let requests: Vec<CheckRequest<'_>> = (0..12)
        .map(|_| CheckRequest::new(&client, &route, &policies, 1))
        .collect();
    let before = server.decision_calls();
    let verdicts = futures::future::join_all(requests.iter().map(|r| redis.check(r))).await;
    let admitted = verdicts
        .iter()
        .filter(|v| v.as_ref().unwrap().admitted)
        .count();
    assert_eq!(admitted, 5);
    assert_eq!(redis.batches(), Default::default());
    assert_eq!(
        server.decision_calls() - before,
        12,
        "one call per decision"
    );
}
