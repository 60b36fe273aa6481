//! The service that runs the upstream pools' health checks and name resolutions
//! (`upstream::health`) over the live snapshot, so pools a reload creates need no wiring.

use crate::control::snapshot::SnapshotHandle;
use crate::upstream::health;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::{Duration, Instant};

/// Background service running the active health checks of every pool in the live snapshot.
pub struct HealthChecker {
    snapshots: SnapshotHandle,
}

impl HealthChecker {
    pub fn new(snapshots: SnapshotHandle) -> HealthChecker {
        HealthChecker { snapshots }
    }
}

/// Upper bound on how long the checker sleeps, so pools added by a reload are picked up.
const MAX_IDLE: Duration = Duration::from_millis(500);

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let snapshot = self.snapshots.load_full();
            let now = Instant::now();
            let next = health::run_due(snapshot.pools.values(), now).await;
            let wake = next
                .unwrap_or(now + MAX_IDLE)
                .min(Instant::now() + MAX_IDLE);
            drop(snapshot);
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}
