//! The Redis module (`module/`) decides exactly as the Lua scripts: driven with the same
//! random request sequences — the gateway's own arguments (`Scripts::check_call`), at the
//! same explicit times — every reply is the same text and every key holds the same bytes,
//! on every algorithm, with refunds (a Lua script) run now and then on what each side wrote,
//! and a third set of keys decided by either at random (a rollout). And what it writes
//! reaches a replica as its effects: the replica's keys equal the primary's, byte for byte,
//! expiry times included, though the replica has no module to decide with.

use crate::common;
use crate::lua_agrees::{random_policy, Rng};

use common::redis::{module_path, RedisCluster, RedisServer};
use std::sync::Arc;
use turnstile::limit::calendar::{Calendar, Unit};
use turnstile::limit::store::redis::scripts::{Scripts, BATCH_SOURCE, CHECK_SOURCE, REFUND_SOURCE};
use turnstile::limit::store::request::{CheckRequest, DecideAt};
use turnstile::limit::{Algorithm, Policy, Scope};

/// Every algorithm: the five of `lua_agrees`, a calendar day, and now and then a
/// concurrency limit.
fn native_policy(rng: &mut Rng, i: usize) -> Policy {
    let name = format!("p{i}");
    match rng.below(7) {
        0 => Policy::calendar_window(
            &name,
            1 + rng.below(12),
            Calendar::new(Unit::Day, "Asia/Kolkata").unwrap(),
        )
        .unwrap(),
        1 => Policy::concurrency(&name, 1 + rng.below(4), window(rng), Scope::Route).unwrap(),
        _ => random_policy(rng, i),
    }
}

fn window(rng: &mut Rng) -> u64 {
    rng.pick(&[7, 50, 100, 250, 1000, 3000, 60_000])
}

/// A call's arguments after `EVALSHA <sha>`: numkeys, the keys, the script's ARGV.
fn args_of(call: &redis::Cmd) -> Vec<Vec<u8>> {
    call.args_iter()
        .skip(2)
        .map(|a| match a {
            redis::Arg::Simple(b) => b.to_vec(),
            _ => unreachable!("a script call has no cursor"),
        })
        .collect()
}

/// Every key of a server but the refund markers, with its value (a STRING's bytes, a HASH's
/// fields sorted) and its absolute expiry.
fn keyspace(conn: &mut redis::Connection, pattern: &str) -> Vec<(String, String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.retain(|k| !k.contains("once"));
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let kind: String = redis::cmd("TYPE").arg(&k).query(conn).unwrap();
            let value = match kind.as_str() {
                "string" => redis::cmd("GET").arg(&k).query::<String>(conn).unwrap(),
                "zset" => {
                    let m: Vec<(String, String)> = redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(conn)
                        .unwrap();
                    format!("{m:?}")
                }
                _ => {
                    let mut f: Vec<(String, String)> =
                        redis::cmd("HGETALL").arg(&k).query(conn).unwrap();
                    f.sort();
                    format!("{f:?}")
                }
            };
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(conn).unwrap();
            (k, value, at)
        })
        .collect()
}

/// `source` loaded as a script: its SHA.
fn load(conn: &mut redis::Connection, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(conn)
        .unwrap()
}

/// Redis's clock now, whole seconds, in ms: where a sequence at explicit times starts.
fn whole_second_ms(conn: &mut redis::Connection) -> u64 {
    let time: Vec<String> = redis::cmd("TIME").query(conn).unwrap();
    time[0].parse::<u64>().unwrap() * 1000
}

