//! A route's `retry` and an upstream's `retry_budget`.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::{RetryBudgetFile, RetryFile};
use crate::control::config::units::HumanDuration;
use crate::upstream::retry::{BudgetSettings, RetryPolicy};

pub(super) fn policy(base: &str, file: RetryFile, problems: &mut Problems) -> RetryPolicy {
    let base = format!("{base}.retry");
    let RetryFile {
        attempts,
        on,
        per_try_timeout,
        timeout,
        backoff,
        max_backoff,
        methods,
    } = file;
    let attempts = match attempts {
        Some(n) if !(2..=10).contains(&n) => {
            problems.push(
                format!("{base}.attempts"),
                "expected 2 to 10 (the first try included)",
            );
            defaults::RETRY_ATTEMPTS
        }
        Some(n) => n,
        None => defaults::RETRY_ATTEMPTS,
    };
    let (mut on_timeout, mut on_reset, mut statuses) = (false, false, Vec::new());
    let on = on.unwrap_or_else(|| ["timeout", "reset", "gateway"].map(str::to_owned).to_vec());
    if on.is_empty() {
        problems.push(format!("{base}.on"), "name at least one condition");
    }
    for (i, word) in on.iter().enumerate() {
        match word.as_str() {
            "timeout" => on_timeout = true,
            "reset" => on_reset = true,
            "5xx" => statuses.extend(500..=599),
            "gateway" => statuses.extend([502, 503, 504]),
            other => match other.parse::<u16>() {
                Ok(status) if (500..=599).contains(&status) || status == 429 => {
                    statuses.push(status)
                }
                _ => problems.push(
                    format!("{base}.on[{i}]"),
                    format!(
                        "{other:?}: expected \"timeout\", \"reset\", \"5xx\", \"gateway\" or a status (429, 500-599)"
                    ),
                ),
            },
        }
    }
    statuses.sort_unstable();
    statuses.dedup();
    let optional = |name: &str, value: Option<HumanDuration>, problems: &mut Problems| match value {
        Some(HumanDuration(d)) if d.is_zero() => {
            problems.push(format!("{base}.{name}"), "must be greater than zero");
            None
        }
        Some(HumanDuration(d)) => Some(d),
        None => None,
    };
    let per_try_timeout = optional("per_try_timeout", per_try_timeout, problems);
    let timeout = optional("timeout", timeout, problems);
    let backoff = match backoff {
        Some(HumanDuration(d)) => d,
        None => defaults::RETRY_BACKOFF,
    };
    let max_backoff = match max_backoff {
        Some(HumanDuration(d)) => d,
        None => defaults::RETRY_MAX_BACKOFF.max(backoff),
    };
    if max_backoff < backoff {
        problems.push(format!("{base}.max_backoff"), "must be at least backoff");
    }
    let methods = methods.map(|list| {
        list.iter()
            .enumerate()
            .filter_map(|(i, m)| match http::Method::from_bytes(m.as_bytes()) {
                Ok(method) if m.bytes().all(|b| b.is_ascii_uppercase()) => Some(method),
                _ => {
                    problems.push(
                        format!("{base}.methods[{i}]"),
                        format!("{m:?} is not an upper-case method name"),
                    );
                    None
                }
            })
            .collect()
    });
    RetryPolicy {
        attempts,
        on_timeout,
        on_reset,
        statuses,
        per_try_timeout,
        timeout,
        backoff,
        max_backoff,
        methods,
    }
}

pub(super) fn budget(
    base: &str,
    file: Option<RetryBudgetFile>,
    problems: &mut Problems,
) -> BudgetSettings {
    let default = BudgetSettings::default();
    let Some(RetryBudgetFile {
        percent,
        min_retries,
    }) = file
    else {
        return default;
    };
    let percent = match percent {
        Some(p) if p > 100 => {
            problems.push(format!("{base}.retry_budget.percent"), "expected 0 to 100");
            default.percent
        }
        Some(p) => p,
        None => default.percent,
    };
    BudgetSettings {
        percent,
        min_retries: min_retries.unwrap_or(default.min_retries),
    }
}
