//! Checks across routes and plans: a route's cost fits every limit it meets, route and plan
//! limits keep apart names, exemptions name limits that exist.

use super::checks::Problems;
use crate::control::config::model::{PlanConfig, RouteConfig};
use std::collections::BTreeMap;

/// A route's cost must fit every plan limit and every limit of its own at least once, or its
/// requests could never pass; and a route limit must not share a name with a plan limit (the
/// `RateLimit` headers name both).
pub(super) fn check_costs(
    routes: &[RouteConfig],
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) {
    for (i, route) in routes.iter().enumerate() {
        for (j, limit) in route.limits.iter().enumerate() {
            if route.cost > limit.policy.capacity() {
                problems.push(
                    format!("routes[{i}].cost"),
                    format!(
                        "{} is more than the route's limit {:?} admits at once ({})",
                        route.cost,
                        limit.policy.name,
                        limit.policy.capacity()
                    ),
                );
            }
            if !route.auth.identifies() {
                continue;
            }
            for plan in plans.values() {
                if plan.limits.iter().any(|p| p.name == limit.policy.name) {
                    problems.push(
                        format!("routes[{i}].limits[{j}].name"),
                        format!(
                            "{:?} is also a limit of plan {:?}: the RateLimit headers name both, use another name",
                            limit.policy.name, plan.name
                        ),
                    );
                }
            }
        }
        if !route.auth.identifies() {
            continue;
        }
        for plan in plans.values() {
            for policy in &plan.limits {
                if route.cost > policy.capacity() {
                    problems.push(
                        format!("routes[{i}].cost"),
                        format!(
                            "{} is more than limit {:?} of plan {:?} admits at once ({}): such requests could never pass",
                            route.cost,
                            policy.name,
                            plan.name,
                            policy.capacity()
                        ),
                    );
                }
            }
        }
    }
}

/// Exemptions name limits that exist: a route's `exempt` the route's own limits, its plans'
/// or "ip"; a plan's `exempt_from` route limits somewhere or "ip".
pub(super) fn check_exemptions(
    routes: &[RouteConfig],
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) {
    let plan_limit = |name: &str| {
        plans
            .values()
            .any(|p| p.limits.iter().any(|l| *l.name == *name))
    };
    for (i, route) in routes.iter().enumerate() {
        for (j, rule) in route.exempt.iter().enumerate() {
            let names_ip = rule
                .limits
                .as_ref()
                .is_some_and(|l| l.iter().any(|n| n == crate::limit::IP_POLICY_NAME));
            if names_ip && rule.nets.is_empty() {
                problems.push(
                    format!("routes[{i}].exempt[{j}].limits"),
                    "only addresses skip the per-IP bucket (it runs before callers are identified): add ips",
                );
            }
            for (k, name) in rule.limits.iter().flatten().enumerate() {
                let known = name == "ip"
                    || route.limits.iter().any(|l| *l.policy.name == **name)
                    || (route.auth.identifies() && plan_limit(name));
                if !known {
                    problems.push(
                        format!("routes[{i}].exempt[{j}].limits[{k}]"),
                        format!("no limit {name:?} applies on this route"),
                    );
                }
            }
        }
    }
    for plan in plans.values() {
        for (k, name) in plan.exempt_from.iter().enumerate() {
            if name == crate::limit::IP_POLICY_NAME {
                problems.push(
                    format!("plans.{}.exempt_from[{k}]", plan.name),
                    "the per-IP bucket runs before callers are identified: exempt addresses on a route (exempt = [{ ips = [...] }]) instead",
                );
                continue;
            }
            let known = routes
                .iter()
                .any(|r| r.limits.iter().any(|l| *l.policy.name == **name));
            if !known {
                problems.push(
                    format!("plans.{}.exempt_from[{k}]", plan.name),
                    format!("no route has a limit {name:?}"),
                );
            }
        }
    }
}
