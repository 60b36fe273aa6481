//! The Lua scripts (`lua/`) as Redis runs them (`sources.rs`: which files make each) and the
//! argument list each call sends (`reply.rs` reads what they answer). Every script opens with
//! the same contract in Lua.

use crate::limit::store::redis::batch::{Kind, Sending};
use crate::limit::store::redis::keys::{
    algorithm_code, instances_info_key, instances_key, instances_limited_key, key, once_key,
    policy_code, registry_keys,
};
pub use crate::limit::store::redis::sources::*;
use crate::limit::store::request::{CheckRequest, DecideAt};
use crate::limit::{Algorithm, Policy};
use redis::{Cmd, Script, ToRedisArgs};
use std::borrow::Cow;
use std::time::Duration;

/// Every script, loaded once per connection and called by SHA.
pub struct Scripts {
    pub check: Script,
    /// Loaded apart from the others (`all`): a Redis older than 7 refuses its first line,
    /// and then only batching is off.
    pub batch: Script,
    pub lease: Script,
    pub give_back: Script,
    pub refund: Script,
    pub release: Script,
    pub heartbeat: Script,
    pub registry: Script,
    pub charge: Script,
    pub usage: Script,
}

impl Scripts {
    /// The script a call made for a batch queue runs: `batch.lua`, or a lone member's own.
    pub fn sending(&self, what: Sending) -> &Script {
        match what {
            Sending::Batch { .. } => &self.batch,
            Sending::Alone(Kind::Decide) => &self.check,
            Sending::Alone(Kind::Charge) => &self.charge,
            Sending::Alone(Kind::Refund) => &self.refund,
            Sending::Alone(Kind::Release) => &self.release,
            Sending::Alone(Kind::Usage) => &self.usage,
        }
    }

    pub fn new() -> Scripts {
        Scripts {
            check: Script::new(CHECK_SOURCE),
            batch: Script::new(BATCH_SOURCE),
            lease: Script::new(LEASE_SOURCE),
            give_back: Script::new(GIVE_BACK_SOURCE),
            refund: Script::new(REFUND_SOURCE),
            release: Script::new(RELEASE_SOURCE),
            heartbeat: Script::new(HEARTBEAT_SOURCE),
            registry: Script::new(REGISTRY_SOURCE),
            charge: Script::new(CHARGE_SOURCE),
            usage: Script::new(USAGE_SOURCE),
        }
    }

    /// The source of every script but the batch one (loaded apart: a Redis older than 7
    /// refuses its first line, and then only batching is off).
    pub fn sources(&self) -> [&'static str; 9] {
        [
            CHECK_SOURCE,
            LEASE_SOURCE,
            GIVE_BACK_SOURCE,
            REFUND_SOURCE,
            RELEASE_SOURCE,
            HEARTBEAT_SOURCE,
            REGISTRY_SOURCE,
            CHARGE_SOURCE,
            USAGE_SOURCE,
        ]
    }