#[test]
fn the_module_and_lua_decide_and_store_identically_on_random_sequences() {
    let server = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let mut conn = server.conn();
    let scripts = Scripts::new();
    let check_sha = load(&mut conn, CHECK_SOURCE);
    let refund_sha = load(&mut conn, REFUND_SOURCE);
    let base = whole_second_ms(&mut conn);
    let (mut compared, mut rejected, mut refunds) = (0, 0, 0);
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let n = 1 + rng.below(3) as usize;
        let policies: Vec<Policy> = (0..n).map(|i| native_policy(&mut rng, i)).collect();
        let shadow: Vec<bool> = (0..n).map(|_| rng.below(4) == 0).collect();
        let max_cost = policies.iter().map(Policy::capacity).min().unwrap().min(3);
        let client: Arc<str> = format!("client-{seed}").into();
        let route: Arc<str> = "route".into();
        let mut at = base;
        for step in 0..150 {
            at += rng.pick(&[0, 0, 1, 2, 5, 13, 40, 120, 400, 1500]);
            let cost = 1 + rng.below(max_cost);
            let costs: Vec<u64> = if rng.below(2) == 0 {
                (0..n).map(|_| 1 + rng.below(max_cost)).collect()
            } else {
                Vec::new()
            };
            // Each request its own concurrency slot.
            let slot = format!("slot-{seed}-{step}");
            let request = CheckRequest {
                shadow: &shadow,
                costs: &costs,
                slot_id: &slot,
                at: DecideAt::Fixed(at),
                ..CheckRequest::new(&client, &route, &policies, cost)
            };
            let lua: String = redis::cmd("EVALSHA")
                .arg(&check_sha)
                .arg(args_of(&scripts.check_call("lua", &request).cmd))
                .query(&mut conn)
                .unwrap();
            let native: String = redis::cmd("TURNSTILE.DECIDE")
                .arg(args_of(&scripts.check_call("mod", &request).cmd))
                .query(&mut conn)
                .unwrap();
            let context = format!(
                "seed {seed}, step {step}, at {at}, policies {policies:?}, shadow {shadow:?}"
            );
            assert_eq!(native, lua, "{context}");
            // A third client's keys decided by either, at random: a rollout, where gateways
            // with and without the module share one Redis.
            let mixed = scripts.check_call("mix", &request);
            let mut by = redis::cmd("TURNSTILE.DECIDE");
            if rng.below(2) == 0 {
                by = redis::cmd("EVALSHA");
                by.arg(&check_sha);
            }
            let mixed: String = by.arg(args_of(&mixed.cmd)).query(&mut conn).unwrap();
            assert_eq!(mixed, lua, "mixed: {context}");
            compared += 1;
            let words: Vec<&str> = lua.split(' ').collect();
            if words[0] == "0" {
                rejected += 1;
            } else if rng.below(5) == 0 {
                // Given back by the Lua refund script, on what Lua wrote and on what the
                // module wrote: both must answer and store the same (a leaky bucket's turn
                // given back is then taken by a later request, on either side).
                let committed = |i: usize| words[2 + 4 * i] == "1";
                // A leaky bucket's turn: how long its limit held the request.
                let waits: Vec<u64> = (0..n).map(|i| words[5 + 4 * i].parse().unwrap()).collect();
                let request = CheckRequest {
                    waits: &waits,
                    ..request
                };
                let once = format!("r{seed}-{step}");
                let mut replies = Vec::new();
                for prefix in ["lua", "mod", "mix"] {
                    // None: every limit was a shadow one that refused (nothing committed).
                    let Some(call) = scripts.refund_call(prefix, &request, committed, (at, &once))
                    else {
                        continue;
                    };
                    let reply: redis::Value = redis::cmd("EVALSHA")
                        .arg(&refund_sha)
                        .arg(args_of(&call.cmd))
                        .query(&mut conn)
                        .unwrap();
                    replies.push(reply);
                }
                assert!(
                    replies.iter().all(|r| Some(r) == replies.first()),
                    "refund: {context}"
                );
                refunds += usize::from(!replies.is_empty());
            }
        }
        let values = |prefix: &str, conn: &mut redis::Connection| -> Vec<(String, String)> {
            keyspace(conn, &format!("{prefix}:*{{client-{seed}}}*"))
                .into_iter()
                .map(|(k, v, _)| (k.replacen(prefix, "", 1), v))
                .collect()
        };
        let lua = values("lua", &mut conn);
        assert!(!lua.is_empty(), "seed {seed}: nothing stored");
        assert_eq!(values("mod", &mut conn), lua, "seed {seed}: stored state");
        assert_eq!(values("mix", &mut conn), lua, "seed {seed}: mixed state");
    }
    // The sequences reached what they are meant to: rejections and refunds on both sides.
    assert!(
        compared == 40 * 150 && rejected > 500 && refunds > 200,
        "{compared} {rejected} {refunds}"
    );
}

