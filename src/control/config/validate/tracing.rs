//! `[tracing]`: where spans go (the endpoint, protocol, compression, headers, CA — each from
//! the file, else from the standard `OTEL_EXPORTER_OTLP_*` / `OTEL_SERVICE_NAME` variables,
//! else a default), how many are kept, how they are batched.

use super::checks::*;
use crate::control::config::file::{ParentBasedFile, TracingFile};
use crate::control::config::view::redact_url;
use crate::ops::trace::export::ExportSettings;
use crate::ops::trace::otlp::{Compression, Protocol};
use crate::ops::trace::{ParentBased, TraceSettings};
use crate::secret::Secret;
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
    tracing_config_with_env(file, |name| std::env::var(name).ok(), problems)
}

/// An OTEL variable: the traces-specific one, else the general one (`OTEL_EXPORTER_OTLP_X`),
/// with the name it came from.
fn otel(env: &impl Fn(&str) -> Option<String>, what: &str) -> Option<(String, String)> {
    [
        format!("OTEL_EXPORTER_OTLP_TRACES_{what}"),
        format!("OTEL_EXPORTER_OTLP_{what}"),
    ]
    .into_iter()
    .find_map(|name| env(&name).filter(|v| !v.is_empty()).map(|v| (name, v)))
}

pub(super) fn tracing_config_with_env(
    file: Option<TracingFile>,
    env: impl Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> Option<TraceSettings> {
    let TracingFile {
        enabled,
        endpoint,
        protocol,
        compression,
        headers,
        ca_file,
        service_name,
        sample_ratio,
        parent_based,
        max_sampled_per_second,
        queue,
        batch,
        export_interval,
        export_timeout,
    } = file?;
    let endpoint = endpoint
        .map(|e| ("tracing.endpoint".to_owned(), e))
        .or_else(|| {
            if let Some((name, url)) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .filter(|v| !v.is_empty())
                .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT".to_owned(), v))
            {
                return Some((format!("tracing.endpoint (from {name})"), url));
            }
            // The general endpoint is a base: the traces path is appended (OTLP's rule).
            env("OTEL_EXPORTER_OTLP_ENDPOINT")
                .filter(|v| !v.is_empty())
                .map(|base| {
                    (
                        "tracing.endpoint (from OTEL_EXPORTER_OTLP_ENDPOINT)".to_owned(),
                        format!("{}/v1/traces", base.trim_end_matches('/')),
                    )
                })
        });
    let (endpoint_path, endpoint) = endpoint.unwrap_or_else(|| {
        problems.push(
            "tracing.endpoint",
            "required (or set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT)",
        );
        ("tracing.endpoint".to_owned(), String::new())
    });
    if !endpoint.is_empty() {
        match url::Url::parse(&endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => problems.push(
                endpoint_path,
                format!(
                    "{:?}: expected an OTLP/HTTP URL like \"https://collector:4318/v1/traces\"",
                    redact_url(&endpoint)
                ),
            ),
        }
    }
    let from = |file: Option<String>, what: &str| -> Option<(String, String)> {
        let key = what.to_ascii_lowercase();
        file.map(|v| (format!("tracing.{key}"), v)).or_else(|| {
            otel(&env, what).map(|(name, v)| (format!("tracing.{key} (from {name})"), v))
        })
    };
    let protocol = match from(protocol, "PROTOCOL") {
        None => Protocol::Protobuf,
        Some((_, p)) if p == "http/protobuf" => Protocol::Protobuf,
        Some((_, p)) if p == "http/json" => Protocol::Json,
        Some((path, p)) => {
            problems.push(
                path,
                format!("{p:?}: expected \"http/protobuf\" or \"http/json\" (OTLP over gRPC is not supported)"),
            );
            Protocol::Protobuf
        }
    };
    let compression = match from(compression, "COMPRESSION") {
        None => Compression::None,
        Some((_, c)) if c == "none" => Compression::None,
        Some((_, c)) if c == "gzip" => Compression::Gzip,
        Some((path, c)) => {
            problems.push(path, format!("{c:?}: expected \"gzip\" or \"none\""));
            Compression::None
        }
    };
    let headers = match headers {
        Some(map) => map
            .into_iter()
            .filter_map(|(name, value)| {
                let path = format!("tracing.headers.{name}");
                check_header(&path, &name, problems);
                secret(&path, &value, problems).map(|v| (name, v))
            })
            .collect(),
        None => otel_headers(&env, problems),
    };
    let ca_pem = from(ca_file, "CERTIFICATE").and_then(|(path, file)| {
        std::fs::read(&file)
            .map_err(|e| problems.push(path, format!("cannot read {file}: {}", e.kind())))
            .ok()
    });
    let service_name = service_name
        .or_else(|| env("OTEL_SERVICE_NAME").filter(|v| !v.is_empty()))
        .unwrap_or_else(|| DEFAULT_SERVICE.to_owned());
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
    let env_timeout = otel(&env, "TIMEOUT").and_then(|(name, ms)| match ms.parse::<u64>() {
        Ok(ms) if ms > 0 => Some(Duration::from_millis(ms)),
        _ => {
            problems.push(
                format!("tracing.export_timeout (from {name})"),
                format!("{ms:?}: expected milliseconds, at least 1"),
            );
            None
        }
    });
    let timeout = positive(
        "tracing.export_timeout".into(),
        export_timeout,
        env_timeout.unwrap_or(DEFAULT_TIMEOUT),
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
            protocol,
            compression,
            headers,
            ca_pem,
            queue,
            batch,
            interval,
            timeout,
        },
    })
}

