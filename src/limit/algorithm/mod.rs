//! The rate-limiting algorithms as pure functions of `(state, now, policy, cost)`.
//!
//! Everything is integer milliseconds and integer arithmetic, so the Lua scripts of the Redis
//! store (which compute with doubles, exact below 2^53) can make bit-for-bit the same
//! decisions; `tests/limits/lua_agrees.rs` checks that on random sequences. Validation keeps every
//! intermediate product below [`MAX_PRODUCT`].
//!
//! One file per algorithm, each mirroring its Lua script in `lua/`:
//!
//! - **Token bucket**: capacity `burst`, refilled at `limit` per `window`. The level is kept
//!   scaled by `window_ms` (one token = `window_ms` units, refill = `limit` units per ms), which
//!   makes refill exact for any rate.
//! - **Leaky bucket** (delaying): the backlog of requests ahead, drained at `limit` per
//!   `window` and kept scaled like the token bucket; up to `delay` ahead pass at once, up to
//!   `burst` are admitted to wait their turn (the wait is the decision's `retry_after_ms`),
//!   beyond that refused.
//! - **Fixed window**: one counter per aligned window (`now / window`). Cheapest; admits up to
//!   twice the limit around a window edge.
//! - **Sliding window counter**: the current and previous aligned windows; the previous one
//!   weighs `(window - elapsed) / window`. Compared multiplied through by `window`, so exact.
//! - **Sliding log**: the timestamps (and costs) admitted in the last `window`; exact, memory
//!   grows with the limit.

mod concurrency;
mod fixed_window;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use concurrency::Concurrency;
pub use fixed_window::FixedWindow;
pub use leaky_bucket::LeakyBucket;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

use crate::limit::{Algorithm, Decision, Policy};

/// Upper bound for any product the algorithms form (`burst * window_ms`, `limit * window_ms`):
/// below 2^53, so doubles in Lua represent it exactly.
pub const MAX_PRODUCT: u64 = 1 << 52;

/// Algorithm state for one (client, route, policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    TokenBucket(TokenBucket),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    SlidingLog(SlidingLog),
    Concurrency(Concurrency),
}

