//! A request over several Cluster hash slots (a plan's keys are tagged by the client, a keyed
//! limit's by its key): one check per hash slot, admitted only if all admit, units given
//! back where one refused (each check and refund batched on its slot's node).

use super::batch::Kind;
use super::groups::HashSlotGroups;
use super::landing::Landing;
use super::RedisStore;
use crate::limit::store::error::StoreError;
use crate::limit::store::request::CheckRequest;
use crate::limit::Verdict;
use std::sync::atomic::AtomicBool;

impl RedisStore {
    /// A request over several Cluster hash slots: one check per hash slot, sent together
    /// (pipelined to their nodes). Admitted only if every one admits; when one rejects (or
    /// fails), those that admitted give their units back (`lua/refund.lua`) before the answer.
    /// Between the two, another request can see those units taken and be refused for them —
    /// never admitted beyond a limit — for one round trip.
    /// (`landing`: as [`decide`](RedisStore::decide)'s, held by every hash slot's call.)
    pub(super) async fn check_across_hash_slots(
        &self,
        req: &CheckRequest<'_>,
        landing: Option<Landing>,
    ) -> Result<Verdict, StoreError> {
        let groups = HashSlotGroups::of(req);
        let landing = &landing;
        let calls = groups
            .iter()
            // A Cluster: each node's breaker sees its own calls (`queued` is not read).
            .map(|g| async move {
                let queued = AtomicBool::new(false);
                self.check_one_hash_slot(&g.request(req), &queued, landing.clone())
                    .await
            });
        let results = futures::future::join_all(calls).await;
        let all_admitted = results.iter().all(|r| r.as_ref().is_ok_and(|v| v.admitted));
        let mut refunded = vec![false; groups.len()];
        if !all_admitted {
            for (i, (g, result)) in groups.iter().zip(&results).enumerate() {
                let Ok(verdict) = result else { continue };
                if !verdict.admitted {
                    continue;
                }
                let waits: Vec<u64> = (0..g.policies.len())
                    .map(|i| verdict.wait_of(&g.policies, i))
                    .collect();
                let sub = CheckRequest {
                    waits: &waits,
                    ..g.request(req)
                };
                let committed = |i: usize| verdict.decisions[i].allowed;
                let once = super::settlements::once_id();
                let at = (verdict.at_ms, once.as_str());
                let Some(invocation) =
                    self.scripts
                        .refund_call(&self.config.prefix, &sub, committed, at)
                else {
                    continue;
                };
                // Batched on the slot's node like the checks were (a refund member).
                match self
                    .settle(invocation, Kind::Refund, super::settlements::ONCE_HORIZON)
                    .await
                {
                    Ok(_) => refunded[i] = true,
                    Err(e) => log::debug!("giving back units of a rejected request failed: {e}"),
                }
            }
        }
        let mut decisions = vec![None; req.policies.len()];
        let mut now = 0;
        for ((g, result), refunded) in groups.iter().zip(results).zip(refunded) {
            let verdict = result?;
            now = now.max(verdict.at_ms);
            for (&i, mut d) in g.indexes.iter().zip(verdict.decisions) {
                if refunded && d.allowed {
                    // Reported as the state stays: the units are back.
                    d.remaining = (d.remaining + req.cost_of(i)).min(d.limit);
                }
                decisions[i] = Some(d);
            }
        }
        let decisions = decisions
            .into_iter()
            .map(|d| d.ok_or_else(|| StoreError::Protocol("a policy without a decision".into())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Verdict {
            admitted: all_admitted,
            decisions,
            at_ms: now,
            from_lease: false,
        })
    }
}
