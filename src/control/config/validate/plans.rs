//! `[plans.NAME]`: limits (algorithm, limit, window, burst, shadow, lease), `max_concurrent`.

use super::checks::*;
use crate::chain::cost::ResponseCost;
use crate::control::config::file::{AlgorithmFile, LimitFile, PlanFile};
use crate::control::config::model::PlanConfig;
use crate::control::config::units::WindowSetting;
use crate::limit::algorithm::MAX_PRODUCT;
use crate::limit::{Algorithm, Policy, IP_POLICY_NAME, RESERVED_POLICY_NAMES};

pub(super) fn algorithm(file: AlgorithmFile) -> Algorithm {
    match file {
        AlgorithmFile::TokenBucket => Algorithm::TokenBucket,
        AlgorithmFile::LeakyBucket => Algorithm::LeakyBucket,
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::SlidingWindow => Algorithm::SlidingWindow,
        AlgorithmFile::SlidingLog => Algorithm::SlidingLog,
    }
}

/// Sliding logs keep one entry per admitted unit: cap them so a typo cannot eat the memory.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 100_000;

pub(super) fn plan_config(name: &str, file: PlanFile, problems: &mut Problems) -> PlanConfig {
    let PlanFile {
        limits,
        max_concurrent,
        priority,
        exempt_from,
    } = file;
    let base = format!("plans.{name}");
    check_name(&base, name, problems);
    if limits.is_empty() {
        problems.push(format!("{base}.limits"), "a plan needs at least one limit");
    }
    let mut policies: Vec<Policy> = Vec::with_capacity(limits.len());
    let mut shadows: Vec<bool> = Vec::with_capacity(limits.len());
    let mut leases: Vec<(String, Option<u64>)> = Vec::with_capacity(limits.len());
    let mut response_costs = Vec::new();
    if let Some(n) = max_concurrent {
        refuse_zero(format!("{base}.max_concurrent"), n, problems);
    }
    for (i, limit) in limits.into_iter().enumerate() {
        let LimitFile {
            name: limit_name,
            algorithm: alg,
            limit,
            window,
            time_zone,
            burst,
            delay,
            shadow,
            lease,
            cost_from_response,
            max_response_cost,
            reserve,
        } = limit;
        let path = format!("{base}.limits[{i}]");
        if policies.iter().any(|p| *p.name == *limit_name) {
            problems.push(
                format!("{path}.name"),
                format!("{limit_name:?} is used twice in this plan"),
            );
        }
        // An invalid limit was reported and is left out (the file is refused).
        let shape = LimitShape {
            algorithm: alg,
            limit,
            window,
            time_zone,
            burst,
            delay,
        };
        if let Some(policy) = limit_policy(&path, &limit_name, shape, problems) {
            let charge = Charge {
                header: cost_from_response,
                max: max_response_cost,
                reserve,
            };
            if let Some(charged) = response_cost(&path, &policy, charge, lease, problems) {
                response_costs.push(charged);
            }
            policies.push(policy);
            shadows.push(shadow.unwrap_or(false));
            leases.push((path, lease));
        }
    }
    let lease = plan_lease(
        &base,
        &policies,
        &shadows,
        &leases,
        max_concurrent,
        problems,
    );
    PlanConfig {
        name: name.to_owned(),
        limits: policies,
        shadow: shadows,
        max_concurrent: max_concurrent.filter(|n| *n > 0),
        lease,
        priority: super::shedding::priority(priority),
        exempt_from: exempt_from.unwrap_or_default(),
        response_costs,
    }
}

/// What a limit says of charging from the response.
struct Charge {
    header: Option<String>,
    max: Option<u64>,
    reserve: Option<u64>,
}