#[test]
fn the_module_refuses_bad_arguments_and_what_it_does_not_decide() {
    let server = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let mut conn = server.conn();
    let version: String = redis::cmd("TURNSTILE.VERSION").query(&mut conn).unwrap();
    assert!(version.starts_with("turnstile-module 1 "), "{version}");
    for bad in [
        vec!["1", "k", "", "1", ""],                                   // too few
        vec!["1", "k", "", "x", "", "a", "tb", "1", "1000", "1", "0"], // a cost not a number
        vec!["1", "k", "", "1", "", "a", "tb", "0", "1000", "1", "0"], // a limit of 0
        vec![
            "1",
            "k",
            "",
            "99999999999999999999",
            "",
            "a",
            "fw",
            "1",
            "1",
            "1",
            "0",
        ],
        vec!["1", "k", "", "1", "", "a", "xx", "1", "1000", "1", "0"], // no such algorithm
        vec!["2", "k"],                                                // keys past the end
        vec!["x"],
    ] {
        let reply: redis::RedisResult<String> =
            redis::cmd("TURNSTILE.DECIDE").arg(&bad).query(&mut conn);
        let err = reply.expect_err(&format!("{bad:?} was accepted"));
        assert!(
            err.to_string().contains("turnstile module")
                || err.to_string().contains("wrong number"),
            "{err}"
        );
    }
    // A key of another type: refused, as the script's GET/HMGET would.
    let _: () = redis::cmd("SADD")
        .arg("set")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let reply: redis::RedisResult<String> = redis::cmd("TURNSTILE.DECIDE")
        .arg(&["1", "set", "", "1", "", "a", "tb", "1", "1000", "1", "0"])
        .query(&mut conn);
    assert!(reply.unwrap_err().to_string().contains("WRONGTYPE"));
    // Nothing refused wrote anything; the server is alive.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys, vec!["set".to_string()]);
}

/// A call naming one key for two of its limits: the module opens each key once for its read
/// and its write, so a key named twice must not be written through a stale view of it. Lua
/// reads both, then writes both, the second write last; the module must store and answer the
/// same, on a bucket, a window and a sliding window, and on a call that refuses.
#[test]
fn a_call_naming_one_key_twice_is_decided_as_lua_decides_it() {
    let server = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let mut conn = server.conn();
    let check_sha = load(&mut conn, CHECK_SOURCE);
    let base = whole_second_ms(&mut conn);
    let mut refused = 0;
    for (algorithm, limits) in [("tb", ["4", "3"]), ("fw", ["5", "3"]), ("sw", ["5", "3"])] {
        let extra = if algorithm == "tb" { "2" } else { "0" };
        for step in 0..12u64 {
            let at = (base + 90 * step).to_string();
            let call = |prefix: &str| {
                let key = format!("{prefix}:{{twice}}:{algorithm}");
                let mut args = vec!["2".to_string(), key.clone(), key, at.clone()];
                args.extend(["1", ""].map(String::from));
                for (name, limit) in ["a", "b"].iter().zip(limits) {
                    args.extend([*name, algorithm, limit, "1000", extra, "0"].map(String::from));
                }
                args
            };
            let lua: String = redis::cmd("EVALSHA")
                .arg(&check_sha)
                .arg(call("lua"))
                .query(&mut conn)
                .unwrap();
            let native: String = redis::cmd("TURNSTILE.DECIDE")
                .arg(call("mod"))
                .query(&mut conn)
                .unwrap();
            assert_eq!(native, lua, "{algorithm}, step {step}");
            refused += usize::from(lua.starts_with('0'));
            // The values (an expiry counts from Redis's clock at each call, a moment apart).
            let stored = |prefix: &str, conn: &mut redis::Connection| {
                keyspace(conn, &format!("{prefix}:{{twice}}:{algorithm}"))
                    .into_iter()
                    .map(|(_, v, _)| v)
                    .collect::<Vec<_>>()
            };
            let lua = stored("lua", &mut conn);
            assert_eq!(lua.len(), 1, "{algorithm}, step {step}: {lua:?}");
            assert_eq!(stored("mod", &mut conn), lua, "{algorithm}, step {step}");
        }
    }
    assert!(refused > 3, "the sequences never refused: {refused}");
}

