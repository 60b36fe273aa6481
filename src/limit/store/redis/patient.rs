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
//!   running (a timer on a running runtime is late by microseconds): the call is given the
//!   bound again, once.
//!
//! A Redis that does not answer is still given up on at the bound (a frozen Redis, on a
//! machine that runs well); in the worst case, a call on a starved machine, at twice the bound
//! plus the timer's lateness.

use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// When a timer of this process last fired late ([`now_ms`] + 1; 0 = never): what tells a
/// timeout of a starved process from one of a running process (`timeouts.rs`).
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
    Patient {
        call,
        timer: tokio::time::sleep(bound),
        bound,
        stage: Stage::Waiting,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Within the bound.
    Waiting,
    /// The timer fired; the task yielded to let a received reply be read.
    Yielded { late: bool },
    /// The timer fired late: the bound once more.
    Again,
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
                Stage::Waiting => {
                    if me.timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let late = Instant::now().saturating_duration_since(me.timer.deadline());
                    let late = late >= *me.bound / 4;
                    if late {
                        LATE_AT.store(now_ms() + 1, Ordering::Relaxed);
                    }
                    *me.stage = Stage::Yielded { late };
                    // Rescheduled behind the tasks already woken (the connection's reader).
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Stage::Yielded { late: true } => {
                    *me.stage = Stage::Again;
                    me.timer.as_mut().reset(Instant::now() + *me.bound);
                }
                Stage::Yielded { late: false } => return Poll::Ready(Err(Elapsed)),
                Stage::Again => {
                    return match me.timer.as_mut().poll(cx) {
                        Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
                        Poll::Pending => Poll::Pending,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_within_its_bound_ends_and_one_past_it_is_given_up() {
        let quick = patient(Duration::from_millis(20), async { 7 });
        assert_eq!(quick.await, Ok(7));
        let never = patient(Duration::from_millis(20), std::future::pending::<()>());
        assert_eq!(never.await, Err(Elapsed));
    }

    /// A reply that is there when the timer is looked at is taken, not counted as a timeout.
    #[tokio::test(start_paused = true)]
    async fn a_reply_ready_when_the_timer_fires_is_taken() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = patient(Duration::from_millis(20), rx);
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
        let call = patient(Duration::from_millis(20), rx);
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

        let never = patient(Duration::from_millis(20), std::future::pending::<()>());
        tokio::pin!(never);
        assert!(futures::poll!(never.as_mut()).is_pending());
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(never.await, Err(Elapsed), "given up after the second bound");
    }
}