/// A header name a collector can be sent.
fn check_header(path: &str, name: &str, problems: &mut Problems) {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        problems.push(path, "not a header name");
    }
}

/// `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`: `name=value,name2=value2`, values percent-encoded
/// (the W3C baggage format the OTLP specification names). Values are secrets.
fn otel_headers(
    env: &impl Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> Vec<(String, Secret)> {
    let Some((var, text)) = otel(env, "HEADERS") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let path = format!("tracing.headers (from {var})");
        let Some((name, value)) = pair.split_once('=') else {
            // Not echoed: it may be a credential.
            problems.push(path, "expected name=value pairs separated by commas");
            continue;
        };
        let name = name.trim().to_owned();
        check_header(&path, &name, problems);
        let value: String = url::form_urlencoded::parse(format!("v={}", value.trim()).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        out.push((name, Secret::new(value)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::config::file::TracingFile;

    fn table() -> TracingFile {
        TracingFile::default()
    }

    fn settings(file: TracingFile, vars: &[(&str, &str)]) -> (Option<TraceSettings>, Vec<String>) {
        let mut problems = Problems::default();
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let s = tracing_config_with_env(Some(file), env, &mut problems);
        let errors = problems.errors.iter().map(|p| p.to_string()).collect();
        (s, errors)
    }

    #[test]
    fn the_standard_variables_fill_in_what_the_file_leaves_out() {
        let (s, errors) = settings(
            table(),
            &[
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "https://collector.example:4318/",
                ),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-api-key=s%3Dcret, x-team=edge",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_SERVICE_NAME", "edge-gw"),
            ],
        );
        assert!(errors.is_empty(), "{errors:?}");
        let e = s.unwrap().export;
        assert_eq!(e.endpoint, "https://collector.example:4318/v1/traces");
        assert_eq!(e.protocol, Protocol::Json);
        assert_eq!(e.compression, Compression::Gzip);
        assert_eq!(e.timeout, Duration::from_millis(2500));
        assert_eq!(e.service_name, "edge-gw");
        let headers: Vec<(&str, &str)> = e
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose()))
            .collect();
        assert_eq!(headers, [("x-api-key", "s=cret"), ("x-team", "edge")]);
    }

    #[test]
    fn the_file_wins_and_the_traces_variable_beats_the_general_one() {
        let file = TracingFile {
            protocol: Some("http/protobuf".into()),
            ..table()
        };
        let (s, _) = settings(
            file,
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a:4318/custom"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://b:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ],
        );
        let e = s.unwrap().export;
        assert_eq!(e.endpoint, "http://a:4318/custom", "used as it is");
        assert_eq!(e.protocol, Protocol::Protobuf, "the file's");
    }

    #[test]
    fn bad_values_are_problems_named_with_their_variable_and_never_echo_secrets() {
        let (_, errors) = settings(table(), &[]);
        assert!(
            errors[0].starts_with("tracing.endpoint: required"),
            "{errors:?}"
        );
        let (_, errors) = settings(
            table(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "hunter2-without-a-name"),
            ],
        );
        let all = errors.join("\n");
        assert!(
            all.contains("tracing.protocol (from OTEL_EXPORTER_OTLP_PROTOCOL)"),
            "{all}"
        );
        assert!(
            all.contains("tracing.headers (from OTEL_EXPORTER_OTLP_HEADERS)"),
            "{all}"
        );
        assert!(!all.contains("hunter2"), "{all}");
    }
}
