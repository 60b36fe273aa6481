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
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
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