    /// `charge.lua`: KEYS the charged policies `(i, delta)` of `req`; ARGV the time spec, the
    /// admission time, then four per key. `None` when nothing is charged.
    pub fn charge_call(
        &self,
        prefix: &str,
        req: &CheckRequest<'_>,
        (at, once): (u64, &str),
        deltas: &[(usize, i64)],
    ) -> Option<Call<'_>> {
        let charged: Vec<&(usize, i64)> = deltas.iter().filter(|(_, d)| *d != 0).collect();
        if charged.is_empty() {
            return None;
        }
        let mut invocation = Call::new(&self.charge, charged.len() + 1);
        let keys: Vec<String> = charged
            .iter()
            .map(|&&(i, _)| key(prefix, req.partition_of(i), req.route, &req.policies[i]))
            .collect();
        for k in &keys {
            invocation.arg(k.as_str());
        }
        invocation.arg(once_key(prefix, &keys[0], once));
        push_time(&mut invocation, req.at);
        invocation.arg(at);
        let unix_now = match req.at {
            DecideAt::Fixed(ms) => ms,
            DecideAt::StoreClock => unix_ms(),
            DecideAt::StoreClockPlus(ms) => unix_ms() + ms,
        };
        for &&(i, delta) in &charged {
            let p = &req.policies[i];
            invocation.arg(policy_code(p)).arg(p.limit());
            match p.calendar() {
                Some(calendar) => {
                    let [a, b, c, d] = calendar.around(unix_now.max(at));
                    invocation.arg(format!("{a}:{b}:{c}:{d}"))
                }
                None => invocation.arg(p.window_ms()),
            };
            invocation.arg(delta);
        }
        Some(invocation)
    }

    /// `usage.lua`: KEYS the given keys; ARGV as `check.lua`'s (cost 0, no slot id), six per
    /// `(key, policy)`.
    pub fn usage_call<'k>(
        &self,
        limits: impl ExactSizeIterator<Item = (&'k str, &'k Policy)> + Clone,
    ) -> Call<'_> {
        let mut invocation = Call::new(&self.usage, limits.len());
        for (key, _) in limits.clone() {
            invocation.arg(key);
        }
        invocation.arg("").arg(0).arg("");
        let unix_now = unix_ms();
        for (_, p) in limits {
            push_policy(&mut invocation, p, || unix_now, false);
        }
        invocation
    }

    /// `check.lua`: KEYS one per policy; ARGV time, cost, slot id, six per policy, then — when
    /// policies ask different costs — one cost per policy.
    pub fn check_call(&self, prefix: &str, req: &CheckRequest<'_>) -> Call<'_> {
        let mut invocation = Call::new(&self.check, req.policies.len());
        for (i, policy) in req.policies.iter().enumerate() {
            invocation.arg(key(prefix, req.partition_of(i), req.route, policy));
        }
        push_time(&mut invocation, req.at);
        invocation.arg(req.cost).arg(req.slot_id);
        // Calendar windows: the boundaries around the gateway's now; the script picks the
        // window Redis's now is in.
        let unix_now = || match req.at {
            DecideAt::Fixed(ms) => ms,
            DecideAt::StoreClock => unix_ms(),
            DecideAt::StoreClockPlus(ms) => unix_ms() + ms,
        };
        for (i, p) in req.policies.iter().enumerate() {
            let is_shadow = req.shadow.get(i).copied().unwrap_or(false);
            push_policy(&mut invocation, p, unix_now, is_shadow);
        }
        if !req.costs.is_empty() {
            for i in 0..req.policies.len() {
                invocation.arg(req.cost_of(i));
            }
        }
        invocation
    }

    /// `refund.lua`: KEYS the policies `i` of `req` that were `committed(i)`; ARGV the time
    /// they were decided at, slot id, then five per key. `None` when none was.
    pub fn refund_call(
        &self,
        prefix: &str,
        req: &CheckRequest<'_>,
        committed: impl Fn(usize) -> bool,
        (now, once): (u64, &str),
    ) -> Option<Call<'_>> {
        let refunded: Vec<usize> = (0..req.policies.len()).filter(|&i| committed(i)).collect();
        if refunded.is_empty() {
            return None;
        }
        let mut invocation = Call::new(&self.refund, refunded.len() + 1);
        let keys: Vec<String> = refunded
            .iter()
            .map(|&i| key(prefix, req.partition_of(i), req.route, &req.policies[i]))
            .collect();
        for k in &keys {
            invocation.arg(k.as_str());
        }
        invocation.arg(once_key(prefix, &keys[0], once));
        invocation.arg(now).arg(req.slot_id);
        for &i in &refunded {
            let p = &req.policies[i];
            invocation
                .arg(policy_code(p))
                .arg(req.cost_of(i))
                .arg(p.limit());
            match p.calendar() {
                // The start of the calendar window `now` (Redis's) is in.
                Some(calendar) => invocation.arg(calendar.window(now).0),
                None => invocation.arg(p.window_ms()),
            };
            match p.algorithm {
                // A leaky bucket's turn: how long the request was held (0: it passed at once).
                Algorithm::LeakyBucket => invocation.arg(req.waits.get(i).copied().unwrap_or(0)),
                _ => invocation.arg(p.burst()),
            };
        }
        Some(invocation)
    }

    /// `lease.lua`: KEYS one per policy; ARGV time, need, want, then six per policy.
    pub fn lease_call(&self, prefix: &str, call: &LeaseCall<'_>) -> Call<'_> {
        let mut invocation = Call::new(&self.lease, call.policies.len());
        for policy in call.policies {
            invocation.arg(key(prefix, call.client, call.route, policy));
        }
        push_time(&mut invocation, call.at);
        invocation.arg(call.need).arg(call.want);
        for (i, p) in call.policies.iter().enumerate() {
            let (start, units) = match call.give_back_starts.get(i) {
                Some(start) => (*start, call.give_back),
                None => (0, 0),
            };
            invocation
                .arg(&*p.name)
                .arg(algorithm_code(p.algorithm))
                .arg(p.limit())
                .arg(p.window_ms())
                .arg(start)
                .arg(units);
        }
        invocation
    }

    /// `release.lua`: KEYS the concurrency policies' keys; ARGV the slot id. `None` when no
    /// policy is a concurrency limit.
    pub fn release_call(
        &self,
        prefix: &str,
        client: &str,
        route: &str,
        policies: &[Policy],
        slot_id: &str,
    ) -> Option<Call<'_>> {
        let slots = policies.iter().filter(|p| p.is_concurrency()).count();
        if slots == 0 {
            return None;
        }
        let mut invocation = Call::new(&self.release, slots);
        for policy in policies.iter().filter(|p| p.is_concurrency()) {
            invocation.arg(key(prefix, client, route, policy));
        }
        invocation.arg(slot_id);
        Some(invocation)
    }

    /// `release.lua` in its renewing mode: each `(key, slot id, ttl_ms)` slot still held
    /// lives its time to live from now. `None` for no slot.
    pub fn renew_call<'s>(
        &self,
        slots: impl ExactSizeIterator<Item = (&'s str, &'s str, u64)> + Clone,
    ) -> Option<Call<'_>> {
        if slots.len() == 0 {
            return None;
        }
        let mut invocation = Call::new(&self.release, slots.len());
        for (key, _, _) in slots.clone() {
            invocation.arg(key);
        }
        invocation.arg("renew");
        for (_, slot_id, ttl_ms) in slots {
            invocation.arg(slot_id).arg(ttl_ms);
        }
        Some(invocation)
    }

    /// `give_back.lua`: KEYS one per policy; ARGV four per policy.
    pub fn give_back_call(
        &self,
        prefix: &str,
        client: &str,
        route: &str,
        policies: &[Policy],
        starts: &[u64],
        units: u64,
    ) -> Call<'_> {
        let pairs = policies.iter().zip(starts);
        let mut invocation = Call::new(&self.give_back, pairs.len());
        for (policy, _) in pairs.clone() {
            invocation.arg(key(prefix, client, route, policy));
        }
        for (policy, start) in pairs {
            invocation
                .arg(algorithm_code(policy.algorithm))
                .arg(policy.window_ms())
                .arg(*start)
                .arg(units);
        }
        invocation
    }

    /// `heartbeat.lua`: KEYS the instances set and their info; ARGV id, liveness, what to do,
    /// this instance's info.
    pub fn heartbeat_call(
        &self,
        prefix: &str,
        instance: &str,
        liveness: Duration,
        beat: Beat<'_>,
    ) -> Call<'_> {
        let mut invocation = Call::new(&self.heartbeat, 3);
        let (mode, info, limited) = match beat {
            Beat::Alive { info, limited } => ("0", info, limited),
            Beat::Leave => ("1", "", ""),
            Beat::List => ("list", "", ""),
        };
        invocation
            .arg(instances_key(prefix))
            .arg(instances_info_key(prefix))
            .arg(instances_limited_key(prefix))
            .arg(instance)
            .arg(liveness.as_millis() as u64)
            .arg(mode)
            .arg(info)
            .arg(limited);
        invocation
    }
}