/// A limit's `cost_from_response`: the header the upstream reports the cost in, the most one
/// response charges, and what a request reserves. Only window counters can be charged after
/// the fact.
fn response_cost(
    path: &str,
    policy: &Policy,
    charge: Charge,
    lease: Option<u64>,
    problems: &mut Problems,
) -> Option<ResponseCost> {
    let Charge {
        header,
        max,
        reserve,
    } = charge;
    let Some(text) = header else {
        for (key, given) in [
            ("max_response_cost", max.is_some()),
            ("reserve", reserve.is_some()),
        ] {
            if given {
                problems.push(format!("{path}.{key}"), "only with cost_from_response");
            }
        }
        return None;
    };
    let at = format!("{path}.cost_from_response");
    let name = match text
        .strip_prefix("header:")
        .map(|n| http::HeaderName::from_bytes(n.as_bytes()))
    {
        Some(Ok(name)) => name,
        _ => {
            problems.push(&at, format!("{text:?}: expected \"header:NAME\""));
            return None;
        }
    };
    if !matches!(
        policy.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    ) {
        problems.push(
            &at,
            format!(
                "only fixed_window and sliding_window are charged after the response, not {}",
                policy.algorithm
            ),
        );
        return None;
    }
    if lease.is_some() {
        problems.push(&at, "a leased limit cannot be charged after the response");
        return None;
    }
    // A sliding window weighs its counts by the window: overdrawn counts must stay exact.
    if policy.algorithm == Algorithm::SlidingWindow
        && policy
            .limit()
            .saturating_mul(policy.window_ms())
            .saturating_mul(4)
            > MAX_PRODUCT
    {
        problems.push(
            path,
            "limit × window is too large for a budget that may be overdrawn (×2) exactly",
        );
    }
    let max = at_least_one(
        format!("{path}.max_response_cost"),
        max,
        policy.limit(),
        problems,
    );
    let reserve = reserve.filter(|n| {
        let ok = (1..=max).contains(n);
        if !ok {
            problems.push(
                format!("{path}.reserve"),
                format!("{n}: expected 1 to max_response_cost ({max})"),
            );
        }
        ok
    });
    Some(ResponseCost {
        limit: std::sync::Arc::clone(&policy.name),
        header: name,
        max,
        reserve,
    })
}

/// Quota leasing is all or nothing per plan: one local lease decides every limit of a
/// request, so each must be a window that bounds the lease's life (fixed or sliding), and
/// enforced (a dry run counts every request, which a lease would hide). The plan leases the
/// smallest size its limits ask for.
pub(super) fn plan_lease(
    base: &str,
    policies: &[Policy],
    shadows: &[bool],
    leases: &[(String, Option<u64>)],
    max_concurrent: Option<u64>,
    problems: &mut Problems,
) -> Option<u64> {
    if leases.iter().all(|(_, l)| l.is_none()) {
        return None;
    }
    if max_concurrent.is_some() {
        problems.push(
            format!("{base}.max_concurrent"),
            "a plan whose limits are leased cannot have a concurrency limit (each request must reach the store for its slot)",
        );
    }
    for ((path, lease), (policy, shadow)) in leases.iter().zip(policies.iter().zip(shadows)) {
        match lease {
            None => problems.push(
                format!("{path}.lease"),
                "every limit of a plan that leases must lease (one local lease decides them all)",
            ),
            Some(0) => refuse_zero(format!("{path}.lease"), 0, problems),
            Some(n) if *n > policy.limit() => problems.push(
                format!("{path}.lease"),
                format!("cannot exceed the limit ({})", policy.limit()),
            ),
            Some(_) => {}
        }
        if policy.calendar().is_some() {
            problems.push(
                format!("{path}.lease"),
                "calendar windows are not leased (each instance would need the calendar's boundaries for its slice)",
            );
        }
        if !matches!(
            policy.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow
        ) {
            problems.push(
                format!("{path}.lease"),
                format!(
                    "only fixed_window and sliding_window limits can be leased (a lease lives until its window ends), not {}",
                    policy.algorithm
                ),
            );
        }
        if *shadow {
            problems.push(
                format!("{path}.lease"),
                "a shadow (dry-run) limit cannot be leased",
            );
        }
    }
    leases
        .iter()
        .filter_map(|(_, l)| *l)
        .min()
        .filter(|n| *n > 0)
}

/// The checks every limit passes, a plan's or a route's: its name, its numbers, exact
/// arithmetic. `None` when some value is invalid (reported; the file is refused).
/// What a limit is, as written (the fields plan limits and route limits share).
pub(super) struct LimitShape {
    pub algorithm: AlgorithmFile,
    pub limit: u64,
    pub window: WindowSetting,
    pub time_zone: Option<String>,
    pub burst: Option<u64>,
    pub delay: Option<u64>,
}

