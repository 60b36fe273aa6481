//! `[upstreams.NAME.shedding]` and the `priority` of routes and plans.

use super::checks::*;
use crate::control::config::defaults::shedding as d;
use crate::control::config::file::{PriorityFile, SheddingFile};
use crate::control::config::units::HumanDuration;
use crate::upstream::shed::controller::ControllerSettings;
use crate::upstream::shed::{GateSettings, Priority};
use std::time::Duration;

/// Largest `max_limit` and `queue`: a typo should not mean a million waiting requests.
pub const MAX_SHEDDING_LIMIT: u32 = 100_000;
/// Longest `window` and `queue_timeout`.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub(super) fn priority(file: Option<PriorityFile>) -> Option<Priority> {
    file.map(|p| match p {
        PriorityFile::Critical => Priority::Critical,
        PriorityFile::Default => Priority::Default,
        PriorityFile::Sheddable => Priority::Sheddable,
    })
}

/// `None` when the table is absent or `enabled = false`.
pub(super) fn shedding_config(
    base: &str,
    file: Option<SheddingFile>,
    problems: &mut Problems,
) -> Option<GateSettings> {
    let SheddingFile {
        enabled,
        min_limit,
        max_limit,
        initial_limit,
        tolerance,
        window,
        baseline_interval,
        smoothing,
        queue,
        queue_timeout,
        reserve_critical,
        reserve_default,
    } = file?;
    let base = format!("{base}.shedding");
    let at = |field: &str| format!("{base}.{field}");
    let max = MAX_SHEDDING_LIMIT as usize;
    let count = |field: &str, v: Option<u32>, default: u32, problems: &mut Problems| {
        bounded(
            &at(field),
            v.map(|v| v as usize),
            default as usize,
            1,
            max,
            problems,
        ) as u32
    };
    let min_limit = count("min_limit", min_limit, d::MIN_LIMIT, problems);
    let max_limit = count(
        "max_limit",
        max_limit,
        d::MAX_LIMIT.max(min_limit),
        problems,
    );
    if max_limit < min_limit {
        problems.push(
            at("max_limit"),
            format!("{max_limit} is below min_limit ({min_limit})"),
        );
    }
    let initial_default = d::INITIAL_LIMIT.clamp(min_limit, max_limit.max(min_limit));
    let initial_limit = count("initial_limit", initial_limit, initial_default, problems);
    if !(min_limit..=max_limit).contains(&initial_limit) {
        problems.push(
            at("initial_limit"),
            format!("{initial_limit} is outside min_limit..max_limit ({min_limit}..{max_limit})"),
        );
    }
    let mut ratio =
        |field: &str, v: Option<f64>, default: f64, range: (f64, f64), incl: bool| match v {
            Some(v) if v.is_finite() && v >= range.0 && (v < range.1 || incl && v == range.1) => v,
            Some(v) => {
                let upper = if incl { "]" } else { ")" };
                problems.push(
                    at(field),
                    format!("{v}: expected a number in [{}, {}{upper}", range.0, range.1),
                );
                default
            }
            None => default,
        };
    let tolerance = ratio("tolerance", tolerance, d::TOLERANCE, (1.0, 10.0), true);
    let smoothing = ratio("smoothing", smoothing, d::SMOOTHING, (0.01, 1.0), true);
    let reserve_critical = ratio(
        "reserve_critical",
        reserve_critical,
        d::RESERVE_CRITICAL,
        (0.0, 1.0),
        false,
    );
    let reserve_default = ratio(
        "reserve_default",
        reserve_default,
        d::RESERVE_DEFAULT,
        (0.0, 1.0),
        false,
    );
    if reserve_critical + reserve_default >= 1.0 {
        problems.push(
            at("reserve_default"),
            format!(
                "reserve_critical + reserve_default is {}: it must stay below 1, or sheddable \
                 requests would never be served",
                reserve_critical + reserve_default
            ),
        );
    }
    let mut wait = |field: &str, v: Option<HumanDuration>, default: Duration| {
        let value = positive(at(field), v, default, problems);
        if value > MAX_WAIT {
            problems.push(at(field), "must be at most 60s");
            return default;
        }
        value
    };
    let window = wait("window", window, d::WINDOW);
    let queue_timeout = wait("queue_timeout", queue_timeout, d::QUEUE_TIMEOUT);
    let baseline_interval = positive(
        at("baseline_interval"),
        baseline_interval,
        d::BASELINE_INTERVAL,
        problems,
    );
    if baseline_interval < window {
        problems.push(
            at("baseline_interval"),
            "must be at least the window: the baseline is the lowest window's latency",
        );
    }
    let queue = bounded(&at("queue"), queue, d::QUEUE, 0, max, problems);
    enabled.unwrap_or(true).then_some(GateSettings {
        controller: ControllerSettings {
            min_limit,
            max_limit,
            initial_limit,
            tolerance,
            window,
            baseline_interval,
            smoothing,
        },
        queue,
        queue_timeout,
        reserve_critical,
        reserve_default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(file: SheddingFile) -> (Option<GateSettings>, Vec<String>) {
        let mut problems = Problems::default();
        let settings = shedding_config("upstreams.orders", Some(file), &mut problems);
        let errors = problems.errors.into_iter().map(|p| p.path).collect();
        (settings, errors)
    }

    #[test]
    fn an_empty_table_turns_shedding_on_with_the_defaults() {
        let (settings, errors) = check(SheddingFile::default());
        assert!(errors.is_empty(), "{errors:?}");
        let s = settings.unwrap();
        assert_eq!(s.controller.initial_limit, d::INITIAL_LIMIT);
        assert_eq!(s.queue, d::QUEUE);
        let (off, _) = check(SheddingFile {
            enabled: Some(false),
            ..SheddingFile::default()
        });
        assert_eq!(off, None);
    }

    #[test]
    fn inconsistent_values_are_refused_by_name() {
        let (_, errors) = check(SheddingFile {
            min_limit: Some(50),
            max_limit: Some(10),
            tolerance: Some(0.5),
            reserve_critical: Some(0.6),
            reserve_default: Some(0.5),
            queue_timeout: Some(HumanDuration(Duration::from_secs(120))),
            smoothing: Some(f64::NAN),
            ..SheddingFile::default()
        });
        for field in [
            "max_limit",
            "initial_limit",
            "tolerance",
            "reserve_default",
            "queue_timeout",
            "smoothing",
        ] {
            let path = format!("upstreams.orders.shedding.{field}");
            assert!(errors.contains(&path), "{path} not in {errors:?}");
        }
    }
}
