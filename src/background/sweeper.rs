//! Background housekeeping of in-process limiter state: every [`INTERVAL`], drop per-IP
//! buckets that have refilled completely and store entries that no longer affect any decision
//! (both are exactly equivalent to absent state, so sweeping never changes a decision), and
//! verified tokens past their `exp` (never used again anyway).

use crate::clock::{Clock, MonotonicClock};
use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::Duration;

pub const INTERVAL: Duration = Duration::from_secs(1);

pub struct Sweeper {
    snapshots: SnapshotHandle,
}

impl Sweeper {
    pub fn new(snapshots: SnapshotHandle) -> Sweeper {
        Sweeper { snapshots }
    }

    /// One pass over the live snapshot's tables; returns the number of entries dropped.
    pub fn sweep_once(&self) -> usize {
        let snapshot = self.snapshots.load_full();
        let now = MonotonicClock.now_ms();
        let ip: usize = snapshot
            .ip_tables
            .values()
            .map(|t| t.limiter.sweep(now))
            .sum();
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        ip + snapshot.store.sweep() + snapshot.identity.tokens.sweep(unix_now)
    }
}

#[async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            self.sweep_once();
        }
    }
}
