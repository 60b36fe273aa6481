//! The bound of a call to Redis: `store.timeout` measures Redis, not this process.
//!
//! A plain timeout fires when its timer is looked at after the deadline, whatever kept the
//! call from ending before. On a machine whose CPUs are oversubscribed (an autoscaler starting
//! an instance exactly when load is high), that was mostly the gateway itself: a reply already
//! in the socket, not yet read because the worker thread that reads it was not running, was
//! counted as Redis being slow — and a `fail_closed` route answered 503 while Redis was fine.
//! So a call given up on is given two more looks, each bounded:
//!
//! - when the timer fires, the task yields once, so that a reply already received (its
//!   connection's task woken by the same turn of the runtime) is read, and is taken;
//! - a timer that fired late by a quarter of the bound or more shows that this process was not
//!   running (a timer on a running runtime is late by microseconds), and a machine with more
//!   threads runnable than CPUs ([`oversubscribed`]) shows that some of its threads may not
//!   be — among them the worker holding the task that reads the replies, while the
//!   request's own timer fired on time (seen: 7 and 34 of 1 000 requests refused, started
//!   on two cores taken four times over). Either way the call is given the bound again, once
//!   ([`MORE_AT_MOST`]), with one more look at its end. (More bounds while it stays starved
//!   helped a start on two cores taken twelve times over — one run of four refused 19 of
//!   1 000 with one — but a frozen Cluster primary's breaker then stopped opening in one of
//!   two gateways on a machine merely busy: `tests/limits/cluster_failover.rs`.)
//!
//! A Redis that does not answer is still given up on at the bound (a frozen Redis, on a
//! machine that runs well); in the worst case, a call on a starved machine, at twice the
//! bound plus the timers' lateness.

use super::oversubscribed;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// When a timer of this process last fired late ([`now_ms`] + 1; 0 = never): what tells a
/// timeout of a starved process from one of a running process (`timeouts.rs`). Only a late
/// timer shows that: a machine merely oversubscribed gives a call its second bound, but a
/// call that outlived that too is counted as Redis's (a Sentinel primary that froze is
/// still left promptly on a busy machine).
static LATE_AT: AtomicU64 = AtomicU64::new(0);

/// Milliseconds since this process started (a clock shared by every runtime).
pub fn now_ms() -> u64 {
    crate::clock::process_start().elapsed().as_millis() as u64
}

/// Whether a timer of this process fired late within `window` before now.
pub fn starved_within(window: Duration) -> bool {
    let late_at = LATE_AT.load(Ordering::Relaxed);
    late_at != 0 && now_ms() + 1 - late_at <= window.as_millis() as u64
}

/// The call did not end within its bound (and its two more looks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// `call` within `bound`, as this module's docs say.
pub fn patient<F: Future>(bound: Duration, call: F) -> Patient<F> {
    patient_on(bound, call, oversubscribed::now)
}

/// [`patient`] on a machine whose oversubscription `busy` tells (given [`now_ms`]).
fn patient_on<F: Future>(bound: Duration, call: F, busy: fn(u64) -> bool) -> Patient<F> {
    Patient {
        call,
        timer: tokio::time::sleep(bound),
        bound,
        stage: Stage::Waiting { more: 0 },
        busy,
    }
}

/// How many more bounds a starved call may be given.
const MORE_AT_MOST: u8 = 1;

/// The longest a call bounded by `bound` may run when its timer fires on time: its bound,
/// given again as many times as a starved call may be (what a decision queued behind it
/// must outlast).
pub fn longest(bound: Duration) -> Duration {
    bound * (1 + u32::from(MORE_AT_MOST))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Within the bound (`more`: the bounds given again so far).
    Waiting { more: u8 },
    /// The timer fired; the task yielded to let a received reply be read. `again`: starved
    /// (the timer fired late, or the machine is oversubscribed), the bound once more.
    Yielded { again: bool, more: u8 },
}

pin_project! {
    /// The future [`patient`] returns.
    pub struct Patient<F> {
        #[pin]
        call: F,
        #[pin]
        timer: Sleep,
        bound: Duration,
        stage: Stage,
        busy: fn(u64) -> bool,
    }
}

