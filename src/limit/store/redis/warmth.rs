//! A new Redis store warms before requests need it. Its request connection — made,
//! authenticated, every script loaded (on a Cluster: the slot map read and every primary's
//! connection made) — is made as soon as the store exists: at start, in the runtime that
//! serves requests, before the first one arrives; after a reload that made a new store,
//! before that store is swapped in. Until then:
//!
//! - `/readyz` says not ready (`store warming`), so that a load balancer or Kubernetes sends
//!   nothing yet;
//! - a decision that arrives anyway waits for the warm-up's next outcome instead of being
//!   charged its `store.timeout` for it (made on a busy machine, a connection and its scripts
//!   take far longer than a decision may) — a made connection, or an attempt that failed at
//!   once (a Redis that refuses connections, a wrong password: the route's failure mode at
//!   once, as before); an attempt that ran out of time (a machine too busy to finish it, a
//!   Redis that does not answer) keeps them waiting, within the grace;
//! - attempts are made again, after a growing pause, until the `store.startup_grace` has
//!   passed: then the store counts as started (ready), and a Redis still out of reach is met
//!   by each route's failure mode, as at any other time.
//!
//! Warm is a state of the store, not of each connection: a connection lost later is repaired
//! as ever (`repair.rs`), with requests bounded by their `store.timeout` meanwhile.

use crate::limit::store::error::StoreError;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The first pause between two warm-up attempts; doubled up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_millis(50);
pub const MAX_PAUSE: Duration = Duration::from_millis(500);

const COLD: u8 = 0;
const WARMING: u8 = 1;
const WARM: u8 = 2;
const GAVE_UP: u8 = 3;

/// Where a store's warm-up stands.
pub struct Warmth {
    state: AtomicU8,
    /// Wakes the decisions waiting for the warm-up's next outcome.
    changed: Notify,
    grace: Duration,
    /// When the grace ends (set when the warm-up starts).
    until: OnceLock<Instant>,
}

/// What a warm-up attempt's end means for the loop.
pub enum Next {
    /// Try again after this pause.
    Pause(Duration),
    /// The grace is over.
    GiveUp,
}

impl Warmth {
    pub fn new(grace: Duration) -> Warmth {
        Warmth {
            state: AtomicU8::new(COLD),
            changed: Notify::new(),
            grace,
            until: OnceLock::new(),
        }
    }

    /// Warm, or the grace is over: decisions go their ordinary way (the only check on the
    /// request path once started: one atomic load).
    pub fn settled(&self) -> bool {
        self.state.load(Ordering::Acquire) >= WARM
    }

    /// Between the start of its warm-up and warm (or the grace's end): not ready.
    pub fn warming(&self) -> bool {
        self.state.load(Ordering::Acquire) == WARMING
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Starts the warm-up: true for the one caller that should run it (the first).
    pub fn begin(&self) -> bool {
        let started = self
            .state
            .compare_exchange(COLD, WARMING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if started {
            let _ = self.until.set(Instant::now() + self.grace);
        }
        started
    }

    /// The grace's end (the warm-up has begun).
    fn until(&self) -> Instant {
        *self.until.get_or_init(|| Instant::now() + self.grace)
    }

    /// The time left before the grace ends.
    pub fn left(&self) -> Duration {
        self.until().saturating_duration_since(Instant::now())
    }

    /// The store is warm.
    pub fn warmed(&self) {
        self.state.store(WARM, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// An attempt failed. One that failed `at_once` — Redis or the network said no: a refused
    /// connection, a wrong password — lets who waited on it go on (to the route's failure
    /// mode); one that failed slowly (no answer in time: a busy machine, a Redis out of
    /// reach) does not, its waiters staying within the grace. The loop tries again after
    /// `pause`, or gives up when the grace is over.
    pub fn failed(&self, pause: Duration, at_once: bool) -> Next {
        if at_once {
            self.changed.notify_waiters();
        }
        let left = self.left();
        if left.is_zero() {
            self.state.store(GAVE_UP, Ordering::Release);
            self.changed.notify_waiters();
            return Next::GiveUp;
        }
        Next::Pause(pause.min(left))
    }

    /// Waits for the warm-up's next outcome — warm, an attempt failed, the grace over — at
    /// most until the grace ends. Returns at once when it is settled.
    pub async fn next_outcome(&self) {
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if self.settled() {
            return;
        }
        let _ = tokio::time::timeout_at(self.until(), changed).await;
    }

    /// Waits until the warm-up is settled (warm, or the grace over).
    pub async fn done(&self) {
        while !self.settled() {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.settled() {
                return;
            }
            // Bounded: the grace's end, plus a pause for the loop to record it.
            let until = self.until() + MAX_PAUSE;
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return;
            }
        }
    }
}

/// What the warm-up loop needs of the connections: one attempt at making the request lane.
pub trait WarmUp: Send + Sync {
    fn warmth(&self) -> &Warmth;
    fn store_timeout(&self) -> Duration;
    fn attempt(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + '_;
}

/// The warm-up: one attempt after another until the request connection is made (each
/// attempt bounded: `making.rs`), or the grace is over. An attempt that failed within the
/// store timeout failed at once (Redis or the network said no).
pub async fn warm_up<L: WarmUp>(link: &L) {
    let warmth = link.warmth();
    let started = std::time::Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let began = std::time::Instant::now();
        let attempt = tokio::time::timeout(warmth.left(), link.attempt()).await;
        let error = match attempt {
            Ok(Ok(())) => {
                warmth.warmed();
                log::info!(
                    "limiter store warm in {:?}: the request connection is made and its scripts loaded",
                    started.elapsed()
                );
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no connection within the startup grace".to_owned(),
        };
        let at_once = began.elapsed() < link.store_timeout();
        match warmth.failed(pause, at_once) {
            Next::Pause(wait) => tokio::time::sleep(wait).await,
            Next::GiveUp => {
                log::warn!(
                    "limiter store not warm after its startup grace of {:?} ({error}): the instance is ready, and requests Redis cannot decide meet their route's failure mode",
                    warmth.grace()
                );
                return;
            }
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warming_begins_once_and_ends_warm_or_after_the_grace() {
        let warmth = Warmth::new(Duration::from_secs(5));
        assert!(!warmth.warming() && !warmth.settled());
        assert!(warmth.begin());
        assert!(!warmth.begin(), "one warm-up");
        assert!(warmth.warming());
        // A decision waits for the next outcome: here, a failed attempt.
        let waiting = warmth.next_outcome();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        assert!(matches!(warmth.failed(FIRST_PAUSE, false), Next::Pause(_)));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "a slow failure keeps it waiting"
        );
        assert!(matches!(warmth.failed(FIRST_PAUSE, true), Next::Pause(_)));
        waiting.await;
        assert!(warmth.warming(), "still warming after one failure");
        warmth.warmed();
        assert!(warmth.settled() && !warmth.warming());

        let cold = Warmth::new(Duration::from_secs(5));
        assert!(cold.begin());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(matches!(cold.failed(FIRST_PAUSE, false), Next::GiveUp));
        assert!(cold.settled() && !cold.warming());
        cold.done().await;
    }

    /// A decision never waits past the grace, even if nobody reports an outcome.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_decision_is_bounded_by_the_grace() {
        let warmth = Warmth::new(Duration::from_secs(2));
        assert!(warmth.begin());
        let start = Instant::now();
        warmth.next_outcome().await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
