//! `[tracing]`: where spans go, how many are kept, how they are batched.

use super::checks::*;
use crate::control::config::file::{ParentBasedFile, TracingFile};
use crate::control::config::view::redact_url;
use crate::ops::trace::export::ExportSettings;
use crate::ops::trace::{ParentBased, TraceSettings};
use std::time::Duration;

const DEFAULT_SERVICE: &str = "turnstile";
const DEFAULT_RATIO: f64 = 1.0;
const DEFAULT_QUEUE: usize = 2048;
const DEFAULT_BATCH: usize = 512;
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_MAX_SAMPLED_PER_SECOND: u32 = 100;

/// `None` when the table is absent or `enabled = false`.
pub(super) fn tracing_config(
    file: Option<TracingFile>,
    problems: &mut Problems,
) -> Option<TraceSettings> {
    let TracingFile {
        enabled,
        endpoint,
        service_name,
        sample_ratio,
        parent_based,
        max_sampled_per_second,
        queue,
        batch,
        export_interval,
        export_timeout,
    } = file?;
    match url::Url::parse(&endpoint) {
        Ok(u) if u.scheme() == "http" && u.host().is_some() => {}
        Ok(u) if u.scheme() == "https" => problems.push(
            "tracing.endpoint",
            "https is not supported yet: send to a collector over http (a local agent or sidecar)",
        ),
        _ => problems.push(
            "tracing.endpoint",
            format!(
                "{:?}: expected an OTLP/HTTP URL like \"http://127.0.0.1:4318/v1/traces\"",
                redact_url(&endpoint)
            ),
        ),
    }
    let service_name = service_name.unwrap_or_else(|| DEFAULT_SERVICE.to_owned());
    if service_name.is_empty()
        || service_name.len() > 128
        || service_name.chars().any(char::is_control)
    {
        problems.push(
            "tracing.service_name",
            "expected 1 to 128 printable characters",
        );
    }
    let sample_ratio = match sample_ratio {
        Some(r) if (0.0..=1.0).contains(&r) => r,
        Some(r) => {
            problems.push("tracing.sample_ratio", format!("{r}: expected 0 to 1"));
            DEFAULT_RATIO
        }
        None => DEFAULT_RATIO,
    };
    let queue = bounded(
        "tracing.queue",
        queue,
        DEFAULT_QUEUE,
        1,
        1_000_000,
        problems,
    );
    let batch = bounded("tracing.batch", batch, DEFAULT_BATCH, 1, 100_000, problems);
    let interval = positive(
        "tracing.export_interval".into(),
        export_interval,
        DEFAULT_INTERVAL,
        problems,
    );
    let timeout = positive(
        "tracing.export_timeout".into(),
        export_timeout,
        DEFAULT_TIMEOUT,
        problems,
    );
    let parent_based = match parent_based {
        None => ParentBased::Trusted,
        Some(ParentBasedFile::Flag(true)) => ParentBased::Always,
        Some(ParentBasedFile::Flag(false)) => ParentBased::Never,
        Some(ParentBasedFile::Named(n)) if n == "trusted" => ParentBased::Trusted,
        Some(ParentBasedFile::Named(n)) => {
            problems.push(
                "tracing.parent_based",
                format!("{n:?}: expected true, false or \"trusted\""),
            );
            ParentBased::Trusted
        }
    };
    let max_sampled_per_second = match max_sampled_per_second {
        Some(0) => None,
        Some(n) => Some(n),
        None => Some(DEFAULT_MAX_SAMPLED_PER_SECOND),
    };
    enabled.unwrap_or(true).then_some(TraceSettings {
        sample_ratio,
        parent_based,
        max_sampled_per_second,
        export: ExportSettings {
            shown_endpoint: redact_url(&endpoint),
            endpoint,
            service_name,
            queue,
            batch,
            interval,
            timeout,
        },
    })
}
