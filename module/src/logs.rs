//! The two ZSET algorithms, pure: the sliding log (`lua/sliding_log.lua`: one member per
//! admitted unit, scored by its time) and concurrency (`lua/concurrency.lua`: one member per
//! request in flight, scored by when its slot lapses). `State::Live` holds the live scores,
//! ascending, as the store read them.

use crate::algorithm::{Report, State, Write, TTL_GRACE_MS};
use crate::args::Limit;

fn live(state: &State) -> &[i64] {
    match state {
        State::Live(scores) => scores,
        _ => &[],
    }
}

pub fn sliding_log(state: &State, now: i64, cost: i64, limit: &Limit) -> (Report, Option<Write>) {
    let (max, window) = (limit.limit, limit.window);
    let entries = live(state);
    let count = entries.len() as i64;
    // The time of the live entry at `offset` (ascending), or now when there is none.
    let time_of = |offset: i64| {
        usize::try_from(offset)
            .ok()
            .and_then(|i| entries.get(i))
            .copied()
            .unwrap_or(now)
    };
    if count.saturating_add(cost) <= max {
        let oldest = time_of(0);
        let write = Write::Log {
            trim: now - window,
            at: now,
            units: cost,
            ordinal: count,
            ttl: window + TTL_GRACE_MS,
        };
        return (
            [1, max - count - cost, oldest + window - now, 0],
            Some(write),
        );
    }
    let retry = if cost > max {
        window
    } else {
        time_of(count + cost - max - 1) + window - now
    };
    let report = [0, (max - count).max(0), time_of(0) + window - now, retry];
    (report, None)
}

pub fn concurrency(state: &State, now: i64, cost: i64, limit: &Limit) -> (Report, Option<Write>) {
    let live = live(state).len() as i64;
    let take = cost > 0;
    if live + i64::from(take) <= limit.limit {
        let write = Write::Slot {
            trim: now,
            take,
            expires: now + limit.window,
            ttl: limit.window + TTL_GRACE_MS,
        };
        return ([1, limit.limit - live - i64::from(take), 0, 0], Some(write));
    }
    ([0, 0, 0, 1000], None)
}
