//! How a single node's or Sentinel primary's batches are sent (`batch.rs`): on the request
//! lane, within the store timeout, reported to the store's breaker as one call.

use crate::clock::{Clock, MonotonicClock};
use crate::limit::store::breaker::Attempt;
use crate::limit::store::error::StoreError;
use crate::limit::store::redis::batch::{SendBatch, Sending, Sent};
use crate::limit::store::redis::connection::Link;
use crate::limit::store::redis::patient::patient;
use crate::limit::store::redis::scripts::Call;
use crate::limit::store::redis::wire::Lane;
use std::borrow::Cow;
use std::sync::Weak;
use std::time::Duration;

/// Sends a single node's or Sentinel primary's batches, within the store timeout.
#[derive(Clone)]
pub(super) struct LinkSender {
    link: Weak<Link>,
    timeout: Duration,
}

impl Link {
    /// How this link's batches are sent.
    pub(super) fn sender(&self) -> LinkSender {
        LinkSender {
            link: self.me.clone(),
            timeout: self.store_timeout,
        }
    }
}

impl SendBatch for LinkSender {
    fn send(
        &self,
        cmd: &redis::Cmd,
        what: Sending,
    ) -> impl std::future::Future<Output = Sent> + Send {
        let link = self.link.upgrade();
        let timeout = self.timeout;
        async move {
            let Some(link) = link else {
                return Sent::Failed(StoreError::Unavailable("the store was replaced".into()));
            };
            let call = Call {
                script: link.scripts.sending(what),
                cmd: Cow::Borrowed(cmd),
            };
            // A batch with charges, refunds or releases is batch.lua's (arrival order).
            let native = !matches!(what, Sending::Batch { native: false });
            let sent = patient(
                timeout,
                link.invoke_as::<redis::Value>(&call, Lane::Requests, native),
            );
            let result = match sent.await {
                Ok(result) => result,
                Err(_) => {
                    link.timed_out();
                    Err(StoreError::Timeout(timeout))
                }
            };
            // One call for the breaker, however many decisions it carried.
            if let Some(breaker) = &link.breaker {
                let now = MonotonicClock.now_ms();
                if breaker.ended(Attempt::Call, result.as_ref().map(|_| ()), now) {
                    link.lost();
                }
            }
            match result {
                Ok(value) => {
                    link.answered();
                    Sent::Replied(value)
                }
                Err(StoreError::Refused(message)) if what.is_batch() => {
                    Sent::NotDecided(crate::limit::store::redis::batch::unsupported(&message))
                }
                Err(e) => Sent::Failed(e),
            }
        }
    }
}
