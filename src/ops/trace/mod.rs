//! OpenTelemetry tracing (`[tracing]`, off by default): each request continues the client's
//! W3C trace (`traceparent`, `tracestate`) or starts one, the upstream receives the context
//! (its parent is the gateway's `upstream` span), and sampled requests' spans — the request,
//! the limiter decision, the store call, the shedding gate, the upstream call — are exported
//! over OTLP/HTTP by a background thread through a bounded queue that drops rather than
//! waits.
//!
//! Off, it costs a branch per request (no context is parsed, no id made, the client's
//! `traceparent` passes through untouched). On, an unsampled request costs the parse and two
//! ids; a sampled one also its spans ([`span`]) and their export ([`export`]).

mod budget;
pub mod context;
pub mod export;
pub mod otlp;
pub mod span;

use self::context::{acceptable_tracestate, new_trace_id, parse_traceparent, sampled};
use self::export::{ExportCounters, ExportSettings, Exporter};
use self::span::{RequestTrace, Span};
use crate::clock::Clock;
use http::HeaderMap;

#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// Share of new traces sampled (0 to 1).
    pub sample_ratio: f64,
    /// Whose sampling decision (a `traceparent`'s flag) is followed.
    pub parent_based: ParentBased,
    /// Most traces sampled per second by this instance (`None`: no bound): a client cannot
    /// make the gateway record, and the collector receive, more than this.
    pub max_sampled_per_second: Option<u32>,
    pub export: ExportSettings,
}

/// Whose `traceparent` sampling flag a request's trace follows; the others are sampled by
/// `sample_ratio`, their trace continued all the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentBased {
    Never,
    /// Only from peers in `server.trusted_proxies` (the default): a client on the internet
    /// cannot force sampling.
    Trusted,
    Always,
}

impl ParentBased {
    pub fn as_str(self) -> &'static str {
        match self {
            ParentBased::Never => "false",
            ParentBased::Trusted => "trusted",
            ParentBased::Always => "true",
        }
    }
}

pub struct Tracer {
    settings: TraceSettings,
    exporter: Exporter,
    budget: budget::SampleBudget,
}

impl Tracer {
    /// Starts the export thread.
    pub fn start(settings: TraceSettings, counters: ExportCounters) -> Tracer {
        Tracer {
            exporter: Exporter::start(settings.export.clone(), counters),
            budget: budget::SampleBudget::new(settings.max_sampled_per_second),
            settings,
        }
    }

    /// A request arrived with `headers` from a peer (`trusted_peer`: in
    /// `server.trusted_proxies`): its trace, sampled within the per-second budget.
    pub fn begin(&self, headers: &HeaderMap, trusted_peer: bool) -> RequestTrace {
        let mut trace = begin(&self.settings, headers, trusted_peer);
        if trace.sampled && !self.budget.take(crate::clock::MonotonicClock.now_ms()) {
            trace.sampled = false;
        }
        trace
    }

    /// A sampled request ended: queue its spans.
    pub fn submit(&self, spans: Vec<Span>) {
        self.exporter.submit(spans);
    }
}

/// The trace of a request with `headers`: the client's, when it sent exactly one valid
/// `traceparent` (with its `tracestate`, if acceptable), else a new one. Its flag decides
/// sampling as `parent_based` says (`trusted_peer`: the TCP peer is a trusted proxy).
pub fn begin(settings: &TraceSettings, headers: &HeaderMap, trusted_peer: bool) -> RequestTrace {
    let mut values = headers.get_all(context::TRACEPARENT).iter();
    let parent = match (values.next(), values.next()) {
        (Some(value), None) => parse_traceparent(value.as_bytes()),
        _ => None,
    };
    match parent {
        Some(p) => {
            let mut states = headers.get_all(context::TRACESTATE).iter();
            let tracestate = match (states.next(), states.next()) {
                (Some(v), None) if acceptable_tracestate(v.as_bytes()) => Some(v.clone()),
                _ => None,
            };
            let follow = match settings.parent_based {
                ParentBased::Always => true,
                ParentBased::Trusted => trusted_peer,
                ParentBased::Never => false,
            };
            let keep = if follow {
                p.sampled
            } else if trusted_peer {
                // By the trace id, as every service of the trace would decide.
                sampled(p.trace_id, settings.sample_ratio)
            } else {
                // Not by an id the client chose (a low one would always be sampled).
                sampled(new_trace_id(), settings.sample_ratio)
            };
            RequestTrace::new(p.trace_id, Some(p.span_id), keep, tracestate)
        }
        None => {
            let id = new_trace_id();
            RequestTrace::new(id, None, sampled(id, settings.sample_ratio), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings(ratio: f64, parent_based: bool) -> TraceSettings {
        TraceSettings {
            sample_ratio: ratio,
            parent_based: if parent_based {
                ParentBased::Always
            } else {
                ParentBased::Never
            },
            max_sampled_per_second: None,
            export: ExportSettings {
                endpoint: "http://127.0.0.1:4318/v1/traces".into(),
                shown_endpoint: "http://127.0.0.1:4318/v1/traces".into(),
                protocol: otlp::Protocol::Protobuf,
                compression: otlp::Compression::None,
                headers: Vec::new(),
                ca_pem: None,
                service_name: "t".into(),
                queue: 1,
                batch: 1,
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
            },
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_clients_context_is_continued_and_its_sampling_followed() {
        let t = begin(
            &settings(0.0, true),
            &headers(&[("traceparent", PARENT), ("tracestate", "rojo=1")]),
            false,
        );
        assert_eq!(t.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent.unwrap().to_hex(), "00f067aa0ba902b7");
        assert!(t.sampled, "the parent said sampled");
        assert_eq!(t.tracestate.unwrap(), "rojo=1");
        // Not parent-based: the ratio decides.
        assert!(
            !begin(
                &settings(0.0, false),
                &headers(&[("traceparent", PARENT)]),
                true
            )
            .sampled
        );
    }

    #[test]
    fn two_traceparents_or_a_bad_one_start_a_new_trace() {
        let two = headers(&[("traceparent", PARENT), ("traceparent", PARENT)]);
        let t = begin(&settings(1.0, true), &two, true);
        assert_eq!(t.parent, None);
        assert_ne!(t.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let bad = headers(&[("traceparent", "garbage"), ("tracestate", "a=b")]);
        let t = begin(&settings(1.0, true), &bad, true);
        assert_eq!((t.parent, t.tracestate), (None, None));
        assert!(t.sampled);
    }

    #[test]
    fn by_default_only_a_trusted_peer_decides_sampling() {
        let trusted = TraceSettings {
            parent_based: ParentBased::Trusted,
            ..settings(0.0, true)
        };
        let flagged = headers(&[("traceparent", PARENT)]);
        assert!(begin(&trusted, &flagged, true).sampled);
        let t = begin(&trusted, &flagged, false);
        assert!(!t.sampled, "an untrusted client's flag is not followed");
        assert_eq!(
            t.trace_id.to_hex(),
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "its trace is still continued"
        );
    }
}
