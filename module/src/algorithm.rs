//! The decisions themselves, pure: a limit's stored state in, its decision and the state to
//! write out. Each mirrors its Lua file line for line (`lua/token_bucket.lua`,
//! `lua/fixed_window.lua`, `lua/sliding_window.lua`; `leaky.rs` and `logs.rs` the others),
//! in integers where Lua uses doubles that stay exact below 2^52 — so the replies are the
//! same text.

use crate::args::{Algorithm, Limit};

/// Every key lives this long past the time its state reads like a missing key
/// (`lua/lib.lua`'s TTL_GRACE_MS).
pub const TTL_GRACE_MS: i64 = 1000;

/// A limit's stored state, as the Lua scripts keep it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum State {
    /// No key: a full bucket, an empty window.
    #[default]
    Missing,
    /// A bucket's STRING "<level> <updated>[ <turn> …]" (a leaky bucket's turns given back).
    Bucket {
        level: i64,
        updated: i64,
        turns: Vec<i64>,
    },
    /// A window's HASH: `s` (its start), `c`, and `p` (a sliding window's previous count).
    Window {
        start: i64,
        count: i64,
        previous: i64,
    },
    /// A ZSET's live scores, ascending: a sliding log's entries after `now - window`, or the
    /// concurrency slots expiring after `now`.
    Live(Vec<i64>),
}

/// What a limit reports: admitted, remaining, reset_ms, retry_after_ms (check.lua's four).
pub type Report = [i64; 4];

/// The state to write when the decision commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// `SET key "<level> <time>[ <turn> …]" PX ttl`.
    Bucket {
        level: i64,
        time: i64,
        turns: Vec<i64>,
        ttl: i64,
    },
    /// `HSET key c count` (the window the key holds: its TTL stays).
    Count { count: i64 },
    /// `HSET key s start c count [p previous]`, then `PEXPIRE key ttl`.
    Window {
        start: i64,
        count: i64,
        previous: Option<i64>,
        ttl: i64,
    },
    /// `ZREMRANGEBYSCORE key -inf trim`, then `units` members "<at>:<ordinal>" scored `at`,
    /// ordinals counted on from `ordinal` past those taken (`ZADD NX`), then `PEXPIRE ttl`.
    Log {
        trim: i64,
        at: i64,
        units: i64,
        ordinal: i64,
        ttl: i64,
    },
    /// `ZREMRANGEBYSCORE key -inf trim`, then (`take`) the request's slot scored `expires`
    /// and `PEXPIRE ttl`.
    Slot {
        trim: i64,
        take: bool,
        expires: i64,
        ttl: i64,
    },
}

pub fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1).div_euclid(b)
}

/// `limit` decided at `now` for `cost` units on `state`: its report, and the write that
/// commits it (None when it does not admit).
pub fn decide(limit: &Limit, state: &State, now: i64, cost: i64) -> (Report, Option<Write>) {
    match limit.algorithm {
        Algorithm::TokenBucket { burst } => {
            token_bucket(state, now, cost, limit.limit, limit.window, burst)
        }
        Algorithm::FixedWindow => {
            let start = now - now % limit.window;
            window_in(state, now, cost, limit.limit, start, start + limit.window)
        }
        Algorithm::CalendarWindow {
            bounds: [p, s, e, n],
        } => {
            if now < s {
                window_in(state, now, cost, limit.limit, p, s)
            } else if now >= e {
                window_in(state, now, cost, limit.limit, e, n)
            } else {
                window_in(state, now, cost, limit.limit, s, e)
            }
        }
        Algorithm::SlidingWindow => sliding_window(state, now, cost, limit.limit, limit.window),
        Algorithm::LeakyBucket { burst, delay } => {
            crate::leaky::leaky_bucket(state, now, cost, limit, (burst, delay))
        }
        Algorithm::SlidingLog => crate::logs::sliding_log(state, now, cost, limit),
        Algorithm::Concurrency => crate::logs::concurrency(state, now, cost, limit),
    }
}

fn token_bucket(
    state: &State,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
    burst: i64,
) -> (Report, Option<Write>) {
    let cap = burst * window;
    let (mut level, updated) = match *state {
        State::Bucket { level, updated, .. } => (level, updated),
        _ => (cap, 0),
    };
    let elapsed = (now - updated).max(0);
    level = cap.min(level.saturating_add(elapsed.saturating_mul(limit)));
    let time = now.max(updated);
    let need = cost.saturating_mul(window);
    if level >= need {
        let after = level - need;
        let reset = ceil_div(cap - after, limit);
        let write = Write::Bucket {
            level: after,
            time,
            turns: Vec::new(),
            ttl: reset + TTL_GRACE_MS,
        };
        return ([1, after / window, reset, 0], Some(write));
    }
    let retry = if need > cap {
        window
    } else {
        ceil_div(need - level, limit)
    };
    (
        [0, level / window, ceil_div(cap - level, limit), retry],
        None,
    )
}

