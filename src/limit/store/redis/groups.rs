//! A request's limits grouped by the Cluster hash slot they live in: a plan's keys are tagged
//! by the client, a keyed limit's by its key.

use crate::limit::store::request::{CheckRequest, Partition};
use crate::limit::Policy;
use std::sync::Arc;

/// A request's policies grouped by partition (one Cluster hash slot each), with their indexes in
/// the request.
pub struct HashSlotGroups;

pub struct HashSlotGroup {
    pub indexes: Vec<usize>,
    pub policies: Vec<Policy>,
    shadow: Vec<bool>,
    partitions: Vec<Partition>,
    waits: Vec<u64>,
    /// Each policy's cost, when the request's differ by policy (else empty).
    costs: Vec<u64>,
}

impl HashSlotGroup {
    /// The part of `req` that falls in this hash slot.
    pub fn request<'a>(&'a self, req: &CheckRequest<'a>) -> CheckRequest<'a> {
        CheckRequest {
            policies: &self.policies,
            shadow: &self.shadow,
            partitions: &self.partitions,
            waits: &self.waits,
            costs: &self.costs,
            ..*req
        }
    }
}

impl HashSlotGroups {
    pub fn of(req: &CheckRequest<'_>) -> Vec<HashSlotGroup> {
        let mut groups: Vec<(Arc<str>, HashSlotGroup)> = Vec::new();
        for (i, policy) in req.policies.iter().enumerate() {
            let owner = req.partition_of(i);
            let at = match groups.iter().position(|(o, _)| o == owner) {
                Some(at) => at,
                None => {
                    groups.push((
                        Arc::clone(owner),
                        HashSlotGroup {
                            indexes: Vec::new(),
                            policies: Vec::new(),
                            shadow: Vec::new(),
                            partitions: Vec::new(),
                            waits: Vec::new(),
                            costs: Vec::new(),
                        },
                    ));
                    groups.len() - 1
                }
            };
            let g = &mut groups[at].1;
            g.indexes.push(i);
            g.policies.push(policy.clone());
            g.shadow.push(req.shadow.get(i).copied().unwrap_or(false));
            g.partitions
                .push(req.partitions.get(i).cloned().unwrap_or(Partition::Client));
            g.waits.push(req.waits.get(i).copied().unwrap_or(0));
            if !req.costs.is_empty() {
                g.costs.push(req.cost_of(i));
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }
}
