//! Spans leave the process in OTLP/HTTP JSON (`POST /v1/traces`), from a thread of their own:
//! requests hand their finished spans to a bounded queue and never wait; when the queue is
//! full the spans are dropped and counted. The thread sends a batch when it holds `batch`
//! spans or `interval` has passed, and gives up on a call after `timeout` (its spans are
//! counted as dropped; the collector being down never slows requests).

use super::span::{AttrValue, Span};
use prometheus::IntCounter;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// `http://host:port/v1/traces`.
    pub endpoint: String,
    /// The endpoint as logs show it (credentials redacted).
    pub shown_endpoint: String,
    pub service_name: String,
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

fn export_loop(receiver: Receiver<Vec<Span>>, settings: ExportSettings, counters: ExportCounters) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(settings.timeout))
        .http_status_as_error(true)
        .build()
        .into();
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
                let body = encode(&settings.service_name, &batch);
                let sent = agent
                    .post(&settings.endpoint)
                    .header("Content-Type", "application/json")
                    .send(&body[..]);
                match sent {
                    Ok(_) => counters.exported.inc_by(batch.len() as u64),
                    Err(e) => {
                        counters.dropped_export.inc_by(batch.len() as u64);
                        // The error may quote the URL: never its credentials.
                        let e = e
                            .to_string()
                            .replace(&settings.endpoint, &settings.shown_endpoint);
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

/// An OTLP `ExportTraceServiceRequest` in the protocol's JSON mapping (ids in hex, enums as
/// numbers, 64-bit integers as strings), serialized straight from the spans.
pub fn encode(service_name: &str, spans: &[Span]) -> Vec<u8> {
    let version = AttrValue::from(env!("CARGO_PKG_VERSION"));
    let service = AttrValue::from(service_name);
    let request = Request {
        resource_spans: [ResourceSpans {
            resource: Resource {
                attributes: [
                    Attribute {
                        key: "service.name",
                        value: &service,
                    },
                    Attribute {
                        key: "service.version",
                        value: &version,
                    },
                ],
            },
            scope_spans: [ScopeSpans {
                scope: Scope {
                    name: "turnstile",
                    version: env!("CARGO_PKG_VERSION"),
                },
                spans: spans.iter().map(OtlpSpan).collect(),
            }],
        }],
    };
    serde_json::to_vec(&request).expect("spans serialize")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    resource_spans: [ResourceSpans<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans<'a> {
    resource: Resource<'a>,
    scope_spans: [ScopeSpans<'a>; 1],
}

#[derive(Serialize)]
struct Resource<'a> {
    attributes: [Attribute<'a>; 2],
}

#[derive(Serialize)]
struct ScopeSpans<'a> {
    scope: Scope,
    spans: Vec<OtlpSpan<'a>>,
}

#[derive(Serialize)]
struct Scope {
    name: &'static str,
    version: &'static str,
}

struct Attribute<'a> {
    key: &'a str,
    value: &'a AttrValue,
}

impl Serialize for Attribute<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Value<'a>(&'a AttrValue);
        impl Serialize for Value<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(1))?;
                match self.0 {
                    AttrValue::Str(v) => m.serialize_entry("stringValue", &**v)?,
                    AttrValue::Int(i) => m.serialize_entry("intValue", &i.to_string())?,
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("key", self.key)?;
        m.serialize_entry("value", &Value(self.value))?;
        m.end()
    }
}

struct OtlpSpan<'a>(&'a Span);

impl Serialize for OtlpSpan<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Status(bool);
        impl Serialize for Status {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("code", &if self.0 { 2 } else { 0 })?;
                m.end()
            }
        }
        let span = self.0;
        let attributes: Vec<Attribute<'_>> = span
            .attributes
            .iter()
            .map(|(key, value)| Attribute { key, value })
            .collect();
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("traceId", &span.trace_id.to_hex())?;
        m.serialize_entry("spanId", &span.span_id.to_hex())?;
        if let Some(parent) = span.parent {
            m.serialize_entry("parentSpanId", &parent.to_hex())?;
        }
        m.serialize_entry("name", &span.name)?;
        m.serialize_entry("kind", &(span.kind as u8))?;
        m.serialize_entry("startTimeUnixNano", &span.start_unix_ns.to_string())?;
        m.serialize_entry("endTimeUnixNano", &span.end_unix_ns.to_string())?;
        m.serialize_entry("attributes", &attributes)?;
        m.serialize_entry("status", &Status(span.error))?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::trace::context::{new_span_id, new_trace_id};
    use crate::ops::trace::span::SpanKind;

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
    fn spans_are_encoded_in_the_otlp_json_mapping() {
        let s = span();
        let v: serde_json::Value =
            serde_json::from_slice(&encode("gw", std::slice::from_ref(&s))).unwrap();
        let out = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(out["traceId"], s.trace_id.to_hex());
        assert_eq!(out["kind"], 2);
        assert_eq!(out["startTimeUnixNano"], "1");
        assert_eq!(out["attributes"][0]["value"]["intValue"], "200");
        assert!(out.get("parentSpanId").is_none());
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "gw"
        );
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
