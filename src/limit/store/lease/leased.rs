//! A request decided from this instance's quota lease: spent locally, renewed from Redis when
//! spent or its window ended (the table is `LeaseTable`, the renewal `renewal.rs`); and the
//! leases' unspent units given back at graceful shutdown.

use super::renewal::Renewal;
use super::{FromLease, LeaseKey};
use crate::clock::Clock;
use crate::limit::store::redis::RedisStore;
use crate::limit::store::{Backend, CheckRequest, Store, StoreError};
use crate::limit::Verdict;
use std::sync::Arc;

impl<C: Clock + Clone> Store<C> {
    /// Decides from this instance's lease of the client's quota, renewing it from Redis when
    /// it is spent or its window ended ([`lease`]).
    pub(in crate::limit::store) async fn check_leased(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
        cap: u64,
    ) -> Result<Verdict, StoreError> {
        let key = LeaseKey {
            client: Arc::clone(req.client),
            route: Arc::clone(req.route),
        };
        let margin = redis.config().timeout.as_millis() as u64;
        // A request waits for at most two renewals of others before asking by itself.
        for _ in 0..3 {
            let now = self.clock.now_ms();
            match self
                .leases
                .take(&key, req.policies, req.cost, cap, now, margin)
            {
                FromLease::Local(verdict) => {
                    self.metrics.lease_local.inc();
                    return Ok(verdict);
                }
                FromLease::Wait(renewal) => {
                    // Bounded: the renewal itself is bounded by the same timeout.
                    let _ = tokio::time::timeout(redis.config().timeout, renewal).await;
                }
                FromLease::Untracked => break,
                FromLease::Stalled => {
                    return Err(StoreError::Timeout(redis.config().timeout));
                }
                FromLease::Ask(ask) => {
                    let renewal = Renewal {
                        clock: self.clock.clone(),
                        redis: Arc::clone(redis),
                        leases: Arc::clone(&self.leases),
                        key: key.clone(),
                        policies: req.policies.to_vec(),
                        ask,
                        at: req.at,
                    };
                    let timeout = redis.config().timeout;
                    return match self.guarded(renewal.send(timeout), None).await {
                        Ok((ask, grant)) => Ok(self.leases.settle(
                            &key,
                            req.policies,
                            ask,
                            &grant,
                            self.clock.now_ms(),
                        )),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        self.check_per_request(redis, req).await
    }
    /// Graceful shutdown: stops spending this instance's leases and gives their unspent
    /// units back to Redis, so other instances can use them in the same window. Best
    /// effort: what cannot be given back lapses with its window. Returns units given back.
    pub async fn give_back_leases(&self) -> u64 {
        let Backend::Redis(redis) = &self.backend else {
            return 0;
        };
        let mut back = 0;
        for unspent in self.leases.drain(self.clock.now_ms()) {
            match redis
                .give_back(
                    &unspent.key.client,
                    &unspent.key.route,
                    &unspent.policies,
                    &unspent.starts,
                    unspent.units,
                )
                .await
            {
                Ok(units) => back += units,
                Err(e) => {
                    log::info!("giving back unspent leases stopped: {e}");
                    break;
                }
            }
        }
        back
    }
}
