//! What happens after a decision — a response's charge, a shed request's refund, the release of
//! a finished (or unanswered) request's concurrency slots — is applied exactly once and never
//! dropped while it can still matter.
//!
//! - **Once**: a charge and a refund carry a marker key of their own (`keys::once_key`; Lua's
//!   `applied_before`, kept 5 minutes): sent again after a timeout — when the first attempt
//!   may have run all the same, Redis running it when it woke — it changes nothing. A
//!   release is once by nature (it removes its slot id).
//! - **Its own bound**: each attempt is one call bounded by `store.timeout`, like a decision's
//!   — never holding a place on the connection longer, so decisions behind it are sent, and a
//!   frozen Redis opens the breaker for them as it does without releases in flight.
//! - **Not dropped**: an attempt that failed (a timeout, a connection lost, a breaker open, a
//!   failover) waits in this bounded queue, one per store, and is sent again — after
//!   100 ms, doubling to 2 s — until Redis acknowledges it or the state it would fix is gone:
//!   a slot's time to live (`store.concurrency_slot_ttl`) for a release, [`ONCE_HORIZON`] for
//!   a charge or a refund (its marker outlives that). What is given up is counted
//!   (`turnstile_store_settlements_total{result="given_up"}`) and logged at most once a
//!   minute; past [`QUEUE_MAX`] waiting, a new failure is given up at once.
//! - A call Redis refused (a wrong key type, a script error) is not tried again: it would be
//!   refused again.

use super::batch::Kind;
use crate::clock::{Clock, MonotonicClock};
use crate::limit::store::failure::DegradedLog;
use redis::Cmd;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a charge or a refund is tried again: well within its marker's life
/// (`ONCE_TTL_MS` in `lua/lib.lua`, 5 minutes), so a late retry is still applied once.
pub const ONCE_HORIZON: Duration = Duration::from_secs(120);
/// The most calls waiting to be sent again, per store.
pub const QUEUE_MAX: usize = 10_000;
/// The first pause before a call is sent again; doubled up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_millis(100);
pub const MAX_PAUSE: Duration = Duration::from_secs(2);
/// How often what was given up is logged, at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// A call to send again.
pub struct Pending {
    pub cmd: Cmd,
    pub kind: Kind,
    pub keys: usize,
    /// Past this (monotonic ms) it no longer matters.
    pub until_ms: u64,
    /// Not before this (monotonic ms).
    next_ms: u64,
    pause: Duration,
}

impl Pending {
    pub fn new(cmd: Cmd, (kind, keys): (Kind, usize), horizon: Duration) -> Pending {
        let now = MonotonicClock.now_ms();
        Pending {
            cmd,
            kind,
            keys,
            until_ms: now + horizon.as_millis() as u64,
            next_ms: now + FIRST_PAUSE.as_millis() as u64,
            pause: FIRST_PAUSE,
        }
    }
}

/// Settlements sent again, given up, by kind (charges, refunds, releases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SettlementTotals {
    /// Sent again and acknowledged.
    pub retried: [u64; 3],
    pub given_up: [u64; 3],
}

/// The kinds counted, in [`SettlementTotals`]' order.
pub const KINDS: [Kind; 3] = [Kind::Charge, Kind::Refund, Kind::Release];

fn index(kind: Kind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(2)
}

/// One store's calls waiting to be sent again.
#[derive(Default)]
pub struct Settlements {
    queue: Mutex<VecDeque<Pending>>,
    /// Wakes the task sending them (a new one waits).
    pub wake: Notify,
    /// The task runs (one per store, while anything waits).
    running: AtomicBool,
    retried: [AtomicU64; 3],
    given_up: [AtomicU64; 3],
    log: DegradedLog,
}

/// What the sending task does next.
pub enum Next {
    /// Send these now.
    Send(Vec<Pending>),
    /// Nothing is due before this many milliseconds.
    Wait(u64),
    /// Nothing waits: the task ends.
    Done,
}

impl Settlements {
    /// Queues `pending`; true when the sending task must be started. Past [`QUEUE_MAX`] it is
    /// given up at once.
    pub fn push(&self, pending: Pending) -> bool {
        let mut queue = lock(&self.queue);
        if queue.len() >= QUEUE_MAX {
            drop(queue);
            self.give_up(pending.kind, "the queue of calls to send again is full");
            return false;
        }
        queue.push_back(pending);
        drop(queue);
        self.wake.notify_one();
        !self.running.swap(true, Ordering::AcqRel)
    }

