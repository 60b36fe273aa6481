//! Concurrency slots held by an admitted request until it ends.

use crate::limit::store::Store;
use crate::limit::Policy;
use std::sync::Arc;

/// Concurrency slots a request holds; dropping the guard (when the request's context is
/// dropped: response done, upstream failed, client gone) gives them back.
pub struct SlotGuard {
    pub(super) store: Arc<Store>,
    pub(super) client: Arc<str>,
    pub(super) route: Arc<str>,
    pub(super) policies: Vec<Policy>,
    pub(super) slot_id: String,
    pub(super) fallback: bool,
    /// Renews the slots while the request lasts (see [`SlotGuard::keep_alive`]).
    pub(super) renewing: Option<tokio::task::AbortHandle>,
}

impl SlotGuard {
    /// The request will outlast a slot's time to live (an upgraded WebSocket connection):
    /// renew its slots every third of it until the guard is dropped, so the connection
    /// counts against its client's `max_concurrent` for as long as it is open. A renewal
    /// that fails is tried again at the next tick; a slot lost meanwhile stays lost (the
    /// connection is not cut for it).
    pub fn keep_alive(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.renewing.is_some() || self.policies.is_empty() {
            return;
        }
        let ttl_ms = self
            .policies
            .iter()
            .map(Policy::window_ms)
            .max()
            .unwrap_or(0);
        let every = std::time::Duration::from_millis((ttl_ms / 3).max(100));
        let store = Arc::clone(&self.store);
        let (client, route) = (Arc::clone(&self.client), Arc::clone(&self.route));
        let (policies, slot_id, fallback) =
            (self.policies.clone(), self.slot_id.clone(), self.fallback);
        let task = runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let renewed = store
                    .renew(&client, &route, &policies, &slot_id, fallback)
                    .await;
                if let Err(e) = renewed {
                    log::debug!("renewing concurrency slots failed (tried again): {e}");
                }
            }
        });
        self.renewing = Some(task.abort_handle());
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(renewing) = self.renewing.take() {
            renewing.abort();
        }
        let store = Arc::clone(&self.store);
        let (client, route) = (Arc::clone(&self.client), Arc::clone(&self.route));
        let policies = std::mem::take(&mut self.policies);
        let slot_id = std::mem::take(&mut self.slot_id);
        let fallback = self.fallback;
        let release = async move {
            store
                .release(&client, &route, &policies, &slot_id, fallback)
                .await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release);
            }
            // No runtime (shutdown): Redis slots expire with their TTL.
            Err(_) => log::debug!("no runtime to release concurrency slots"),
        }
    }
}
