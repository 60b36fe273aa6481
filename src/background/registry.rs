//! Keeps every instance's copy of the client registry current: asks Redis for the
//! registry's version every `registry.poll`, reads the whole registry when it moved (or every
//! `registry.resync`). Over the live snapshot, so a registry a reload adds needs no wiring.

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::Duration;

/// How long the service sleeps when no registry is configured (a reload may add one).
const IDLE: Duration = Duration::from_millis(500);

pub struct RegistrySync {
    snapshots: SnapshotHandle,
}

impl RegistrySync {
    pub fn new(snapshots: SnapshotHandle) -> RegistrySync {
        RegistrySync { snapshots }
    }
}

#[async_trait]
impl BackgroundService for RegistrySync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let registry = self.snapshots.load().registry.clone();
            let wait = match registry {
                Some(registry) => {
                    registry.sync().await;
                    registry.settings.poll
                }
                None => IDLE,
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}
