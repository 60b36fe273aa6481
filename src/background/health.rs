//! Active health checks of every upstream pool in the live snapshot, each pool on its own
//! interval (`upstreams.NAME.health_check`), and the resolution of their host names again
//! (`upstreams.NAME.resolve_interval`).

use crate::control::snapshot::SnapshotHandle;
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
            let checks = snapshot.pools.values().map(|pool| async move {
                let resolve = pool.resolve_if_due(now).await;
                let check = pool.check_if_due(now).await;
                resolve.into_iter().chain(check).min()
            });
            let next = futures::future::join_all(checks)
                .await
                .into_iter()
                .flatten()
                .min();
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