/// What a `heartbeat.lua` call does.
pub enum Beat<'a> {
    /// Announce this instance, saying `info` of itself and publishing `limited` (who it
    /// refused most lately; "" for nobody).
    Alive { info: &'a str, limited: &'a str },
    /// Withdraw it (graceful shutdown).
    Leave,
    /// Change nothing: list the live instances.
    List,
}

/// An operation of `registry.lua`.
pub enum RegistryOp<'a> {
    Version,
    Read,
    /// One client's JSON ("" when absent).
    Get(&'a str),
    /// Compare and set one client's JSON ("" = absent / deleted); `max` clients at most.
    Cas {
        id: &'a str,
        expected: &'a str,
        new: &'a str,
        max: usize,
    },
    /// A whole registry, written only where Redis holds none.
    Restore {
        version: u64,
        entries: &'a [(String, String)],
    },
}

impl Scripts {
    /// `registry.lua`: KEYS the clients hash and the version; ARGV the operation and its
    /// arguments.
    pub fn registry_call(&self, prefix: &str, op: &RegistryOp<'_>) -> Call<'_> {
        let (clients, version) = registry_keys(prefix);
        let mut invocation = Call::new(&self.registry, 2);
        invocation.arg(clients).arg(version);
        match op {
            RegistryOp::Version => invocation.arg("version"),
            RegistryOp::Read => invocation.arg("read"),
            RegistryOp::Get(id) => invocation.arg("get").arg(*id),
            RegistryOp::Cas {
                id,
                expected,
                new,
                max,
            } => invocation
                .arg("cas")
                .arg(*id)
                .arg(*expected)
                .arg(*new)
                .arg(*max),
            RegistryOp::Restore { version, entries } => {
                invocation.arg("restore").arg(*version);
                for (id, json) in entries.iter() {
                    invocation.arg(id.as_str()).arg(json.as_str());
                }
                &mut invocation
            }
        };
        invocation
    }
}

/// One call of a script: `EVALSHA <sha1> <number of keys> <keys> <arguments>`, encoded into
/// one command as it is built (`redis::ScriptInvocation` would keep each argument in a vector
/// of its own and copy them all into a command when sent). The keys come first: each builder
/// above pushes its keys before its arguments.
pub struct Call<'a> {
    pub script: &'a Script,
    /// Borrowed when a batch's member, kept by its batch, is sent alone.
    pub cmd: Cow<'a, Cmd>,
}