fn window_in(
    state: &State,
    now: i64,
    cost: i64,
    limit: i64,
    start: i64,
    stop: i64,
) -> (Report, Option<Write>) {
    let (count, same) = match *state {
        State::Window {
            start: s, count, ..
        } if s == start => (count, true),
        _ => (0, false),
    };
    let reset = stop - now;
    if count.saturating_add(cost) <= limit {
        let after = count + cost;
        let write = if same {
            Write::Count { count: after }
        } else {
            Write::Window {
                start,
                count: after,
                previous: None,
                ttl: reset + TTL_GRACE_MS,
            }
        };
        return ([1, limit - after, reset, 0], Some(write));
    }
    ([0, (limit - count).max(0), reset, reset], None)
}

fn sliding_window(
    state: &State,
    now: i64,
    cost: i64,
    limit: i64,
    window: i64,
) -> (Report, Option<Write>) {
    let start = now - now % window;
    let (cur, prev, same) = match *state {
        State::Window {
            start: s,
            count,
            previous,
        } if s == start => (count, previous, true),
        State::Window {
            start: s, count, ..
        } if s + window == start => (0, count, false),
        _ => (0, 0, false),
    };
    let until_next = window - (now - start);
    let used = prev
        .saturating_mul(until_next)
        .saturating_add(cur.saturating_mul(window));
    let capacity = limit * window;
    let need = cost.saturating_mul(window);
    if used.saturating_add(need) <= capacity {
        let after = used + need;
        let count = cur + cost;
        let write = if same {
            Write::Count { count }
        } else {
            let ttl = start + 2 * window - now + TTL_GRACE_MS;
            Write::Window {
                start,
                count,
                previous: Some(prev),
                ttl,
            }
        };
        return ([1, (capacity - after) / window, until_next, 0], Some(write));
    }
    let retry = if cost > limit {
        window
    } else if cur + cost <= limit {
        // Fits once the previous window has decayed enough, within this window.
        until_next - ((limit - cur - cost) * window).div_euclid(prev)
    } else {
        // Only after this window ends, when `cur` becomes the previous window.
        until_next + (window - ((limit - cost) * window).div_euclid(cur))
    };
    ([0, (capacity - used).max(0) / window, retry, retry], None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::decision;

    fn limit(spec: &str) -> Limit<'static> {
        let args: Vec<&'static [u8]> = format!(",1,,{spec}")
            .leak()
            .split(',')
            .map(str::as_bytes)
            .collect();
        decision(1, &args).unwrap().limits.remove(0)
    }

    #[test]
    fn a_token_bucket_drains_and_refills_exactly() {
        let tb = limit("a,tb,2,1000,3,0");
        let (report, write) = decide(&tb, &State::Missing, 10_000, 3);
        assert_eq!(report, [1, 0, 1500, 0]);
        let Some(Write::Bucket {
            level, time, ttl, ..
        }) = write
        else {
            panic!("no write")
        };
        assert_eq!((level, time, ttl), (0, 10_000, 2500));
        let state = State::Bucket {
            level,
            updated: time,
            turns: Vec::new(),
        };
        assert_eq!(decide(&tb, &state, 10_200, 1).0, [0, 0, 1300, 300]);
        assert_eq!(decide(&tb, &state, 10_500, 1).0, [1, 0, 1500, 0]);
    }

    #[test]
    fn a_leaky_bucket_gives_a_turn_given_back_to_the_next_request() {
        // 1 per second, 2 may wait, none passes at once past the first.
        let lb = limit("a,lb,1,1000,2:0,0");
        let state = State::Bucket {
            level: 2000,
            updated: 0,
            turns: vec![300, 100, 50],
        };
        // At 80 the turn at 100 is the earliest still ahead: taken, the backlog unchanged.
        let (report, write) = decide(&lb, &state, 80, 1);
        assert_eq!(report, [1, 0, 1920, 20]);
        let Some(Write::Bucket { level, turns, .. }) = write else {
            panic!("no write")
        };
        assert_eq!((level, turns), (1920, vec![300]));
    }

    #[test]
    fn a_sliding_log_waits_for_its_oldest_entries() {
        let sl = limit("a,sl,2,1000,2,0");
        let state = State::Live(vec![100, 400]);
        assert_eq!(decide(&sl, &state, 500, 1).0, [0, 0, 600, 600]);
        assert_eq!(decide(&sl, &state, 500, 2).0, [0, 0, 600, 900]);
        let cc = limit("a,cc,2,1000,2,0");
        assert_eq!(decide(&cc, &State::Live(vec![900]), 500, 1).0, [1, 0, 0, 0]);
        assert_eq!(decide(&cc, &state, 500, 1).0, [0, 0, 0, 1000]);
    }

    #[test]
    fn a_sliding_window_weighs_the_previous_window() {
        let sw = limit("a,sw,4,1000,4,0");
        let state = State::Window {
            start: 0,
            count: 4,
            previous: 0,
        };
        // At 1500 the previous window (4) weighs half: 2 used, 2 left.
        let (report, write) = decide(&sw, &state, 1500, 2);
        assert_eq!(report, [1, 0, 500, 0]);
        assert!(matches!(
            write,
            Some(Write::Window {
                start: 1000,
                count: 2,
                previous: Some(4),
                ..
            })
        ));
        assert_eq!(decide(&sw, &state, 1500, 3).0[0], 0);
    }
}
