//! The task that sends the calls waiting in a store's queue of settlements again
//! (`settlements.rs`: what waits, when, and until when) on the request connection.

use super::batch;
use super::connection::Link;
use super::scripts;
use super::settlements::{self, Outcome, Settlements};
use crate::clock::{Clock, MonotonicClock};
use crate::limit::store::error::StoreError;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Sends the calls `queue` holds again, each when its pause is over, until none waits
/// (`settlements.rs`); gives them up if the store was replaced.
pub async fn resend(link: Weak<Link>, queue: Arc<Settlements>, timeout: Duration) {
    loop {
        let now = MonotonicClock.now_ms();
        let due = match queue.next(now) {
            settlements::Next::Done => return,
            settlements::Next::Wait(ms) => {
                let wait = Duration::from_millis(ms);
                let _ = tokio::time::timeout(wait, queue.wake.notified()).await;
                continue;
            }
            settlements::Next::Send(due) => due,
        };
        let Some(link) = link.upgrade() else {
            for p in due {
                queue.after(p, Outcome::Refused, now);
            }
            return;
        };
        let sent = due.into_iter().map(|p| {
            let link = &link;
            async move {
                let call = scripts::Call {
                    script: link.scripts.sending(batch::Sending::Alone(p.kind)),
                    cmd: std::borrow::Cow::Borrowed(&p.cmd),
                };
                let queued = AtomicBool::new(false);
                let result = link
                    .batched(call, (p.keys, p.kind), (None, timeout), &queued)
                    .await;
                let outcome = match result {
                    Ok(_) => Outcome::Done,
                    Err(StoreError::Refused(_)) => Outcome::Refused,
                    Err(_) => Outcome::Failed,
                };
                (p, outcome)
            }
        });
        for (p, outcome) in futures::future::join_all(sent).await {
            queue.after(p, outcome, MonotonicClock.now_ms());
        }
    }
}