impl<'a> Call<'a> {
    fn new(script: &'a Script, keys: usize) -> Call<'a> {
        // Room for a decision of a few limits at once: growing the argument lists one
        // argument at a time was 7 allocations per call.
        let mut cmd = redis::Cmd::with_capacity(32, 512);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Call {
            script,
            cmd: Cow::Owned(cmd),
        }
    }

    /// How many keys the call names (its `numkeys`).
    pub fn keys(&self) -> usize {
        match self.cmd.args_iter().nth(2) {
            Some(redis::Arg::Simple(n)) => std::str::from_utf8(n)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            _ => 0,
        }
    }

    /// Appends a key or an argument.
    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Call<'a> {
        self.cmd.to_mut().arg(arg);
        self
    }
}

impl Default for Scripts {
    fn default() -> Scripts {
        Scripts::new()
    }
}

/// The six arguments of one limit in `check.lua`'s layout (`lua/limits.lua`): name, code,
/// limit, window (a calendar window's bounds around `unix_now`), burst (the leaky bucket's
/// "burst:delay"), shadow.
fn push_policy(invocation: &mut Call<'_>, p: &Policy, unix_now: impl Fn() -> u64, shadow: bool) {
    invocation.arg(&*p.name).arg(policy_code(p)).arg(p.limit());
    match p.calendar() {
        Some(calendar) => {
            let [a, b, c, d] = calendar.around(unix_now());
            invocation.arg(format!("{a}:{b}:{c}:{d}"))
        }
        None => invocation.arg(p.window_ms()),
    };
    match p.algorithm {
        Algorithm::LeakyBucket => invocation.arg(format!("{}:{}", p.burst(), p.delay())),
        _ => invocation.arg(p.burst()),
    };
    invocation.arg(if shadow { "1" } else { "0" });
}

/// A renewal of a lease (`lease::Ask`) for the Redis store.
pub struct LeaseCall<'a> {
    pub client: &'a str,
    pub route: &'a str,
    pub policies: &'a [Policy],
    pub need: u64,
    pub want: u64,
    /// Units of a lapsed lease to give back first, and each policy's window start for them.
    pub give_back: u64,
    pub give_back_starts: &'a [u64],
    pub at: DecideAt,
}

/// The wall clock in Unix milliseconds.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// `ARGV[1]` of check.lua and lease.lua: "" for Redis's clock, "<ms>", or "+<ms>" (see
/// `now_ms` in `lua/lib.lua`).
fn push_time(invocation: &mut Call<'_>, at: DecideAt) {
    match at {
        DecideAt::StoreClock => invocation.arg(""),
        DecideAt::Fixed(ms) => invocation.arg(ms),
        DecideAt::StoreClockPlus(ms) => invocation.arg(format!("+{ms}")),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a new connection loads is what the calls name by SHA: every script but the batch
    /// one (loaded apart), each exactly once.
    #[test]
    fn the_sources_loaded_are_the_scripts_called() {
        let s = Scripts::new();
        let loaded: Vec<String> = s
            .sources()
            .iter()
            .map(|source| Script::new(source).get_hash().to_owned())
            .collect();
        let called = [
            &s.check,
            &s.lease,
            &s.give_back,
            &s.refund,
            &s.release,
            &s.heartbeat,
            &s.registry,
            &s.charge,
            &s.usage,
        ]
        .map(|script| script.get_hash().to_owned());
        assert_eq!(loaded, called);
        assert!(!loaded.iter().any(|sha| sha == s.batch.get_hash()));
    }
}
