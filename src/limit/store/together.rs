//! The memory store's decision for one request, apart from its locks: every policy decided on
//! the state it reads, and the request admitted only if every enforced policy admits it (a
//! shadow policy never blocks). Pure: the caller reads the states and writes what this returns.

use crate::clock::Clock;
use crate::limit::algorithm::State;
use crate::limit::store::request::CheckRequest;
use crate::limit::{Decision, Policy};

/// A decision's time: this store's clock, and the same moment in Unix milliseconds (the
/// time of calendar windows).
#[derive(Clone, Copy)]
pub struct Times {
    pub now: u64,
    pub unix: u64,
}

impl Times {
    pub fn of<C: Clock>(clock: &C) -> Times {
        let now = clock.now_ms();
        Times {
            now,
            unix: clock.to_unix_ms(now),
        }
    }

    pub fn for_policy(self, policy: &Policy) -> u64 {
        match policy.calendar() {
            Some(_) => self.unix,
            None => self.now,
        }
    }
}

/// The decisions for `req`'s policies in their states `before` at `now`, and whether the
/// request is admitted (every enforced policy admits; a dry run never blocks). Admitted: the
/// states to write. Refused: nothing is written, and the policies that would have admitted
/// report their state as it stays (the same decision at cost 0).
pub fn decide(
    req: &CheckRequest<'_>,
    before: &[State],
    times: Times,
) -> (bool, Vec<Decision>, Vec<State>) {
    let shadow = |i: usize| req.shadow.get(i).copied().unwrap_or(false);
    let (mut decisions, next): (Vec<Decision>, Vec<State>) = req
        .policies
        .iter()
        .zip(before)
        .enumerate()
        .map(|(i, (policy, state))| state.decide(policy, times.for_policy(policy), req.cost_of(i)))
        .unzip();
    let admitted = decisions
        .iter()
        .enumerate()
        .all(|(i, d)| d.allowed || shadow(i));
    if !admitted {
        for ((decision, policy), state) in decisions.iter_mut().zip(req.policies).zip(before) {
            if decision.allowed {
                *decision = state.decide(policy, times.for_policy(policy), 0).0;
            }
        }
        return (false, decisions, Vec::new());
    }
    // A dry-run policy that would have rejected keeps its state.
    let next = next
        .into_iter()
        .zip(&decisions)
        .zip(before)
        .map(|((state, d), was)| if d.allowed { state } else { was.clone() })
        .collect();
    (true, decisions, next)
}
