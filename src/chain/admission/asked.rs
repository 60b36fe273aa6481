//! What one request asks of the store: which policies, whose counts (partitions), which of
//! them are dry runs.

use crate::chain::admission::rules::RouteRules;
use crate::chain::admission::Outcome;
use crate::chain::auth::{Client, Plan};
use crate::chain::exempt::Skips;
use crate::chain::partition::{KeyInputs, Missing, PartError};
use crate::chain::reject::Reject;
use crate::limit::store::request::Partition;
use crate::limit::Policy;
use std::borrow::Cow;
use std::sync::Arc;

/// The route's keyed limits that apply to this request, with their partitions; limits whose
/// key is missing a part and say `missing = "skip"` are left out (`None`).
pub(super) fn keyed_partitions(
    rules: &RouteRules,
    inputs: &KeyInputs<'_>,
    skips: &Skips,
) -> Result<Vec<Option<Partition>>, Reject> {
    rules
        .keyed
        .iter()
        .map(|limit| {
            if skips.skips(&limit.policy.name) {
                // Exempt: not asked about, its key not even read.
                return Ok(None);
            }
            match rules.hasher.partition(&limit.key, limit.missing, inputs) {
                Ok(key) => Ok(Some(Partition::Keyed(key.into()))),
                Err(PartError::Missing(_)) if limit.missing == Missing::Skip => Ok(None),
                Err(PartError::Missing(what)) => Err(Reject::MissingKeyPart(format!(
                    "this route's limit {:?} counts by {what}, which the request lacks",
                    limit.policy.name
                ))),
                Err(PartError::Ambiguous(what)) => Err(Reject::AmbiguousKeyPart(format!(
                    "this route's limit {:?} counts by a value the request gives ambiguously: {what}",
                    limit.policy.name
                ))),
            }
        })
        .collect()
}

/// Everything asked of the store for one request, in one order: the plan's limits and the
/// route's concurrency limit (an authenticated client), then the route's keyed limits.
/// Borrowed from the plan (no allocation) when that is all.
pub(super) struct Asked<'a> {
    pub(super) policies: Cow<'a, [Policy]>,
    pub(super) shadow: Cow<'a, [bool]>,
    pub(super) partitions: Vec<Partition>,
    /// A keyed limit does not apply (its key is missing and it says skip, or it is exempt).
    pub(super) keyed_skipped: bool,
    /// Some limit was left out by an exemption.
    pub(super) exempted: bool,
}

impl<'a> Asked<'a> {
    /// `skips`: what exemptions leave out (each recorded as `exempt`).
    pub(super) fn new(
        rules: &RouteRules,
        client: Option<&'a Arc<Client>>,
        keyed: &[Option<Partition>],
        skips: &Skips,
        record: &mut impl FnMut(&str, Outcome),
    ) -> Asked<'a> {
        let (mut policies, mut shadow) = match client {
            Some(c) => request_policies(rules, &c.plan),
            None => (Cow::Borrowed(&[][..]), Cow::Borrowed(&[][..])),
        };
        let mut exempted = false;
        if *skips != Skips::Nothing && policies.iter().any(|p| skips.skips(&p.name)) {
            let (kept, kept_shadow): (Vec<Policy>, Vec<bool>) = policies
                .iter()
                .zip(shadow.iter())
                .filter(|(p, _)| {
                    let skip = skips.skips(&p.name);
                    if skip {
                        record(&p.name, Outcome::Exempt);
                    }
                    !skip
                })
                .map(|(p, s)| (p.clone(), *s))
                .unzip();
            (policies, shadow, exempted) = (Cow::Owned(kept), Cow::Owned(kept_shadow), true);
        }
        let mut partitions = Vec::new();
        let mut keyed_skipped = false;
        if !keyed.is_empty() {
            partitions = vec![Partition::Client; policies.len()];
            let (policies, shadow) = (policies.to_mut(), shadow.to_mut());
            for (limit, partition) in rules.keyed.iter().zip(keyed) {
                let Some(partition) = partition else {
                    if skips.skips(&limit.policy.name) {
                        record(&limit.policy.name, Outcome::Exempt);
                        exempted = true;
                    }
                    keyed_skipped = true;
                    continue;
                };
                policies.push(limit.policy.clone());
                shadow.push(limit.shadow || rules.shadow);
                partitions.push(partition.clone());
            }
        }
        Asked {
            policies,
            shadow,
            partitions,
            keyed_skipped,
            exempted,
        }
    }
}

/// The policies a request on `rules`' route is decided against, with their shadow flags: the
/// plan's (rate limits, client-wide concurrency), then the route's concurrency limit; on a
/// dry-run route every one of them is a dry run. Borrowed (no allocation) in the common case.
pub fn request_policies<'a>(
    rules: &RouteRules,
    plan: &'a Plan,
) -> (Cow<'a, [Policy]>, Cow<'a, [bool]>) {
    if rules.concurrency.is_none() && !rules.shadow {
        return (Cow::Borrowed(&plan.policies), Cow::Borrowed(&plan.shadow));
    }
    let mut policies = plan.policies.clone();
    let mut shadow = plan.shadow.clone();
    if let Some((policy, _)) = &rules.concurrency {
        policies.push(policy.clone());
        shadow.push(false);
    }
    if rules.shadow {
        shadow.iter_mut().for_each(|s| *s = true);
    }
    (Cow::Owned(policies), Cow::Owned(shadow))
}