#[test]
fn what_the_module_writes_reaches_a_replica_as_its_effects() {
    let primary = RedisServer::start_with(&["--loadmodule", &module_path()]);
    // The replica has no module: it can only apply effects, never decide again.
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let mut conn = primary.conn();
    let mut replica_conn = replica.conn();
    // Linked before anything is decided: every write then travels as a command, not in the
    // first sync's snapshot.
    common::wait_until("the replica to link", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica_conn)
            .unwrap();
        info.contains("master_link_status:up")
    });
    let scripts = Scripts::new();
    let mut rng = Rng(0x5eed);
    // Minute-long and day-long windows: no key expires while the two keyspaces are read.
    // Every stored form: STRINGs (buckets, a leaky one's turns), HASHes, ZSETs.
    let policies = [
        Policy::new("tb", Algorithm::TokenBucket, 50, 60_000, 20),
        Policy::new("sw", Algorithm::SlidingWindow, 30, 60_000, 30),
        Policy::calendar_window("day", 40, Calendar::new(Unit::Day, "Asia/Kolkata").unwrap())
            .unwrap(),
        Policy::new("fw", Algorithm::FixedWindow, 10, 60_000, 10),
        Policy::leaky_bucket("lb", 20, 60_000, 5, 2).unwrap(),
        Policy::new("sl", Algorithm::SlidingLog, 30, 60_000, 30),
        Policy::concurrency("cc", 8, 60_000, Scope::Route).unwrap(),
    ];
    let route: Arc<str> = "route".into();
    let mut decided = 0;
    for step in 0..400 {
        let client: Arc<str> = format!("c{}", rng.below(20)).into();
        let first = rng.below(7) as usize;
        let n = 1 + rng.below(7 - first as u64) as usize;
        let slot = format!("slot-{step}");
        let request = CheckRequest {
            slot_id: &slot,
            at: DecideAt::StoreClockPlus(step * 7),
            ..CheckRequest::new(&client, &route, &policies[first..first + n], 1)
        };
        let _: String = redis::cmd("TURNSTILE.DECIDE")
            .arg(args_of(&scripts.check_call("mod", &request).cmd))
            .query(&mut conn)
            .unwrap();
        decided += 1;
    }
    let offset: i64 = {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    common::wait_until("the replica to catch up", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica_conn)
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("slave_repl_offset:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .is_some_and(|v| v >= offset)
    });
    let on_primary = keyspace(&mut conn, "mod:*");
    let on_replica = keyspace(&mut replica_conn, "mod:*");
    assert!(
        decided == 400 && on_primary.len() > 20,
        "{}",
        on_primary.len()
    );
    assert_eq!(on_replica, on_primary);
    // What went over the link: the writes themselves (the replica has no module command).
    assert!(replica.command_calls("set") > 0 && replica.command_calls("hset") > 0);
}

/// A batch's arguments (`lua/batch.lua`'s, keys declared) from its members' own calls
/// (`args_of`), each with its kind (`None`: a decision, `Some("u")`: a quota question).
fn batch_args(members: &[(Option<&str>, Vec<Vec<u8>>)]) -> Vec<Vec<u8>> {
    let keys =
        |args: &Vec<Vec<u8>>| -> usize { std::str::from_utf8(&args[0]).unwrap().parse().unwrap() };
    let total: usize = members.iter().map(|(_, a)| keys(a)).sum();
    let mut out = vec![total.to_string().into_bytes()];
    for (_, a) in members {
        out.extend(a[1..1 + keys(a)].iter().cloned());
    }
    out.push(members.len().to_string().into_bytes());
    for (kind, a) in members {
        let n = keys(a);
        out.extend(kind.map(|k| k.as_bytes().to_vec()));
        out.push(n.to_string().into_bytes());
        out.push((a.len() - 1 - n).to_string().into_bytes());
        out.extend(a[1 + n..].iter().cloned());
    }
    out
}

