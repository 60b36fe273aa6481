//! Application logs: `tracing-subscriber`, as text or as one JSON object per line
//! (`server.log_format`), on stderr. Pingora's and our `log` records are bridged into it, so
//! every line has the same shape; `RUST_LOG` filters (default `info`). Timestamps are
//! RFC 3339 UTC with milliseconds, formatted by the `time` crate — the same function the
//! access log uses ([`rfc3339_millis`]), so the two logs line up.
//!
//! A failed TLS handshake is the client's doing (a certificate from another CA, none where one
//! is required, plain HTTP on the TLS port, a client that left): Pingora writes an ERROR line
//! for each, so a client could fill the log. They are counted
//! (`turnstile_tls_handshake_failures_total`) and at most one line per [`REFUSALS_LOG_EVERY`]
//! is written ([`RefusalLines`]).

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// How application log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-12-01T05:38:37.123Z  INFO turnstile::server: message` (for people).
    #[default]
    Text,
    /// `{"timestamp":"…","level":"INFO","target":"turnstile::server","message":"…"}` (for
    /// collectors).
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, millisecond precision
/// (`2026-12-01T21:45:07.123Z`).
pub fn rfc3339_millis(unix_ms: u64) -> String {
    const FORMAT: &[time::format_description::FormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".to_owned())
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The subscriber's clock: [`rfc3339_millis`] of now.
struct UtcMillis;

impl FormatTime for UtcMillis {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        w.write_str(&rfc3339_millis(unix_ms()))
    }
}

/// Installs the process's logger (once; later calls change nothing and return `false`).
pub fn init(format: LogFormat) -> bool {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(UtcMillis)
        .with_writer(std::io::stderr);
    let refusals = RefusalLines::default();
    match format {
        LogFormat::Text => builder
            .with_ansi(false)
            .finish()
            .with(refusals)
            .try_init()
            .is_ok(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .finish()
            .with(refusals)
            .try_init()
            .is_ok(),
    }
}

/// Refused TLS handshakes are logged at most this often (all are counted).
pub const REFUSALS_LOG_EVERY: Duration = Duration::from_secs(60);

/// Pingora's line for each failed handshake: counted, and let through at most once per
/// [`REFUSALS_LOG_EVERY`].
#[derive(Default)]
struct RefusalLines {
    last: Mutex<Option<Instant>>,
}

/// What a bridged `log` record says: its target and message.
#[derive(Default)]
struct Record {
    target: String,
    message: String,
}

impl Visit for Record {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.target = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            use fmt::Write;
            let _ = write!(self.message, "{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for RefusalLines {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        // Pingora's records come through the `log` bridge, at ERROR.
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || meta.target() != "log" {
            return true;
        }
        let mut record = Record::default();
        event.record(&mut record);
        if record.target != "pingora_core::services::listening"
            || !record.message.starts_with("Downstream handshake")
        {
            return true;
        }
        let reason = if record.message.contains("timeout") {
            "timeout"
        } else {
            "failed"
        };
        crate::ops::metrics::tls_handshake_failures()
            .with_label_values(&[reason])
            .inc();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < REFUSALS_LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(1_796_161_507_123),
            "2026-12-01T21:45:07.123Z"
        );
        assert_eq!(rfc3339_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_millis(951_782_400_100), "2000-02-29T00:00:00.100Z");
    }
}
