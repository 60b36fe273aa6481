//! Requests holding concurrency slots: [`Store::hold`] when admitted, [`Store::let_go`] when
//! they end, and — on Redis — the loop renewing the slots of requests still in flight
//! (`held.rs`), started with the first slot held and ended with the store.

use super::held::{tick_ms, HeldSlot, SlotTicket};
use super::{Backend, Store};
use crate::clock::Clock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

impl<C: Clock + Clone> Store<C> {
    /// An admitted request holds `slot` until it ends: kept in Redis for as long as that
    /// takes (renewed with the instance's other long requests); in process otherwise.
    pub fn hold(self: &Arc<Self>, slot: HeldSlot) -> SlotTicket {
        let Backend::Redis(_) = &self.backend else {
            return SlotTicket::Local(slot);
        };
        if slot.fallback {
            return SlotTicket::Local(slot);
        }
        let id = self.held.insert(slot, self.clock.now_ms());
        if !self.held.renewing.swap(true, Ordering::Relaxed) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(renew_loop(Arc::downgrade(self)));
                }
                Err(_) => self.held.renewing.store(false, Ordering::Relaxed),
            }
        }
        SlotTicket::Renewed(id)
    }

    /// The request holding `ticket` ended: its slots are freed.
    pub async fn let_go(&self, ticket: SlotTicket) {
        let slot = match ticket {
            SlotTicket::Local(slot) => slot,
            SlotTicket::Renewed(id) => match self.held.remove(id) {
                Some(slot) => slot,
                None => return,
            },
        };
        self.release(
            &slot.client,
            &slot.route,
            &slot.policies,
            &slot.slot_id,
            slot.fallback,
        )
        .await;
    }

    /// Slots held in Redis by this instance's requests in flight.
    pub fn held_slots(&self) -> usize {
        self.held.len()
    }

    /// Renews every slot due at this moment; what failed is due again at the next tick.
    async fn renew_due(&self) {
        let Backend::Redis(redis) = &self.backend else {
            return;
        };
        let due = self.held.take_due(self.clock.now_ms());
        if due.is_empty() {
            return;
        }
        // Within a third of the shortest life renewed (the next try still fits before it
        // ends), and never less than a decision's own bound.
        let shortest = due.iter().map(|d| d.ttl_ms).min().unwrap_or(0);
        let within = Duration::from_millis(shortest / 3).max(redis.config().timeout);
        let failed = redis.renew_slots(&due, within).await;
        if !failed.is_empty() {
            self.held.retry(failed.into_iter(), self.clock.now_ms());
        }
    }
}

/// Every tick, renews the due slots of the store, until the store is gone.
async fn renew_loop<C: Clock + Clone>(store: Weak<Store<C>>) {
    loop {
        let every = match store.upgrade() {
            Some(store) => {
                store.renew_due().await;
                tick_ms(store.held.shortest_ttl_ms())
            }
            None => return,
        };
        tokio::time::sleep(Duration::from_millis(every)).await;
    }
}