pub(super) fn limit_policy(
    path: &str,
    limit_name: &str,
    shape: LimitShape,
    problems: &mut Problems,
) -> Option<Policy> {
    let LimitShape {
        algorithm: alg,
        limit,
        window,
        time_zone,
        burst,
        delay,
    } = shape;
    check_name(&format!("{path}.name"), limit_name, problems);
    if limit_name == IP_POLICY_NAME {
        problems.push(
            format!("{path}.name"),
            "\"ip\" is reserved for the per-IP limit",
        );
    } else if RESERVED_POLICY_NAMES.contains(&limit_name) {
        problems.push(
            format!("{path}.name"),
            format!("{limit_name:?} is reserved for concurrency limits (max_concurrent)"),
        );
    }
    let alg = algorithm(alg);
    refuse_zero(format!("{path}.limit"), limit, problems);
    let window = match window {
        WindowSetting::Calendar(unit) => {
            return calendar_policy(
                path, limit_name, alg, limit, unit, time_zone, burst, problems,
            )
        }
        WindowSetting::Duration(d) => d,
    };
    if time_zone.is_some() {
        problems.push(
            format!("{path}.time_zone"),
            "only calendar windows (\"1 day\", \"1 week\", \"1 month\") have a time zone",
        );
    }
    let window_ms = window.as_millis() as u64;
    if window_ms == 0 {
        problems.push(format!("{path}.window"), "must be greater than zero");
    }
    if alg == Algorithm::LeakyBucket {
        return leaky_policy(path, limit_name, limit, window_ms, burst, delay, problems);
    }
    if delay.is_some() {
        problems.push(format!("{path}.delay"), "only leaky_bucket has a delay");
    }
    let burst = match (alg, burst) {
        (Algorithm::TokenBucket, Some(b)) => {
            at_least_one(format!("{path}.burst"), Some(b), limit, problems)
        }
        (Algorithm::TokenBucket, None) => limit,
        (_, Some(_)) => {
            problems.push(
                format!("{path}.burst"),
                format!("only token_bucket and leaky_bucket have a burst, not {alg}"),
            );
            limit
        }
        (_, None) => limit,
    };
    if burst.max(limit).saturating_mul(window_ms).saturating_mul(2) > MAX_PRODUCT {
        problems.push(path, "limit × window is too large for exact arithmetic");
    }
    if alg == Algorithm::SlidingLog && limit > MAX_SLIDING_LOG_LIMIT {
        problems.push(
            format!("{path}.limit"),
            format!("a sliding_log keeps one entry per request: at most {MAX_SLIDING_LOG_LIMIT} (use sliding_window for larger limits)"),
        );
    }
    Policy::try_new(limit_name, alg, limit, window_ms, burst).ok()
}

/// nginx's `limit_req`: `limit` per `window` leave; `burst` (default 0) may wait; `delay`
/// (default 0) of those pass at once.
fn leaky_policy(
    path: &str,
    name: &str,
    limit: u64,
    window_ms: u64,
    burst: Option<u64>,
    delay: Option<u64>,
    problems: &mut Problems,
) -> Option<Policy> {
    let burst = burst.unwrap_or(0);
    let delay = delay.unwrap_or(0);
    if delay > burst {
        problems.push(
            format!("{path}.delay"),
            format!("{delay} is more than burst ({burst}): delay counts requests of the burst"),
        );
    }
    if burst
        .saturating_add(2)
        .saturating_mul(window_ms)
        .saturating_mul(2)
        > MAX_PRODUCT
    {
        problems.push(path, "burst × window is too large for exact arithmetic");
    }
    Policy::leaky_bucket(name, limit, window_ms, burst, delay).ok()
}

/// A fixed window aligned to the calendar in `time_zone` (UTC by default).
#[allow(clippy::too_many_arguments)]
fn calendar_policy(
    path: &str,
    name: &str,
    alg: Algorithm,
    limit: u64,
    unit: crate::limit::calendar::Unit,
    time_zone: Option<String>,
    burst: Option<u64>,
    problems: &mut Problems,
) -> Option<Policy> {
    if alg != Algorithm::FixedWindow {
        problems.push(
            format!("{path}.window"),
            format!("a calendar window is a fixed window: algorithm = \"fixed_window\", not {alg}"),
        );
        return None;
    }
    if burst.is_some() {
        problems.push(format!("{path}.burst"), "only token_bucket has a burst");
    }
    let zone = time_zone.unwrap_or_else(|| "UTC".to_owned());
    let calendar = crate::limit::calendar::Calendar::new(unit, &zone)
        .map_err(|why| problems.push(format!("{path}.time_zone"), why))
        .ok()?;
    Policy::calendar_window(name, limit, calendar).ok()
}
