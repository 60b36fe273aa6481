//! The leaky bucket that delays (nginx's `limit_req`), pure: `lua/leaky_bucket.lua` in
//! integers. The level is a backlog in request·ms, drained at `limit` per ms; a request of
//! cost 1 that would wait takes the earliest turn given back (a refund) still ahead instead.

use crate::algorithm::{ceil_div, Report, State, Write, TTL_GRACE_MS};
use crate::args::Limit;

pub fn leaky_bucket(
    state: &State,
    now: i64,
    cost: i64,
    limit: &Limit,
    (burst, delay): (i64, i64),
) -> (Report, Option<Write>) {
    let (rate, window) = (limit.limit, limit.window);
    let (burst, delay) = (burst * window, delay * window);
    let (mut level, updated, turns) = match state {
        State::Bucket {
            level,
            updated,
            turns,
        } => (*level, *updated, turns.as_slice()),
        _ => (0, 0, [].as_slice()),
    };
    let elapsed = (now - updated).max(0);
    level = (level - elapsed.saturating_mul(rate)).max(0);
    let now = now.max(updated);
    let mut holes: Vec<i64> = turns.iter().copied().filter(|&h| h > now).collect();
    // The earliest turn ahead (the first of equals, as the script's strict `<`).
    let first = (0..holes.len()).reduce(|a, b| if holes[b] < holes[a] { b } else { a });
    let write = |level: i64, holes: Vec<i64>, reset: i64| Write::Bucket {
        level,
        time: now,
        turns: holes,
        ttl: reset + TTL_GRACE_MS,
    };
    if let (1, true, Some(first)) = (cost, level > delay, first) {
        let wait = holes.remove(first) - now;
        let remaining = if level < burst {
            (burst - level) / window
        } else {
            0
        };
        let reset = ceil_div(level, rate);
        return (
            [1, remaining, reset, wait],
            Some(write(level, holes, reset)),
        );
    }
    if level <= burst {
        let after = level + cost.saturating_mul(window);
        let wait = ceil_div((level - delay).max(0), rate);
        let remaining = if after <= burst {
            (burst - after) / window + 1
        } else {
            0
        };
        let reset = ceil_div(after, rate);
        return (
            [1, remaining, reset, wait],
            Some(write(after, holes, reset)),
        );
    }
    (
        [0, 0, ceil_div(level, rate), ceil_div(level - burst, rate)],
        None,
    )
}
