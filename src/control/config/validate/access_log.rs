//! `[access_log]`.

use super::checks::*;
use crate::control::config::file::{AccessLogFile, AccessLogModeFile};
use crate::control::config::model::AccessLogConfig;

pub(super) fn access_log_config(file: AccessLogFile, problems: &mut Problems) -> AccessLogConfig {
    use crate::ops::access_log::{Mode, Target};
    let AccessLogFile { mode, sample, path } = file;
    let mode = match (mode.unwrap_or(AccessLogModeFile::Off), sample) {
        (AccessLogModeFile::Sampled, Some(f)) if f > 0.0 && f <= 1.0 => Mode::Sampled(f),
        (AccessLogModeFile::Sampled, Some(f)) => {
            problems.push(
                "access_log.sample",
                format!("{f}: expected a fraction greater than 0 and at most 1"),
            );
            Mode::Off
        }
        (AccessLogModeFile::Sampled, None) => {
            problems.push(
                "access_log.sample",
                "mode = \"sampled\" needs a sample fraction, like 0.1",
            );
            Mode::Off
        }
        (_, Some(_)) => {
            problems.push(
                "access_log.sample",
                "only mode = \"sampled\" takes a sample fraction",
            );
            Mode::Off
        }
        (AccessLogModeFile::Off, None) => Mode::Off,
        (AccessLogModeFile::On, None) => Mode::On,
    };
    let target = match path.as_deref() {
        None | Some("stdout") | Some("-") => Target::Stdout,
        Some("") => {
            problems.push("access_log.path", "expected \"stdout\" or a file path");
            Target::Stdout
        }
        Some(p) => Target::File(p.into()),
    };
    AccessLogConfig { mode, target }
}