    /// What is due at `now_ms`: those whose pause is over (the ones past their horizon given
    /// up), up to 64 at a time.
    pub fn next(&self, now_ms: u64) -> Next {
        let mut queue = lock(&self.queue);
        let mut due = Vec::new();
        let mut expired = Vec::new();
        let mut soonest = u64::MAX;
        let mut kept = VecDeque::with_capacity(queue.len());
        while let Some(p) = queue.pop_front() {
            if now_ms > p.until_ms {
                expired.push(p.kind);
            } else if p.next_ms <= now_ms && due.len() < 64 {
                due.push(p);
            } else {
                soonest = soonest.min(p.next_ms);
                kept.push_back(p);
            }
        }
        *queue = kept;
        let empty = queue.is_empty() && due.is_empty();
        if empty {
            self.running.store(false, Ordering::Release);
        }
        drop(queue);
        for kind in expired {
            self.give_up(kind, "what it would fix has expired");
        }
        match (due.is_empty(), empty) {
            (false, _) => Next::Send(due),
            (true, true) => Next::Done,
            (true, false) => Next::Wait(soonest.saturating_sub(now_ms)),
        }
    }

    /// `pending` was sent again: acknowledged (`Ok`), refused by Redis (given up), or failed
    /// once more (queued, after a longer pause).
    pub fn after(&self, mut pending: Pending, outcome: Outcome, now_ms: u64) {
        match outcome {
            Outcome::Done => {
                self.retried[index(pending.kind)].fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Refused => self.give_up(pending.kind, "Redis refused it"),
            Outcome::Failed => {
                pending.pause = (pending.pause * 2).min(MAX_PAUSE);
                pending.next_ms = now_ms + pending.pause.as_millis() as u64;
                lock(&self.queue).push_back(pending);
                self.running.store(true, Ordering::Release);
            }
        }
    }

    fn give_up(&self, kind: Kind, why: &str) {
        self.given_up[index(kind)].fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.log.note_every(MonotonicClock.now_ms(), LOG_EVERY) {
            log::warn!(
                "{n} charge(s), refund(s) or release(s) of concurrency slots given up since the last report, the latest because {why}: a released slot then expires with its time to live; a charge or refund is not counted"
            );
        }
    }

    /// Calls waiting now.
    pub fn waiting(&self) -> usize {
        lock(&self.queue).len()
    }

    pub fn totals(&self) -> SettlementTotals {
        SettlementTotals {
            retried: self.retried.each_ref().map(|c| c.load(Ordering::Relaxed)),
            given_up: self.given_up.each_ref().map(|c| c.load(Ordering::Relaxed)),
        }
    }
}

/// A new id for a call applied once (its marker: `keys::once_key`): 16 random hex digits.
pub fn once_id() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness to be had: a clock and a counter are unique enough within a store.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) ^ MonotonicClock.now_ms().rotate_left(20);
        bytes = n.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How sending a call again went.
pub enum Outcome {
    Done,
    /// Redis answered with an error: it would again.
    Refused,
    Failed,
}

fn lock(m: &Mutex<VecDeque<Pending>>) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(kind: Kind, horizon_ms: u64) -> Pending {
        Pending::new(Cmd::new(), (kind, 1), Duration::from_millis(horizon_ms))
    }

    #[test]
    fn a_failed_call_waits_longer_each_time_and_is_given_up_past_its_horizon() {
        let s = Settlements::default();
        let now = MonotonicClock.now_ms();
        assert!(s.push(pending(Kind::Release, 10_000)), "the task starts");
        assert!(!s.push(pending(Kind::Charge, 10_000)), "it runs already");
        // Not due yet.
        assert!(matches!(s.next(now), Next::Wait(_)));
        let Next::Send(due) = s.next(now + 200) else {
            panic!("due after the first pause")
        };
        assert_eq!(due.len(), 2);
        let mut due = due.into_iter();
        s.after(due.next().unwrap(), Outcome::Failed, now + 200);
        s.after(due.next().unwrap(), Outcome::Done, now + 200);
        // The release waits 200 ms now, not 100.
        assert!(matches!(s.next(now + 350), Next::Wait(_)));
        // Past its horizon it is given up.
        assert!(matches!(s.next(now + 20_000), Next::Done));
        let t = s.totals();
        assert_eq!(t.retried[index(Kind::Charge)], 1);
        assert_eq!(t.given_up[index(Kind::Release)], 1);
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn a_full_queue_gives_up_at_once() {
        let s = Settlements::default();
        for _ in 0..QUEUE_MAX {
            s.push(pending(Kind::Release, 10_000));
        }
        s.push(pending(Kind::Refund, 10_000));
        assert_eq!(s.totals().given_up[index(Kind::Refund)], 1);
        assert_eq!(s.waiting(), QUEUE_MAX);
    }
}
