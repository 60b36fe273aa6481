//! Connections made in a task of their own. A request that finds no connection waits for the
//! attempt in progress (or starts one), but gives up at its own `store.timeout` as usual; the
//! attempt goes on, bounded by [`connect_bound`], so the requests after find the connection
//! made. Made inside the request instead, a connection slower to make than the store timeout
//! — a TLS handshake across zones, scripts loaded on a machine busy with a gateway that has
//! just started under load — was cancelled with every request that tried and never made.
//! (A Cluster node makes its connections the same way: `cluster/node.rs`.)

use redis::RedisError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

/// The least and the most time a connection (with its scripts loaded) may take to be made,
/// whatever the store timeout.
pub const CONNECT_AT_LEAST: Duration = Duration::from_millis(500);
pub const CONNECT_AT_MOST: Duration = Duration::from_secs(2);

/// How long an attempt at making a connection may take, for a store timeout of `timeout`.
pub fn connect_bound(timeout: Duration) -> Duration {
    timeout.clamp(CONNECT_AT_LEAST, CONNECT_AT_MOST)
}

/// The driver's own connection timeout (TCP, TLS, authentication) within that bound.
pub fn connection_timeout(timeout: Duration) -> Duration {
    timeout.max(CONNECT_AT_LEAST)
}

/// One lane's attempt at making its connection: whether one is under way, who waits for it,
/// and why the latest failed.
#[derive(Default)]
pub struct Making {
    connecting: AtomicBool,
    made: Notify,
    last_error: Mutex<Option<RedisError>>,
}

impl Making {
    /// Returns at once if `ready()`; else waits for the attempt under way, starting one with
    /// `start` (which spawns it and has it call [`ended`](Self::ended)) when there is none.
    /// Not bounded: the caller's timeout bounds its wait, never the attempt.
    pub async fn wait(&self, ready: impl Fn() -> bool, start: impl FnOnce()) {
        let made = self.made.notified();
        tokio::pin!(made);
        made.as_mut().enable();
        if ready() {
            return;
        }
        if !self.connecting.swap(true, Ordering::AcqRel) {
            start();
        }
        made.await;
    }

    /// The attempt ended: made (`None`), or failed with `error` (kept whole: a wrong
    /// password is told apart from an unreachable Redis). Wakes whoever waits.
    pub fn ended(&self, error: Option<RedisError>) {
        if error.is_some() {
            *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
        }
        self.connecting.store(false, Ordering::Release);
        self.made.notify_waiters();
    }

    /// Why the latest failed attempt failed.
    pub fn last_error(&self) -> Option<RedisError> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A lane whose attempts take 50 ms and succeed, counting how many were started.
    #[derive(Clone, Default)]
    struct Lane {
        making: Arc<Making>,
        made: Arc<AtomicBool>,
        attempts: Arc<AtomicUsize>,
    }

    impl Lane {
        async fn wait(&self) {
            let ready = || self.made.load(Ordering::SeqCst);
            let lane = self.clone();
            let start = move || {
                lane.attempts.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    lane.made.store(true, Ordering::SeqCst);
                    lane.making.ended(None);
                });
            };
            self.making.wait(ready, start).await;
        }
    }

    /// Many waiters, one attempt: it outlives a waiter that gave up, and the others wake when
    /// it ends.
    #[tokio::test]
    async fn one_attempt_serves_every_waiter_and_outlives_those_that_give_up() {
        let lane = Lane::default();
        let gave_up = tokio::time::timeout(Duration::from_millis(5), lane.wait()).await;
        assert!(
            gave_up.is_err(),
            "the first waiter gives up before the attempt ends"
        );
        futures::future::join_all((0..3).map(|_| lane.wait())).await;
        assert!(lane.made.load(Ordering::SeqCst));
        assert_eq!(
            lane.attempts.load(Ordering::SeqCst),
            1,
            "one attempt for all"
        );
        assert!(lane.making.last_error().is_none());
        lane.wait().await;
        assert_eq!(
            lane.attempts.load(Ordering::SeqCst),
            1,
            "made: no attempt more"
        );
        assert_eq!(connect_bound(Duration::from_millis(20)), CONNECT_AT_LEAST);
        assert_eq!(connect_bound(Duration::from_secs(5)), CONNECT_AT_MOST);
    }
}
