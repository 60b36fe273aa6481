//! Background heartbeat: while the shared store is up, this instance announces itself in it
//! and learns how many instances are alive — the number the local fallback divides limits
//! by when the store goes away, and publishes who it refused most lately (the fleet's view
//! of `GET /limited`). On shutdown it gives back the unspent units of its quota
//! leases and withdraws itself.

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::Duration;

pub struct Heartbeat {
    snapshots: SnapshotHandle,
}

impl Heartbeat {
    pub fn new(snapshots: SnapshotHandle) -> Heartbeat {
        Heartbeat { snapshots }
    }
}

/// How long to wait before looking again when the store has no heartbeat (memory store).
const IDLE: Duration = Duration::from_secs(1);

#[async_trait]
impl BackgroundService for Heartbeat {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let snapshot = self.snapshots.load_full();
            let store = std::sync::Arc::clone(&snapshot.store);
            let wait = match store.heartbeat_interval() {
                Some(interval) => {
                    let limited = snapshot
                        .refusals
                        .published(crate::ops::access_log::unix_ms());
                    if let Err(e) = store.heartbeat(false, &limited).await {
                        log::debug!("heartbeat failed: {e}");
                    }
                    interval
                }
                None => IDLE,
            };
            tokio::select! {
                _ = shutdown.changed() => {
                    let back = store.give_back_leases().await;
                    if back > 0 {
                        log::info!("gave back {back} unspent leased unit(s)");
                    }
                    if store.heartbeat_interval().is_some() {
                        let _ = store.heartbeat(true, "").await;
                    }
                    return;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
