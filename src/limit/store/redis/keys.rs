//! Redis key names. The client id is the hash tag: one client's keys share a Cluster slot (so
//! one script can touch them all) while clients spread over slots. The definition in the key
//! means a changed limit starts from fresh keys; old keys expire by their TTL.

use crate::limit::{Algorithm, Policy, Scope};

/// The marker of a call after a decision (a charge, a refund: `lua/lib.lua`'s
/// `applied_before`), in the hash slot of `sibling` (one of the call's keys, whose `{tag}` it
/// takes), so that a Cluster routes it with them.
pub fn once_key(prefix: &str, sibling: &str, id: &str) -> String {
    let tag = sibling
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or("", |(tag, _)| tag);
    format!("{prefix}:{{{tag}}}:once:{id}")
}

/// `<prefix>:{<client>}:<route>:<name>@<definition>`; `*` as the route of a client-wide
/// (all routes) limit. Appended piece by piece, no formatting machinery: this runs for every
/// limit of every decision.
pub fn key(prefix: &str, client: &str, route: &str, policy: &Policy) -> String {
    let mut key = String::with_capacity(
        prefix.len() + client.len() + route.len() + policy.name.len() + DEFINITION,
    );
    let route = match policy.scope {
        Scope::Route => route,
        Scope::Client => "*",
    };
    for part in [prefix, ":{", client, "}:", route, ":", &policy.name, "@"] {
        key.push_str(part);
    }
    if let Some(calendar) = policy.calendar() {
        key.push_str("cw");
        numbers(&mut key, &[policy.limit()]);
        for part in ["/", calendar.unit.as_str(), "/", &calendar.zone] {
            key.push_str(part);
        }
        return key;
    }
    match policy.algorithm {
        // `lb2:`, `tb2:`: the buckets' second form, one STRING each (lua/leaky_bucket.lua,
        // lua/token_bucket.lua); the first, a HASH, was named `lb<limit>/…`, `tb<limit>/…`,
        // so gateways of both versions never share a key.
        Algorithm::LeakyBucket => {
            key.push_str("lb2:");
            let (limit, window, burst) = (policy.limit(), policy.window_ms(), policy.burst());
            numbers(&mut key, &[limit, window, burst, policy.delay()]);
        }
        Algorithm::TokenBucket => {
            key.push_str("tb2:");
            numbers(
                &mut key,
                &[policy.limit(), policy.window_ms(), policy.burst()],
            );
        }
        other => {
            key.push_str(algorithm_code(other));
            numbers(&mut key, &[policy.limit(), policy.window_ms()]);
        }
    }
    key
}

/// Room for a definition's numbers and codes, reserved with the key.
const DEFINITION: usize = 48;

/// `values` in decimal, `/` between them.
fn numbers(key: &mut String, values: &[u64]) {
    let mut digits = itoa::Buffer::new();
    for (i, &value) in values.iter().enumerate() {
        if i > 0 {
            key.push('/');
        }
        key.push_str(digits.format(value));
    }
}

/// What the scripts call a policy's algorithm: its algorithm, or `cw` for a fixed window on
/// the calendar.
pub fn policy_code(policy: &Policy) -> &'static str {
    match policy.calendar() {
        Some(_) => "cw",
        None => algorithm_code(policy.algorithm),
    }
}

pub fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::LeakyBucket => "lb",
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::SlidingLog => "sl",
        Algorithm::Concurrency => "cc",
    }
}

/// The instances' heartbeat set.
pub fn instances_key(prefix: &str) -> String {
    format!("{prefix}:instances")
}

/// What each instance says of itself (version, start): its hash tag is the instances set's
/// whole name, so both keys share a Redis Cluster slot (and the set keeps its old name).
pub fn instances_info_key(prefix: &str) -> String {
    format!("{{{prefix}:instances}}:info")
}

/// Who each instance refused most lately, beside the heartbeat (same Cluster slot).
pub fn instances_limited_key(prefix: &str) -> String {
    format!("{{{prefix}:instances}}:limited")
}

/// The client registry's hash and version counter: one hash tag, one Cluster slot.
pub fn registry_keys(prefix: &str) -> (String, String) {
    (
        format!("{{{prefix}:registry}}:clients"),
        format!("{{{prefix}:registry}}:version"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::calendar::Unit;

    #[test]
    fn keys_put_the_client_in_the_hash_tag_and_the_definition_last() {
        let p = Policy::new("per-minute", Algorithm::SlidingWindow, 100, 60_000, 100);
        assert_eq!(
            key("turnstile", "ada", "orders", &p),
            "turnstile:{ada}:orders:per-minute@sw100/60000"
        );
        let p = Policy::new("burst", Algorithm::TokenBucket, 10, 1000, 20);
        assert_eq!(
            key("gw1", "ada", "orders", &p),
            "gw1:{ada}:orders:burst@tb2:10/1000/20"
        );
        let p = Policy::leaky_bucket("smooth", 10, 1000, 20, 5).unwrap();
        assert_eq!(
            key("gw1", "ada", "orders", &p),
            "gw1:{ada}:orders:smooth@lb2:10/1000/20/5"
        );
        let month = crate::limit::calendar::Calendar::new(Unit::Month, "Europe/Berlin").unwrap();
        let p = Policy::calendar_window("monthly", 5000, month).unwrap();
        assert_eq!(
            key("gw1", "ada", "orders", &p),
            "gw1:{ada}:orders:monthly@cw5000/month/Europe/Berlin"
        );
        let p = Policy::concurrency("concurrency", 3, 30_000, Scope::Client).unwrap();
        assert_eq!(
            key("gw1", "ada", "orders", &p),
            "gw1:{ada}:*:concurrency@cc3/30000"
        );
    }
}