impl<F: Future> Future for Patient<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut me = self.project();
        if let Poll::Ready(value) = me.call.as_mut().poll(cx) {
            return Poll::Ready(Ok(value));
        }
        loop {
            match *me.stage {
                Stage::Waiting { more } => {
                    if me.timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let late = Instant::now().saturating_duration_since(me.timer.deadline());
                    let now = now_ms();
                    let late = late >= *me.bound / 4;
                    if late {
                        LATE_AT.store(now + 1, Ordering::Relaxed);
                    }
                    let again = more < MORE_AT_MOST && (late || (me.busy)(now));
                    *me.stage = Stage::Yielded { again, more };
                    return yielded(cx);
                }
                Stage::Yielded { again: true, more } => {
                    *me.stage = Stage::Waiting { more: more + 1 };
                    me.timer.as_mut().reset(Instant::now() + *me.bound);
                }
                Stage::Yielded { again: false, .. } => return Poll::Ready(Err(Elapsed)),
            }
        }
    }
}

/// Rescheduled behind the tasks already woken (the connection's reader): one more look.
fn yielded<T>(cx: &mut Context<'_>) -> Poll<T> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine that runs well, and one with more threads runnable than CPUs.
    const IDLE: fn(u64) -> bool = |_| false;
    const BUSY: fn(u64) -> bool = |_| true;

    #[tokio::test(start_paused = true)]
    async fn a_call_within_its_bound_ends_and_one_past_it_is_given_up() {
        let quick = patient_on(Duration::from_millis(20), async { 7 }, IDLE);
        assert_eq!(quick.await, Ok(7));
        let never = patient_on(
            Duration::from_millis(20),
            std::future::pending::<()>(),
            IDLE,
        );
        assert_eq!(never.await, Err(Elapsed));
    }

    /// A reply that is there when the timer is looked at is taken, not counted as a timeout.
    #[tokio::test(start_paused = true)]
    async fn a_reply_ready_when_the_timer_fires_is_taken() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = patient_on(Duration::from_millis(20), rx, IDLE);
        tokio::pin!(call);
        assert!(futures::poll!(call.as_mut()).is_pending());
        tokio::time::advance(Duration::from_millis(21)).await;
        // The timer fired: the task yields instead of giving up...
        assert!(futures::poll!(call.as_mut()).is_pending());
        // ...and the reply read meanwhile (by the connection's task) is taken.
        tx.send(3).unwrap();
        assert_eq!(call.await, Ok(Ok(3)));
    }

    /// A timer that fires far past its deadline (the process was not running) gives the call
    /// its bound again, once.
    #[tokio::test(start_paused = true)]
    async fn a_late_timer_gives_the_bound_again_once() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let call = patient_on(Duration::from_millis(20), rx, IDLE);
        tokio::pin!(call);
        assert!(futures::poll!(call.as_mut()).is_pending());
        // Nobody ran for 60 ms: the timer is 40 ms late.
        tokio::time::advance(Duration::from_millis(60)).await;
        assert!(futures::poll!(call.as_mut()).is_pending(), "yields first");
        assert!(
            futures::poll!(call.as_mut()).is_pending(),
            "then waits again"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        tx.send(1).unwrap();
        assert_eq!(call.await, Ok(Ok(1)));

        let never = patient_on(
            Duration::from_millis(20),
            std::future::pending::<()>(),
            IDLE,
        );
        tokio::pin!(never);
        assert!(futures::poll!(never.as_mut()).is_pending());
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(never.await, Err(Elapsed), "given up after the second bound");
    }

    /// On an oversubscribed machine a timer on time gives the bound again too (the reader's
    /// worker may be the one not running), with one more look at its end; once.
    #[tokio::test(start_paused = true)]
    async fn an_oversubscribed_machine_gives_the_bound_again_once() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let call = patient_on(Duration::from_millis(20), rx, BUSY);
        tokio::pin!(call);
        assert!(futures::poll!(call.as_mut()).is_pending());
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(futures::poll!(call.as_mut()).is_pending(), "yields first");
        assert!(futures::poll!(call.as_mut()).is_pending(), "waits again");
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(futures::poll!(call.as_mut()).is_pending(), "a last look");
        tx.send(2).unwrap();
        assert_eq!(call.await, Ok(Ok(2)), "the reply read meanwhile is taken");

        // Starved all along: the bound and one more (virtual time: exact).
        let never = patient_on(
            Duration::from_millis(20),
            std::future::pending::<()>(),
            BUSY,
        );
        let start = Instant::now();
        assert_eq!(never.await, Err(Elapsed));
        assert_eq!(start.elapsed(), Duration::from_millis(40), "two bounds");
    }
}
