//! Fetches every issuer's JWKS when due (at start, every `jwks_refresh`, sooner after a
//! failure) over the live snapshot, so issuers a reload adds need no wiring. A fetch that
//! fails leaves the keys in use (`chain::jwt::source`).

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::{Duration, Instant};

/// Upper bound on how long the service sleeps, so issuers added by a reload are picked up.
const MAX_IDLE: Duration = Duration::from_millis(500);

pub struct KeyRefresher {
    snapshots: SnapshotHandle,
}

impl KeyRefresher {
    pub fn new(snapshots: SnapshotHandle) -> KeyRefresher {
        KeyRefresher { snapshots }
    }
}

#[async_trait]
impl BackgroundService for KeyRefresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let snapshot = self.snapshots.load_full();
            for issuer in snapshot.identity.issuers.values() {
                issuer.source.refresh_if_due().await;
            }
            let now = Instant::now();
            let wake = snapshot
                .identity
                .issuers
                .values()
                .filter_map(|i| i.source.next_due())
                .min()
                .unwrap_or(now + MAX_IDLE)
                .clamp(now, now + MAX_IDLE);
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
