//! The Lua scripts (`lua/`) as Redis runs them: which files make each script (one list per
//! script, concatenated at compile time), the argument list each call sends, and the typed
//! reading of each reply. Every script opens with the same contract in Lua.

use crate::limit::store::error::StoreError;
use crate::limit::store::lease::{Grant, GrantWindow};
use crate::limit::store::redis::keys::{algorithm_code, instances_key, key};
use crate::limit::store::request::{CheckRequest, DecideAt};
use crate::limit::{Decision, Policy, Verdict};
use redis::{Script, ScriptInvocation, Value};
use std::time::Duration;

/// Defines a script: `$files`, the Lua files it is made of (in order: helpers before their
/// users, the entry point last), and `$source`, their concatenation.
macro_rules! script {
    ($(#[$doc:meta])* $source:ident, $files:ident = [$($file:literal),+ $(,)?]) => {
        $(#[$doc])*
        pub const $files: &[&str] = &[$($file),+];
        $(#[$doc])*
        pub const $source: &str =
            concat!($(include_str!(concat!("../../../../lua/", $file)), "\n"),+);
    };
}

script!(
    /// Decides a request against every limit of its plan (`lua/check.lua`).
    CHECK_SOURCE,
    CHECK_FILES = [
        "lib.lua",
        "token_bucket.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "sliding_log.lua",
        "concurrency.lua",
        "check.lua",
    ]
);
script!(
    /// Quota leasing: reserves a slice of every limit of a plan at once (`lua/lease.lua`).
    LEASE_SOURCE,
    LEASE_FILES = [
        "lib.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "return_units.lua",
        "lease.lua",
    ]
);
script!(
    /// Gives the unspent units of leases back (`lua/give_back.lua`).
    GIVE_BACK_SOURCE,
    GIVE_BACK_FILES = ["return_units.lua", "give_back.lua"]
);
script!(
    /// Gives back what check.lua committed in one slot when another slot rejected the request
    /// (Redis Cluster; `lua/refund.lua`).
    REFUND_SOURCE,
    REFUND_FILES = ["return_units.lua", "refund.lua"]
);
script!(
    /// Frees a finished request's concurrency slots (`lua/release.lua`).
    RELEASE_SOURCE,
    RELEASE_FILES = ["release.lua"]
);
script!(
    /// Gateway instances announce themselves (`lua/heartbeat.lua`).
    HEARTBEAT_SOURCE,
    HEARTBEAT_FILES = ["heartbeat.lua"]
);

/// Every script, loaded once per connection and called by SHA.
pub struct Scripts {
    pub check: Script,
    pub lease: Script,
    pub give_back: Script,
    pub refund: Script,
    pub release: Script,
    pub heartbeat: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Script::new(CHECK_SOURCE),
            lease: Script::new(LEASE_SOURCE),
            give_back: Script::new(GIVE_BACK_SOURCE),
            refund: Script::new(REFUND_SOURCE),
            release: Script::new(RELEASE_SOURCE),
            heartbeat: Script::new(HEARTBEAT_SOURCE),
        }
    }

    pub fn all(&self) -> [&Script; 6] {
        [
            &self.check,
            &self.lease,
            &self.give_back,
            &self.refund,
            &self.release,
            &self.heartbeat,
        ]
    }

    /// `check.lua`: KEYS one per policy; ARGV time, cost, slot id, then six per policy.
    pub fn check_call(&self, prefix: &str, req: &CheckRequest<'_>) -> ScriptInvocation<'_> {
        let mut invocation = self.check.prepare_invoke();
        for (i, policy) in req.policies.iter().enumerate() {
            invocation.key(key(prefix, req.partition_of(i), req.route, policy));
        }
        push_time(&mut invocation, req.at);
        invocation.arg(req.cost).arg(req.slot_id);
        for (i, p) in req.policies.iter().enumerate() {
            let is_shadow = req.shadow.get(i).copied().unwrap_or(false);
            invocation
                .arg(&*p.name)
                .arg(algorithm_code(p.algorithm))
                .arg(p.limit())
                .arg(p.window_ms())
                .arg(p.burst())
                .arg(if is_shadow { "1" } else { "0" });
        }
        invocation
    }

    /// `refund.lua`: KEYS the policies `i` of `req` that were `committed(i)`; ARGV the time
    /// they were decided at, cost, slot id, then four per key. `None` when none was.
    pub fn refund_call(
        &self,
        prefix: &str,
        req: &CheckRequest<'_>,
        committed: impl Fn(usize) -> bool,
        now: u64,
    ) -> Option<ScriptInvocation<'_>> {
        let mut invocation = self.refund.prepare_invoke();
        invocation.arg(now).arg(req.cost).arg(req.slot_id);
        let mut any = false;
        for (i, p) in req.policies.iter().enumerate() {
            if committed(i) {
                invocation
                    .key(key(prefix, req.partition_of(i), req.route, p))
                    .arg(algorithm_code(p.algorithm))
                    .arg(p.limit())
                    .arg(p.window_ms())
                    .arg(p.burst());
                any = true;
            }
        }
        any.then_some(invocation)
    }

    /// `lease.lua`: KEYS one per policy; ARGV time, need, want, then six per policy.
    pub fn lease_call(&self, prefix: &str, call: &LeaseCall<'_>) -> ScriptInvocation<'_> {
        let mut invocation = self.lease.prepare_invoke();
        for policy in call.policies {
            invocation.key(key(prefix, call.client, call.route, policy));
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
    ) -> Option<ScriptInvocation<'_>> {
        let mut invocation = self.release.prepare_invoke();
        let mut any = false;
        for policy in policies.iter().filter(|p| p.is_concurrency()) {
            invocation.key(key(prefix, client, route, policy));
            any = true;
        }
        invocation.arg(slot_id);
        any.then_some(invocation)
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
    ) -> ScriptInvocation<'_> {
        let mut invocation = self.give_back.prepare_invoke();
        for (policy, start) in policies.iter().zip(starts) {
            invocation
                .key(key(prefix, client, route, policy))
                .arg(algorithm_code(policy.algorithm))
                .arg(policy.window_ms())
                .arg(*start)
                .arg(units);
        }
        invocation
    }

    /// `heartbeat.lua`: KEYS the instances set; ARGV id, liveness, leave.
    pub fn heartbeat_call(
        &self,
        prefix: &str,
        instance: &str,
        liveness: Duration,
        leave: bool,
    ) -> ScriptInvocation<'_> {
        let mut invocation = self.heartbeat.prepare_invoke();
        invocation
            .key(instances_key(prefix))
            .arg(instance)
            .arg(liveness.as_millis() as u64)
            .arg(if leave { "1" } else { "0" });
        invocation
    }
}

