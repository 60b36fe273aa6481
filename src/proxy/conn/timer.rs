//! One timer per connection, and the compact instants the guard keeps its deadlines in.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

/// `at` as milliseconds since the process's start (a compact, atomic-friendly instant; never
/// 0, which means "none").
pub fn ms_since_start(at: Instant) -> u64 {
    at.saturating_duration_since(crate::clock::process_start())
        .as_millis() as u64
        + 1
}

fn instant(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(
        crate::clock::process_start() + Duration::from_millis(ms.max(1) - 1),
    )
}

/// The connection's timer, made on first use and moved after that (never re-created).
#[derive(Debug, Default)]
pub struct Timer(Option<(u64, Pin<Box<Sleep>>)>);

impl Timer {
    /// Whether `wake_at` (see [`ms_since_start`]) has come; if not, the task is woken when it
    /// may have. A deadline that moved later leaves the timer where it is (HTTP/2's move on
    /// every frame): when it fires early it is moved to the deadline then — one timer reset
    /// per wake-up, not per read. No clock is read here.
    pub fn due(&mut self, cx: &mut Context<'_>, wake_at: u64) -> bool {
        let Some((at, sleep)) = self.0.as_mut() else {
            let mut sleep = Box::pin(tokio::time::sleep_until(instant(wake_at)));
            let due = sleep.as_mut().poll(cx).is_ready();
            self.0 = Some((wake_at, sleep));
            return due;
        };
        if *at > wake_at {
            sleep.as_mut().reset(instant(wake_at));
            *at = wake_at;
        }
        if sleep.as_mut().poll(cx) == Poll::Pending {
            return false;
        }
        if *at < wake_at {
            // Fired for an earlier deadline that has moved on.
            sleep.as_mut().reset(instant(wake_at));
            *at = wake_at;
            return sleep.as_mut().poll(cx).is_ready();
        }
        true
    }
}

use std::future::Future;
