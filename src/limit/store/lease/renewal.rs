//! Quota leasing's I/O half: a renewal runs as a task of its own, so that it outlives a
//! request that stops waiting for it (the bookkeeping is the pure [`LeaseTable`]).

use crate::clock::Clock;
use crate::limit::store::error::StoreError;
use crate::limit::store::lease::{Ask, Grant, LeaseKey, LeaseTable};
use crate::limit::store::redis::{LeaseCall, RedisStore};
use crate::limit::store::request::DecideAt;
use crate::limit::Policy;
use std::sync::Arc;
use std::time::Duration;

/// How long a renewal whose request gave up (the store timed out) may still be answered: its
/// grant, when it comes, becomes this instance's lease instead of units the store counted but
/// nobody can spend. Past this, the renewal is dropped (docs/limits.md, quota leasing: a grant lost with it).
pub const LATE_RENEWAL: Duration = crate::limit::store::redis::LATE_REPLY;

/// A lease renewal in flight: it runs as a task of its own, so that it outlives a request
/// that stops waiting for it.
pub struct Renewal<C: Clock> {
    pub clock: C,
    pub redis: Arc<RedisStore>,
    pub leases: Arc<LeaseTable>,
    pub key: LeaseKey,
    pub policies: Vec<Policy>,
    pub ask: Ask,
    pub at: DecideAt,
}

impl<C: Clock + Clone> Renewal<C> {
    /// Sends the renewal and waits at most `timeout` for its answer. On time: the answer
    /// (with the ask, to settle). Late: the request gets `Timeout` and gives its held units
    /// back; the task settles the grant when it arrives ([`LeaseTable::settle_late`]).
    pub async fn send(self, timeout: Duration) -> Result<(Ask, Grant), StoreError> {
        let (answer, mut wait) = tokio::sync::oneshot::channel();
        let (leases, key, ask) = (Arc::clone(&self.leases), self.key.clone(), self.ask.clone());
        let self_clock = self.clock.clone();
        tokio::spawn(self.run(answer));
        let outcome = match tokio::time::timeout(timeout, &mut wait).await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(_)) => None,
            Err(_) => {
                // Whatever arrived before this close is ours; anything later is the task's.
                wait.close();
                wait.try_recv().ok()
            }
        };
        match outcome {
            Some(Ok(grant)) => Ok((ask, grant)),
            Some(Err(e)) => {
                // Failed (not late): nothing was granted.
                leases.renewal_failed(&key, &ask, self_clock.now_ms());
                Err(e)
            }
            None => {
                leases.request_gave_up(&key, &ask, self_clock.now_ms());
                Err(StoreError::Timeout(timeout))
            }
        }
    }

    async fn run(self, answer: tokio::sync::oneshot::Sender<Result<Grant, StoreError>>) {
        let call = self.redis.lease_unbounded(LeaseCall {
            client: &self.key.client,
            route: &self.key.route,
            policies: &self.policies,
            need: self.ask.need,
            want: self.ask.want,
            give_back: self.ask.give_back,
            give_back_starts: &self.ask.give_back_starts,
            at: self.at,
        });
        let result = match tokio::time::timeout(LATE_RENEWAL, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(LATE_RENEWAL)),
        };
        // Delivered to the request if it still waits; otherwise settled here.
        if let Err(result) = answer.send(result) {
            let now = self.clock.now_ms();
            match result {
                Ok(grant) => {
                    self.leases
                        .settle_late(&self.key, &self.policies, &self.ask, &grant, now)
                }
                Err(e) => {
                    log::debug!("a late lease renewal failed too: {e}");
                    self.leases.renewal_ended(&self.key);
                }
            }
        }
    }
}