impl State {
    /// The state a key has before its first request (a full bucket, empty windows).
    pub fn new(policy: &Policy) -> State {
        match policy.algorithm {
            Algorithm::TokenBucket => State::TokenBucket(TokenBucket::full(policy)),
            Algorithm::LeakyBucket => State::LeakyBucket(LeakyBucket::default()),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindow::default()),
            Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindow::default()),
            Algorithm::SlidingLog => State::SlidingLog(SlidingLog::default()),
            Algorithm::Concurrency => State::Concurrency(Concurrency::default()),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::LeakyBucket(_) => Algorithm::LeakyBucket,
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingWindow(_) => Algorithm::SlidingWindow,
            State::SlidingLog(_) => Algorithm::SlidingLog,
            State::Concurrency(_) => Algorithm::Concurrency,
        }
    }

    /// Decides a request of `cost` at `now` and returns the decision and the state to store if
    /// the request is admitted (a rejected request changes nothing worth storing).
    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, State) {
        match self {
            State::TokenBucket(s) => {
                let (d, s) = s.decide(policy, now, cost);
                (d, State::TokenBucket(s))
            }
            State::LeakyBucket(s) => {
                let (d, s) = s.decide(policy, now, cost);
                (d, State::LeakyBucket(s))
            }
            State::FixedWindow(s) => {
                let (d, s) = s.decide(policy, now, cost);
                (d, State::FixedWindow(s))
            }
            State::SlidingWindow(s) => {
                let (d, s) = s.decide(policy, now, cost);
                (d, State::SlidingWindow(s))
            }
            State::SlidingLog(s) => {
                let (d, s) = s.clone().decide(policy, now, cost);
                (d, State::SlidingLog(s))
            }
            State::Concurrency(s) => {
                let (d, s) = s.decide(policy, cost);
                (d, State::Concurrency(s))
            }
        }
    }

    /// Gives back what a request of `cost` admitted at `at` took (it was not served after all:
    /// shed). The same undo as `lua/refund.lua`: window counts leave the window they were
    /// counted in, tokens go back up to the capacity, the log loses that request's entry.
    /// Concurrency slots are released, not refunded.
    /// A leaky bucket's turn is given back as [`LeakyBucket::give_back`] says (`wait`: how
    /// long the request was to be held).
    pub fn refund(&mut self, policy: &Policy, at: u64, cost: u64, wait: u64) {
        let w = policy.window_ms;
        match self {
            State::TokenBucket(s) => {
                s.level = (s.level + cost * w).min(policy.burst * w);
            }
            State::LeakyBucket(s) => s.give_back(policy, at, cost, wait),
            State::FixedWindow(s) => {
                if s.window_start == policy.fixed_window_at(at).0 {
                    s.count = s.count.saturating_sub(cost);
                }
            }
            State::SlidingWindow(s) => {
                let start = at - at % w;
                if s.window_start == start {
                    s.current = s.current.saturating_sub(cost);
                } else if s.window_start == start + w {
                    s.previous = s.previous.saturating_sub(cost);
                }
            }
            State::SlidingLog(s) => {
                if let Some(i) = s.entries.iter().rposition(|e| *e == (at, cost)) {
                    s.entries.remove(i);
                }
            }
            State::Concurrency(_) => {}
        }
    }

    /// Charges what a request admitted at `at` turned out to cost beyond (or short of) its
    /// estimate — `delta` units, known once the response came (`now`): more is counted in the
    /// window current at `now`, never past twice the limit (a budget may go below zero by
    /// at most one budget); less is given back to the window the request was counted in, as
    /// a refund is. Only window counters are charged this way (`lua/charge.lua`).
    pub fn charge(&mut self, policy: &Policy, at: u64, now: u64, delta: i64) {
        let most = 2 * policy.limit;
        if delta < 0 {
            return self.refund(policy, at, delta.unsigned_abs(), 0);
        }
        let delta = delta as u64;
        match self {
            State::FixedWindow(s) => {
                let (start, _) = policy.fixed_window_at(now);
                let count = if s.window_start == start { s.count } else { 0 };
                *s = FixedWindow {
                    window_start: start,
                    count: (count + delta).min(most),
                };
            }
            State::SlidingWindow(s) => {
                let rolled = s.rolled(policy.window_ms, now);
                *s = SlidingWindow {
                    current: (rolled.current + delta).min(most),
                    ..rolled
                };
            }
            State::TokenBucket(_)
            | State::LeakyBucket(_)
            | State::SlidingLog(_)
            | State::Concurrency(_) => {}
        }
    }

    /// True when this state carries no information any more (equal to a fresh one), so it
    /// can be dropped without changing any future decision.
    pub fn is_idle(&self, policy: &Policy, now: u64) -> bool {
        match self {
            State::TokenBucket(s) => s.level_at(policy, now) >= policy.burst * policy.window_ms,
            State::LeakyBucket(s) => s.level_at(policy, now) == 0,
            State::FixedWindow(s) => {
                s.count == 0 || now >= policy.fixed_window_at(s.window_start).1
            }
            State::SlidingWindow(s) => {
                (s.current == 0 && s.previous == 0) || now >= s.window_start + 2 * policy.window_ms
            }
            State::SlidingLog(s) => s
                .entries
                .back()
                .is_none_or(|(ts, _)| ts + policy.window_ms <= now),
            State::Concurrency(s) => s.in_flight == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(algorithm: Algorithm, limit: u64, window_ms: u64) -> Policy {
        Policy::new("p", algorithm, limit, window_ms, limit)
    }

    /// Runs requests at the given times; returns which were admitted.
    fn run(p: &Policy, times: &[u64], cost: u64) -> (Vec<bool>, Vec<Decision>, State) {
        let mut state = State::new(p);
        let mut allowed = Vec::new();
        let mut decisions = Vec::new();
        for &t in times {
            let (d, next) = state.decide(p, t, cost);
            if d.allowed {
                state = next;
            }
            allowed.push(d.allowed);
            decisions.push(d);
        }
        (allowed, decisions, state)
    }

    const T0: u64 = 1_000_000_000; // aligned to 1s and 1m windows

    #[test]
    fn token_bucket_allows_burst_then_refills_at_rate() {
        let p = Policy::new("p", Algorithm::TokenBucket, 10, 1000, 5); // 10/s, burst 5
        let (allowed, d, _) = run(&p, &[T0; 6], 1);
        assert_eq!(allowed, [true, true, true, true, true, false]);
        assert_eq!(d[4].remaining, 0);
        // One token takes 100 ms to come back.
        assert_eq!(d[5].retry_after_ms, 100);
        assert_eq!(d[0].remaining, 4);
        assert_eq!(d[0].reset_ms, 100); // one token short of full
    }

    #[test]
    fn token_bucket_retry_after_is_exact_for_odd_rates() {
        // 3 per second: a token every 333.33 ms; after draining, the first comes at 334 ms.
        let p = Policy::new("p", Algorithm::TokenBucket, 3, 1000, 3);
        let (allowed, d, state) = run(&p, &[T0, T0, T0, T0], 1);
        assert_eq!(allowed, [true, true, true, false]);
        assert_eq!(d[3].retry_after_ms, 334);
        let State::TokenBucket(tb) = state else {
            unreachable!()
        };
        assert!(!tb.decide(&p, T0 + 333, 1).0.allowed);
        assert!(tb.decide(&p, T0 + 334, 1).0.allowed);
    }

    #[test]
    fn token_bucket_cost_takes_several_tokens() {
        let p = Policy::new("p", Algorithm::TokenBucket, 10, 1000, 10);
        let (allowed, d, _) = run(&p, &[T0, T0, T0], 4);
        assert_eq!(allowed, [true, true, false]);
        assert_eq!(d[1].remaining, 2);
        assert_eq!(d[2].retry_after_ms, 200); // 2 more tokens at 10/s
    }

    #[test]
    fn token_bucket_clock_going_back_refills_nothing() {
        let p = Policy::new("p", Algorithm::TokenBucket, 10, 1000, 1);
        let (_, _, state) = run(&p, &[T0], 1);
        let State::TokenBucket(tb) = state else {
            unreachable!()
        };
        let (d, _) = tb.decide(&p, T0 - 5_000, 1);
        assert!(!d.allowed);
    }

    #[test]
    fn fixed_window_resets_at_the_aligned_edge_and_admits_a_double_burst() {
        let p = policy(Algorithm::FixedWindow, 3, 1000);
        let end = T0 + 999;
        let (allowed, d, _) = run(
            &p,
            &[end, end, end, end, T0 + 1000, T0 + 1000, T0 + 1000],
            1,
        );
        assert_eq!(allowed, [true, true, true, false, true, true, true]);
        assert_eq!(d[3].retry_after_ms, 1);
        assert_eq!(d[4].reset_ms, 1000);
        assert_eq!(d[4].remaining, 2);
    }

    #[test]
    fn sliding_window_blocks_the_edge_burst() {
        let p = policy(Algorithm::SlidingWindow, 3, 1000);
        let end = T0 + 999;
        // Three at the end of one window, then at the start of the next the previous window
        // still weighs 999/1000: nothing fits.
        let (allowed, d, _) = run(&p, &[end, end, end, T0 + 1000], 1);
        assert_eq!(allowed, [true, true, true, false]);
        // Needs previous·(1000 - e) <= (3 - 0 - 1)·1000 → e >= 334 ms into the window.
        assert_eq!(d[3].retry_after_ms, 334);
    }

    #[test]
    fn sliding_window_releases_the_previous_windows_share_over_time() {
        let p = policy(Algorithm::SlidingWindow, 10, 1000);
        // 10 in the previous window.
        let mut times = vec![T0; 10];
        // Halfway into the next window, the previous weighs 0.5: 5 more fit.
        times.extend([T0 + 1500; 6]);
        let (allowed, d, _) = run(&p, &times, 1);
        assert_eq!(allowed.iter().filter(|a| **a).count(), 15);
        assert!(!allowed[15]);
        assert_eq!(d[14].remaining, 0);
        // The next unit frees when 10·(1000-e) <= (10-5-1)·1000 → e >= 600: 100 ms later.
        assert_eq!(d[15].retry_after_ms, 100);
    }

    #[test]
    fn sliding_window_full_current_window_waits_for_the_next_one() {
        let p = policy(Algorithm::SlidingWindow, 4, 1000);
        let (allowed, d, _) = run(&p, &[T0 + 200; 5], 1);
        assert_eq!(allowed, [true, true, true, true, false]);
        // 800 ms until the window ends, then 4·(1000-e) <= 3·1000 → e >= 250.
        assert_eq!(d[4].retry_after_ms, 800 + 250);
    }

    #[test]
    fn sliding_log_is_exact() {
        let p = policy(Algorithm::SlidingLog, 3, 1000);
        let (allowed, d, _) = run(
            &p,
            &[T0, T0 + 100, T0 + 200, T0 + 300, T0 + 1000, T0 + 1001],
            1,
        );
        assert_eq!(allowed, [true, true, true, false, true, false]);
        assert_eq!(d[3].retry_after_ms, 700); // the entry at T0 expires at T0+1000
        assert_eq!(d[5].retry_after_ms, 99); // the entry at T0+100 expires at T0+1100
    }

    #[test]
    fn sliding_log_with_cost_waits_for_enough_entries() {
        let p = policy(Algorithm::SlidingLog, 5, 1000);
        let (allowed, d, _) = run(&p, &[T0, T0 + 100, T0 + 200], 2);
        assert_eq!(allowed, [true, true, false]);
        // Count 4, cost 2, limit 5: one unit must go; the first entry (2 units) expires at T0+1000.
        assert_eq!(d[2].retry_after_ms, 800);
    }

    #[test]
    fn idle_states_are_those_equal_to_fresh_ones() {
        let p = Policy::new("p", Algorithm::TokenBucket, 10, 1000, 10);
        let (_, _, s) = run(&p, &[T0], 1);
        assert!(!s.is_idle(&p, T0 + 50));
        assert!(s.is_idle(&p, T0 + 100));
        let p = policy(Algorithm::SlidingWindow, 10, 1000);
        let (_, _, s) = run(&p, &[T0], 1);
        assert!(!s.is_idle(&p, T0 + 1999));
        assert!(s.is_idle(&p, T0 + 2000));
        let p = policy(Algorithm::SlidingLog, 10, 1000);
        let (_, _, s) = run(&p, &[T0], 1);
        assert!(!s.is_idle(&p, T0 + 999));
        assert!(s.is_idle(&p, T0 + 1000));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Random request sequences: (gap before the request in ms, cost).
        fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
            prop::collection::vec((0u64..400, 1u64..4), 1..300)
        }

        fn admitted(p: &Policy, reqs: &[(u64, u64)]) -> Vec<(u64, u64)> {
            let mut state = State::new(p);
            let mut now = T0;
            let mut out = Vec::new();
            for &(gap, cost) in reqs {
                now += gap;
                let (d, next) = state.decide(p, now, cost);
                if d.allowed {
                    state = next;
                    out.push((now, cost));
                }
            }
            out
        }

        proptest! {
            #[test]
            fn token_bucket_never_exceeds_burst_plus_rate_times_elapsed(
                reqs in requests(), limit in 1u64..50, window_ms in 1u64..5000, burst in 3u64..40,
            ) {
                let p = Policy::new("p", Algorithm::TokenBucket, limit, window_ms, burst);
                let ok = admitted(&p, &reqs);
                // Over every interval [a, b] of admitted requests:
                // units·window <= burst·window + (b - a)·limit.
                for i in 0..ok.len() {
                    let mut units = 0;
                    for j in i..ok.len() {
                        units += ok[j].1;
                        let elapsed = ok[j].0 - ok[i].0;
                        prop_assert!(units * window_ms <= burst * window_ms + elapsed * limit,
                            "{units} units in {elapsed} ms");
                    }
                }
            }

            #[test]
            fn sliding_log_never_exceeds_the_limit_in_any_window(
                reqs in requests(), limit in 3u64..30, window_ms in 1u64..3000,
            ) {
                let p = Policy::new("p", Algorithm::SlidingLog, limit, window_ms, limit);
                let ok = admitted(&p, &reqs);
                for i in 0..ok.len() {
                    let units: u64 = ok[i..].iter().take_while(|(t, _)| *t < ok[i].0 + window_ms).map(|(_, c)| c).sum();
                    prop_assert!(units <= limit);
                }
            }

            #[test]
            fn fixed_window_never_exceeds_the_limit_per_aligned_window(
                reqs in requests(), limit in 3u64..30, window_ms in 1u64..3000,
            ) {
                let p = Policy::new("p", Algorithm::FixedWindow, limit, window_ms, limit);
                let ok = admitted(&p, &reqs);
                let mut per_window = std::collections::HashMap::new();
                for (t, c) in ok {
                    *per_window.entry(t / window_ms).or_insert(0) += c;
                }
                prop_assert!(per_window.values().all(|&u| u <= limit));
            }

            #[test]
            fn sliding_window_admits_at_most_the_limit_per_aligned_window(
                reqs in requests(), limit in 3u64..30, window_ms in 1u64..3000,
            ) {
                let p = Policy::new("p", Algorithm::SlidingWindow, limit, window_ms, limit);
                let mut per_window = std::collections::HashMap::new();
                for (t, c) in admitted(&p, &reqs) {
                    *per_window.entry(t / window_ms).or_insert(0) += c;
                }
                prop_assert!(per_window.values().all(|&u| u <= limit));
            }

            #[test]
            fn leaky_bucket_turns_are_spaced_at_the_rate(
                reqs in requests(), limit in 1u64..50, window_ms in 1u64..5000, burst in 0u64..20,
            ) {
                let p = Policy::leaky_bucket("p", limit, window_ms, burst, 0).unwrap();
                let mut state = State::new(&p);
                let mut now = T0;
                let mut last: Option<(u64, u64)> = None; // (turn, cost)
                for &(gap, cost) in &reqs {
                    now += gap;
                    let (d, next) = state.decide(&p, now, cost);
                    if !d.allowed {
                        continue;
                    }
                    state = next;
                    let turn = now + d.retry_after_ms;
                    prop_assert!(d.retry_after_ms <= (burst * window_ms).div_ceil(limit), "waits past the burst");
                    if let Some((prev, prev_cost)) = last {
                        // The turns leave `cost × window / limit` ms apart (to the ms).
                        prop_assert!((turn - prev + 1) * limit >= prev_cost * window_ms,
                            "turns {prev} then {turn}");
                    }
                    last = Some((turn, cost));
                }
            }

            #[test]
            fn turns_given_back_are_reused_without_doubling_up(
                reqs in requests(), leaves in proptest::collection::vec(any::<u8>(), 300),
                limit in 1u64..50, window_ms in 1u64..5000, burst in 0u64..20,
            ) {
                let p = Policy::leaky_bucket("p", limit, window_ms, burst, 0).unwrap();
                let mut state = State::new(&p);
                let mut now = T0;
                // Turns forwarded, and (decided at, wait) of requests still held.
                let mut used = Vec::new();
                let mut held: Vec<(u64, u64)> = Vec::new();
                for (k, &(gap, _)) in reqs.iter().enumerate() {
                    now += gap;
                    // Held requests whose turn came are forwarded.
                    held.retain(|&(at, wait)| {
                        let due = at + wait <= now;
                        if due {
                            used.push(at + wait);
                        }
                        !due
                    });
                    // Now and then a held client leaves: its turn is given back.
                    let leave = leaves.get(k).copied().unwrap_or(0) as usize;
                    if leave % 3 == 0 && !held.is_empty() {
                        let (at, wait) = held.remove(leave % held.len());
                        state.refund(&p, at, 1, wait);
                    }
                    let (d, next) = state.decide(&p, now, 1);
                    if !d.allowed {
                        continue;
                    }
                    state = next;
                    if d.retry_after_ms == 0 {
                        used.push(now);
                    } else {
                        held.push((now, d.retry_after_ms));
                    }
                }
                used.extend(held.iter().map(|&(at, wait)| at + wait));
                used.sort_unstable();
                for pair in used.windows(2) {
                    prop_assert!((pair[1] - pair[0] + 1) * limit >= window_ms,
                        "turns {} then {}", pair[0], pair[1]);
                }
            }

            #[test]
            fn retry_after_is_exact_for_every_algorithm(
                reqs in requests(), limit in 3u64..30, window_ms in 1u64..3000, alg in 0usize..5,
            ) {
                let algorithm = [Algorithm::TokenBucket, Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::SlidingLog, Algorithm::LeakyBucket][alg];
                let p = Policy::new("p", algorithm, limit, window_ms, limit);
                let mut state = State::new(&p);
                let mut now = T0;
                for &(gap, c) in &reqs {
                    now += gap;
                    let (d, next) = state.decide(&p, now, c);
                    if d.allowed {
                        state = next;
                    } else {
                        prop_assert!(d.retry_after_ms > 0);
                        prop_assert!(state.decide(&p, now + d.retry_after_ms, c).0.allowed,
                            "{algorithm}: not admitted after Retry-After");
                        prop_assert!(!state.decide(&p, now + d.retry_after_ms - 1, c).0.allowed,
                            "{algorithm}: admitted before Retry-After");
                    }
                }
            }
        }
    }
}