impl Default for Scripts {
    fn default() -> Scripts {
        Scripts::new()
    }
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

/// `ARGV[1]` of check.lua and lease.lua: "" for Redis's clock, "<ms>", or "+<ms>" (see
/// `now_ms` in `lua/lib.lua`).
fn push_time(invocation: &mut ScriptInvocation<'_>, at: DecideAt) {
    match at {
        DecideAt::StoreClock => invocation.arg(""),
        DecideAt::Fixed(ms) => invocation.arg(ms),
        DecideAt::StoreClockPlus(ms) => invocation.arg(format!("+{ms}")),
    };
}

/// `{admitted, now, rejected name, then 4 integers per limit}` → a verdict.
pub fn parse_reply(reply: &[Value], policies: &[Policy]) -> Result<Verdict, StoreError> {
    let limits = policies.len();
    if reply.len() != 3 + 4 * limits {
        return Err(StoreError::Protocol(format!(
            "expected {} values for {limits} limits, got {}",
            3 + 4 * limits,
            reply.len()
        )));
    }
    let decisions = reply[3..]
        .chunks(4)
        .zip(policies)
        .map(|(d, policy)| {
            Ok(Decision {
                allowed: int(&d[0])? == 1,
                limit: policy.capacity(),
                remaining: int(&d[1])?,
                reset_ms: int(&d[2])?,
                retry_after_ms: int(&d[3])?,
            })
        })
        .collect::<Result<Vec<Decision>, StoreError>>()?;
    let admitted = match &reply[0] {
        Value::Int(0) => false,
        Value::Int(1) => true,
        other => {
            return Err(StoreError::Protocol(format!(
                "expected 0 or 1, got {other:?}"
            )))
        }
    };
    Ok(Verdict {
        admitted,
        decisions,
        at_ms: 0,
        from_lease: false,
    })
}

/// `{granted, now, rejected name, then 4 integers per limit}` → a grant.
pub fn parse_grant(reply: &[Value], policies: &[Policy]) -> Result<Grant, StoreError> {
    if reply.len() != 3 + 4 * policies.len() {
        return Err(StoreError::Protocol(format!(
            "expected {} values for a lease of {} limits, got {}",
            3 + 4 * policies.len(),
            policies.len(),
            reply.len()
        )));
    }
    let windows = reply[3..]
        .chunks(4)
        .map(|w| {
            Ok(GrantWindow {
                remaining: int(&w[0])?,
                reset_ms: int(&w[1])?,
                retry_after_ms: int(&w[2])?,
                start: int(&w[3])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let rejected = match &reply[2] {
        Value::BulkString(name) if !name.is_empty() => policies
            .iter()
            .position(|p| p.name.as_bytes() == name.as_slice()),
        _ => None,
    };
    Ok(Grant {
        granted: int(&reply[0])?,
        rejected,
        windows,
    })
}

pub fn int(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(StoreError::Protocol(format!(
            "expected a non-negative integer, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    #[test]
    fn each_script_is_its_listed_files_concatenated() {
        let lua = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        for (source, files) in [
            (CHECK_SOURCE, CHECK_FILES),
            (LEASE_SOURCE, LEASE_FILES),
            (GIVE_BACK_SOURCE, GIVE_BACK_FILES),
            (REFUND_SOURCE, REFUND_FILES),
            (RELEASE_SOURCE, RELEASE_FILES),
            (HEARTBEAT_SOURCE, HEARTBEAT_FILES),
        ] {
            let expected: String = files
                .iter()
                .map(|f| std::fs::read_to_string(lua.join(f)).unwrap() + "\n")
                .collect();
            assert_eq!(source, expected, "{files:?}");
        }
        // Every Lua file is part of some script.
        for entry in std::fs::read_dir(&lua).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".lua") {
                let listed = [
                    CHECK_FILES,
                    LEASE_FILES,
                    GIVE_BACK_FILES,
                    REFUND_FILES,
                    RELEASE_FILES,
                    HEARTBEAT_FILES,
                ]
                .iter()
                .any(|files| files.contains(&name.as_str()));
                assert!(listed, "{name} is in no script");
            }
        }
    }

    #[test]
    fn helpers_come_before_their_users() {
        for part in [
            "local function floor_div",
            "local function token_bucket",
            "local function fixed_window",
            "local function sliding_window",
            "local function sliding_log",
            "local algorithms =",
        ] {
            assert!(CHECK_SOURCE.contains(part), "{part}");
        }
        // Helpers come before their users, the entry point last.
        assert!(
            CHECK_SOURCE.find("local function ceil_div").unwrap()
                < CHECK_SOURCE.find("local function token_bucket").unwrap()
        );
        assert!(
            CHECK_SOURCE.find("local algorithms =").unwrap()
                > CHECK_SOURCE.find("local function sliding_log").unwrap()
        );
    }

    #[test]
    fn replies_are_checked() {
        let ok = [
            Value::Int(1),
            Value::Int(5),
            Value::SimpleString(String::new()),
            Value::Int(1),
            Value::Int(9),
            Value::Int(10),
            Value::Int(0),
        ];
        let p = Policy::new("p", Algorithm::FixedWindow, 10, 1000, 10);
        let v = parse_reply(&ok, std::slice::from_ref(&p)).unwrap();
        assert!(v.admitted);
        assert_eq!((v.decisions[0].remaining, v.decisions[0].limit), (9, 10));
        assert!(matches!(
            parse_reply(&ok, &[p.clone(), p.clone()]),
            Err(StoreError::Protocol(_))
        ));
        let mut rejected = ok.clone();
        rejected[0] = Value::Int(0);
        assert!(
            !parse_reply(&rejected, std::slice::from_ref(&p))
                .unwrap()
                .admitted
        );
        let mut bad = ok.clone();
        bad[0] = Value::Int(7);
        assert!(matches!(
            parse_reply(&bad, &[p]),
            Err(StoreError::Protocol(_))
        ));
    }
}
