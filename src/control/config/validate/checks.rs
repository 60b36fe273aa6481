//! Problems found while converting, and the checks shared by every table.

use crate::control::config::error::Problem;
use crate::control::config::units::HumanDuration;
use std::time::Duration;

/// Longest route / upstream name accepted (names end up in metric labels and store keys).
pub const MAX_NAME_LEN: usize = 64;

/// Problems found so far: errors (the file is refused) and warnings (it is accepted, and the
/// warning is shown by `turnstile check`, at start and on reload).
#[derive(Default)]
pub(super) struct Problems {
    pub(super) errors: Vec<Problem>,
    pub(super) warnings: Vec<Problem>,
    /// Other files the configuration reads (secrets, certificates): a change to one of them
    /// is a change of the configuration.
    pub(super) files: Vec<std::path::PathBuf>,
}

impl Problems {
    pub(super) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(Problem {
            path: path.into(),
            message: message.into(),
            location: None,
        });
    }

    pub(super) fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            path: path.into(),
            message: message.into(),
            location: None,
        });
    }
}

/// A number that must be at least 1: `value`, or `default` when absent; a 0 is a problem and
/// reads as the default.
pub(super) fn at_least_one<T: Copy + PartialEq + Default>(
    path: impl Into<String>,
    value: Option<T>,
    default: T,
    problems: &mut Problems,
) -> T {
    match value {
        Some(v) if v == T::default() => {
            problems.push(path, "must be at least 1");
            default
        }
        Some(v) => v,
        None => default,
    }
}

/// A 0 where at least 1 is needed is a problem.
pub(super) fn refuse_zero<T: Copy + PartialEq + Default>(
    path: impl Into<String>,
    value: T,
    problems: &mut Problems,
) {
    if value == T::default() {
        problems.push(path, "must be at least 1");
    }
}

pub(super) fn bounded<T: Copy + PartialOrd + std::fmt::Display>(
    path: &str,
    value: Option<T>,
    default: T,
    min: T,
    max: T,
    problems: &mut Problems,
) -> T {
    match value {
        Some(v) if v < min || v > max => {
            problems.push(path, format!("{v}: expected {min} to {max}"));
            default
        }
        Some(v) => v,
        None => default,
    }
}

/// Names appear in metric labels, logs and store keys: keep them boring.
pub(super) fn check_name(path: &str, name: &str, problems: &mut Problems) {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        // `.` and `..` cannot be named in a URL path (the admin API's /clients/{id}).
        && !name.bytes().all(|b| b == b'.');
    if !ok {
        problems.push(
            path,
            format!(
                "invalid name {name:?}: expected 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ - ., not only dots"
            ),
        );
    }
}

pub(super) fn positive(
    path: String,
    value: Option<HumanDuration>,
    default: Duration,
    p: &mut Problems,
) -> Duration {
    match value {
        Some(HumanDuration(d)) if d.is_zero() => {
            p.push(path, "must be greater than zero");
            default
        }
        Some(HumanDuration(d)) => d,
        None => default,
    }
}

/// A secret's value (literal, environment variable or file); a problem at `path` when it
/// cannot be had.
pub(super) fn secret(
    path: &str,
    source: &crate::control::config::units::SecretSource,
    problems: &mut Problems,
) -> Option<crate::control::config::units::Secret> {
    if let Some(file) = source.file() {
        problems.files.push(file.to_owned());
    }
    source
        .resolve()
        .map_err(|why| problems.push(path, why))
        .ok()
}