#[test]
fn the_modules_batches_and_quota_questions_agree_with_batch_lua() {
    let server = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let mut conn = server.conn();
    let scripts = Scripts::new();
    let batch_sha = load(&mut conn, BATCH_SOURCE);
    let base = whole_second_ms(&mut conn);
    let (mut members_sent, mut questions) = (0, 0);
    for seed in 1..=25u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let n = 1 + rng.below(3) as usize;
        let policies: Vec<Policy> = (0..n).map(|i| native_policy(&mut rng, i)).collect();
        let shadow: Vec<bool> = (0..n).map(|_| rng.below(4) == 0).collect();
        let max_cost = policies.iter().map(Policy::capacity).min().unwrap().min(3);
        let clients: Vec<Arc<str>> = (0..3).map(|c| format!("b{seed}-c{c}").into()).collect();
        let route: Arc<str> = "route".into();
        let mut at = base;
        for group in 0..30 {
            at += rng.pick(&[0, 0, 1, 5, 40, 400, 1500]);
            let size = 1 + rng.below(12) as usize;
            let asks: Vec<(usize, u64, String)> = (0..size)
                .map(|i| {
                    (
                        rng.below(3) as usize,
                        1 + rng.below(max_cost),
                        format!("s{group}-{i}"),
                    )
                })
                .collect();
            let question = rng.below(4) == 0;
            let mut replies = Vec::new();
            for prefix in ["lua", "mod"] {
                let mut members: Vec<(Option<&str>, Vec<Vec<u8>>)> = asks
                    .iter()
                    .map(|(c, cost, slot)| {
                        let request = CheckRequest {
                            shadow: &shadow,
                            slot_id: slot,
                            at: DecideAt::Fixed(at),
                            ..CheckRequest::new(&clients[*c], &route, &policies, *cost)
                        };
                        (None, args_of(&scripts.check_call(prefix, &request).cmd))
                    })
                    .collect();
                if question {
                    let keys: Vec<String> = policies
                        .iter()
                        .map(|p| {
                            turnstile::limit::store::redis::keys::key(
                                prefix,
                                &clients[0],
                                &route,
                                p,
                            )
                        })
                        .collect();
                    let call = scripts.usage_call(keys.iter().map(String::as_str).zip(&policies));
                    let mut args = args_of(&call.cmd);
                    // Asked at the batch's explicit time, as the decisions are.
                    args[1 + n] = at.to_string().into_bytes();
                    members.insert(members.len() / 2, (Some("u"), args));
                }
                let args = batch_args(&members);
                let reply: Vec<String> = match prefix {
                    "lua" => redis::cmd("EVALSHA")
                        .arg(&batch_sha)
                        .arg(args)
                        .query(&mut conn),
                    _ => redis::cmd("TURNSTILE.BATCH").arg(args).query(&mut conn),
                }
                .unwrap();
                members_sent += members.len();
                replies.push(reply);
            }
            assert_eq!(
                replies[1], replies[0],
                "seed {seed}, group {group}, policies {policies:?}"
            );
            questions += usize::from(question);
        }
    }
    assert!(
        members_sent > 2000 && questions > 50,
        "{members_sent} {questions}"
    );
}

/// Key positions: on a Redis Cluster, the module's commands are routed, redirected and
/// refused as the scripts are — the node serving the keys' slot decides, another answers
/// MOVED, keys of two slots are refused (CROSSSLOT), the same answer as EVALSHA's each time.
#[test]
fn a_cluster_treats_the_modules_keys_as_it_treats_the_scripts() {
    let cluster = RedisCluster::with_module();
    let sha: String = cluster.nodes[0].cmd(&["SCRIPT", "LOAD", CHECK_SOURCE]);
    for node in &cluster.nodes[1..] {
        let _: String = node.cmd(&["SCRIPT", "LOAD", CHECK_SOURCE]);
    }
    let (a, b) = ("t:{alpha}:r:p", "t:{bravo}:r:p");
    assert_ne!(cluster.slot_of(a), cluster.slot_of(b));
    let owner = cluster.primary_of(cluster.slot_of(a), 0);
    let other = (owner + 1) % cluster.nodes.len();
    let limit = ["a", "tb", "5", "1000", "5", "0"];
    let answer = |node: usize, head: &[&str], keys: &[&str]| -> String {
        let mut cmd = redis::cmd(head[0]);
        cmd.arg(&head[1..])
            .arg(keys.len())
            .arg(keys)
            .arg(&["", "1", ""]);
        for _ in keys {
            cmd.arg(&limit);
        }
        match cmd.query::<String>(&mut cluster.nodes[node].conn()) {
            Ok(reply) => format!("ok {}", &reply[..1]),
            Err(e) => e.code().unwrap_or("other").to_string(),
        }
    };
    for (node, keys, want) in [
        (owner, vec![a], "ok 1"),
        (other, vec![a], "MOVED"),
        (owner, vec![a, b], "CROSSSLOT"),
    ] {
        let native = answer(node, &["TURNSTILE.DECIDE"], &keys);
        let script = answer(node, &["EVALSHA", &sha], &keys);
        assert_eq!(
            (native.as_str(), script.as_str()),
            (want, want),
            "{keys:?} on node {node}"
        );
    }
}
