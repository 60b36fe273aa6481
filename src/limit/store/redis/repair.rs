//! Keeping the connection requests use healthy before a request needs it.
//!
//! A connection to Redis breaks while nobody uses it (Redis restarted, failed over, the
//! network blinked) and the redis crate makes a new one only when a call fails on the old one
//! — so the first request after a restart failed, and a circuit breaker's probe, being a
//! request, ran on the stale connection and opened the breaker again. Instead, as soon as the
//! request connection is known lost — the connection reports a disconnect (RESP3), a
//! request's call fails on it, or (Sentinel) a call times out — it is marked *down*, and a
//! repair task pings through it (which makes a new connection: for Sentinel, to the primary
//! the sentinels name now) every few milliseconds until Redis answers; then it is up again.
//! A request arriving while it is down does not use the stale connection: it has the repair
//! task ping at once and rides on that attempt — it proceeds on the new connection if Redis
//! answers, and fails at once (the route's failure mode) if the attempt fails, as it would
//! have on a refused connection. Its store timeout bounds the wait either way.

use redis::aio::AsyncPushSender;
use redis::{PushInfo, PushKind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// First pause between repair pings; doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Whether the request connection is known to be lost, and who waits for it.
#[derive(Default)]
pub struct LaneWatch {
    down: AtomicBool,
    /// Wakes the requests waiting for the connection to be up again.
    back: Notify,
    /// Wakes the requests waiting on a repair attempt that failed.
    failed: Notify,
    /// Wakes the repair task (to start, or to try again now).
    wanted: Notify,
    /// The repair task was started (once per store, in the runtime serving requests).
    started: AtomicBool,
    repairs: AtomicU64,
}

impl LaneWatch {
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// The connection is lost: requests wait, the repair task starts pinging.
    pub fn lost(&self) {
        if !self.down.swap(true, Ordering::AcqRel) {
            self.wanted.notify_one();
        }
    }

    /// Times the connection was repaired.
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }

    fn restored(&self) {
        self.repairs.fetch_add(1, Ordering::Relaxed);
        self.down.store(false, Ordering::Release);
        self.back.notify_waiters();
    }

    /// Has the repair task try now, and waits for that attempt: true once the connection is
    /// up, false when the attempt failed (the caller's timeout bounds the wait).
    pub async fn wait_up(&self) -> bool {
        let back = self.back.notified();
        let failed = self.failed.notified();
        tokio::pin!(back, failed);
        back.as_mut().enable();
        failed.as_mut().enable();
        if !self.is_down() {
            return true;
        }
        self.wanted.notify_one();
        tokio::select! {
            _ = back => true,
            _ = failed => !self.is_down(),
        }
    }

    /// Whether the caller should start the repair task (true once).
    pub fn start(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }
}

/// What the repair task needs of the connections: one ping through the request connection,
/// making a new one if needed.
pub trait Ping: Send + Sync + 'static {
    fn watch(&self) -> &LaneWatch;
    fn ping(&self) -> impl std::future::Future<Output = bool> + Send + '_;
}

/// Repairs the request connection whenever `watch` says it is lost, for as long as its
/// owner lives.
pub async fn repair_loop<P: Ping>(owner: Weak<P>, watch: Arc<LaneWatch>) {
    loop {
        if owner.strong_count() == 0 {
            return;
        }
        if !watch.is_down() {
            // Wake up now and then to notice the owner is gone (a reload replaced it).
            let _ = tokio::time::timeout(Duration::from_secs(5), watch.wanted.notified()).await;
            continue;
        }
        let mut pause = FIRST_PAUSE;
        loop {
            let Some(link) = owner.upgrade() else { return };
            if link.ping().await {
                watch.restored();
                break;
            }
            drop(link);
            watch.failed.notify_waiters();
            // The next attempt after a pause, or at once for a request that waits on it.
            let _ = tokio::time::timeout(pause, watch.wanted.notified()).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

/// Told by the connection when it drops (RESP3 connections report it as a push message).
pub struct OnDisconnect<P: Ping>(pub Weak<P>);

impl<P: Ping> AsyncPushSender for OnDisconnect<P> {
    fn send(&self, info: PushInfo) -> Result<(), redis::aio::SendError> {
        if info.kind == PushKind::Disconnection {
            if let Some(link) = self.0.upgrade() {
                link.watch().lost();
            }
        }
        Ok(())
    }
}
