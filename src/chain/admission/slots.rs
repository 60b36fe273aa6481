//! Concurrency slots held by an admitted request until it ends.

use crate::limit::store::held::SlotTicket;
use crate::limit::store::Store;
use std::sync::Arc;

/// Concurrency slots a request holds; dropping the guard (when the request's context is
/// dropped: response done, upstream failed, client gone) gives them back. While the request
/// lasts — a slow body, a long poll, a streamed answer, an upgraded WebSocket — the store
/// keeps them (`limit/store/held.rs`).
pub struct SlotGuard {
    pub(super) store: Arc<Store>,
    pub(super) ticket: Option<SlotTicket>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { store.let_go(ticket).await });
            }
            // No runtime (shutdown): Redis slots expire with their TTL.
            Err(_) => log::debug!("no runtime to release concurrency slots"),
        }
    }
}
