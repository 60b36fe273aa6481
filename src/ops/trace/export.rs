//! Spans leave the process over OTLP/HTTP (`POST /v1/traces`, protobuf or JSON, optionally
//! gzipped, over http or https, with the headers a collector asks for), from a thread of
//! their own: requests hand their finished spans to a bounded queue and never wait; when the
//! queue is full the spans are dropped and counted. The thread sends a batch when it holds
//! `batch` spans or `interval` has passed, and gives up on a call after `timeout` (its spans
//! are counted as dropped; the collector being down never slows requests).

use super::otlp::{self, Compression, Protocol};
use super::span::Span;
use crate::secret::Secret;
use prometheus::IntCounter;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// `http(s)://host:port/v1/traces`.
    pub endpoint: String,
    /// The endpoint as logs show it (credentials redacted).
    pub shown_endpoint: String,
    pub service_name: String,
    pub protocol: Protocol,
    pub compression: Compression,
    /// Sent with every call (an API key a hosted collector wants): name, value.
    pub headers: Vec<(String, Secret)>,
    /// The CA certificates (PEM) an https collector is verified against; `None`: Mozilla's
    /// roots (webpki-roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Most requests' spans waiting to be sent.
    pub queue: usize,
    /// Most spans per call.
    pub batch: usize,
    pub interval: Duration,
    pub timeout: Duration,
}

/// Counters of what happened to spans.
#[derive(Clone)]
pub struct ExportCounters {
    pub exported: IntCounter,
    /// The queue was full.
    pub dropped_queue: IntCounter,
    /// The collector did not take them (unreachable, slow, error status).
    pub dropped_export: IntCounter,
}

pub struct Exporter {
    sender: SyncSender<Vec<Span>>,
    counters: ExportCounters,
}

impl Exporter {
    pub fn start(settings: ExportSettings, counters: ExportCounters) -> Exporter {
        let (sender, receiver) = sync_channel(settings.queue.max(1));
        let thread_counters = counters.clone();
        std::thread::Builder::new()
            .name("trace-export".into())
            .spawn(move || export_loop(receiver, settings, thread_counters))
            .expect("spawn the trace exporter");
        Exporter { sender, counters }
    }

    /// Queues one request's spans; drops (and counts) them when the queue is full.
    pub fn submit(&self, spans: Vec<Span>) {
        let n = spans.len() as u64;
        match self.sender.try_send(spans) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped_queue.inc_by(n)
            }
        }
    }
}

/// The HTTP client of the export thread: the call timeout, error statuses as errors, and
/// for https the configured CA (or Mozilla's roots).
fn agent(settings: &ExportSettings) -> ureq::Agent {
    crate::outbound::agent(settings.timeout, settings.ca_pem.as_deref())
}

/// One call with one batch.
fn send(agent: &ureq::Agent, settings: &ExportSettings, spans: &[Span]) -> Result<(), String> {
    let request = otlp::request(&settings.service_name, spans);
    let body = otlp::encode(&request, settings.protocol, settings.compression);
    let mut call = agent
        .post(&settings.endpoint)
        .header("Content-Type", settings.protocol.content_type());
    if settings.compression == Compression::Gzip {
        call = call.header("Content-Encoding", "gzip");
    }
    for (name, value) in &settings.headers {
        call = call.header(name, value.expose());
    }
    call.send(&body[..]).map(|_| ()).map_err(|e| {
        // The error may quote the URL: never its credentials, nor a header's value.
        let mut text = e
            .to_string()
            .replace(&settings.endpoint, &settings.shown_endpoint);
        for (_, value) in &settings.headers {
            text = text.replace(value.expose(), "***");
        }
        text
    })
}

fn export_loop(receiver: Receiver<Vec<Span>>, settings: ExportSettings, counters: ExportCounters) {
    let agent = agent(&settings);
    let mut pending: Vec<Span> = Vec::new();
    let mut due = Instant::now() + settings.interval;
    let mut last_error_log: Option<Instant> = None;
    loop {
        let wait = due.saturating_duration_since(Instant::now());
        let closed = match receiver.recv_timeout(wait) {
            Ok(spans) => {
                pending.extend(spans);
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let full = pending.len() >= settings.batch;
        if full || Instant::now() >= due || closed {
            while !pending.is_empty() {
                let take = pending.len().min(settings.batch.max(1));
                let batch: Vec<Span> = pending.drain(..take).collect();
                match send(&agent, &settings, &batch) {
                    Ok(()) => counters.exported.inc_by(batch.len() as u64),
                    Err(e) => {
                        counters.dropped_export.inc_by(batch.len() as u64);
                        let quiet =
                            last_error_log.is_some_and(|t| t.elapsed() < Duration::from_secs(10));
                        if !quiet {
                            log::warn!(
                                "exporting {} spans to {} failed: {e} (counted in turnstile_trace_spans_total{{result=\"dropped_export\"}}; logged at most every 10 s)",
                                batch.len(),
                                settings.shown_endpoint
                            );
                            last_error_log = Some(Instant::now());
                        }
                    }
                }
                if pending.len() < settings.batch {
                    break;
                }
            }
            due = Instant::now() + settings.interval;
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::trace::context::{new_span_id, new_trace_id};
    use crate::ops::trace::span::{AttrValue, SpanKind};

    fn span() -> Span {
        Span {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            parent: None,
            name: "GET orders".into(),
            kind: SpanKind::Server,
            start_unix_ns: 1,
            end_unix_ns: 2,
            attributes: vec![("http.response.status_code", AttrValue::Int(200))],
            error: false,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let counter = || IntCounter::new("x", "x").unwrap();
        let counters = ExportCounters {
            exported: counter(),
            dropped_queue: counter(),
            dropped_export: counter(),
        };
        // No thread: nothing takes from the queue of one.
        let (sender, _receiver) = sync_channel(1);
        let exporter = Exporter {
            sender,
            counters: counters.clone(),
        };
        exporter.submit(vec![span(), span()]);
        exporter.submit(vec![span(), span(), span()]);
        assert_eq!(counters.dropped_queue.get(), 3);
    }
}
