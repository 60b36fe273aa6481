//! One request's trace: started when the request arrives (continuing the client's trace or
//! starting one), timed as it goes through the chain, turned into spans when it ends.
//!
//! ```text
//! <METHOD> <route>      SERVER    the whole request (parent: the client's span, if any)
//! ├─ rate limits        INTERNAL  the limiter decision: decision, limited_by, client
//! │  └─ store check     CLIENT    the store call: store kind, result
//! ├─ shedding gate      INTERNAL  the wait for a place in the upstream pool (when it sheds)
//! └─ upstream           CLIENT    to the upstream's response header: server, status
//! ```
//!
//! Attributes name routes, policies, clients and outcomes from the configuration — never an
//! API key, a keyed limit's key, a query string or a header value.

use super::context::{new_span_id, SpanId, TraceId};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(Arc<str>),
    Int(i64),
}

impl From<&str> for AttrValue {
    fn from(s: &str) -> AttrValue {
        AttrValue::Str(Arc::from(s))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: Option<SpanId>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub attributes: Vec<(&'static str, AttrValue)>,
    pub error: bool,
}

/// A timed step: when it started and ended.
pub type Interval = (Instant, Instant);

/// The trace of the request in flight.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The client's span (`None`: this request starts the trace).
    pub parent: Option<SpanId>,
    pub sampled: bool,
    pub tracestate: Option<http::HeaderValue>,
    pub server_span: SpanId,
    /// The span the upstream's `traceparent` names as its parent.
    pub upstream_span: SpanId,
    started: Instant,
    started_unix_ns: u64,
    /// Filled in as the request goes (only when sampled).
    pub limits: Option<Interval>,
    pub store: Option<Interval>,
    pub store_result: Option<&'static str>,
    pub gate: Option<Interval>,
    pub upstream: Option<(Instant, Option<Instant>)>,
    pub upstream_status: Option<u16>,
}

/// What the finished request says about itself (for the spans' names and attributes).
pub struct Facts<'a> {
    pub method: &'a str,
    pub route: Option<&'a str>,
    pub path: &'a str,
    pub status: u16,
    pub decision: &'static str,
    pub limited_by: Option<&'a str>,
    pub client: Option<&'a str>,
    pub store_kind: &'static str,
    pub upstream_addr: Option<String>,
    pub upstream_pool: Option<&'a str>,
    /// Times the request was sent upstream (more than 1: retried).
    pub upstream_attempts: u32,
}

impl RequestTrace {
    pub fn new(
        trace_id: TraceId,
        parent: Option<SpanId>,
        sampled: bool,
        tracestate: Option<http::HeaderValue>,
    ) -> RequestTrace {
        RequestTrace {
            trace_id,
            parent,
            sampled,
            tracestate,
            server_span: new_span_id(),
            upstream_span: new_span_id(),
            started: Instant::now(),
            // Only a sampled request's spans need wall-clock time.
            started_unix_ns: if sampled {
                unix_ns(SystemTime::now())
            } else {
                0
            },
            limits: None,
            store: None,
            store_result: None,
            gate: None,
            upstream: None,
            upstream_status: None,
        }
    }

    fn at(&self, t: Instant) -> u64 {
        self.started_unix_ns
            .saturating_add(t.saturating_duration_since(self.started).as_nanos() as u64)
    }

    fn span(
        &self,
        span_id: SpanId,
        parent: Option<SpanId>,
        name: impl Into<String>,
        kind: SpanKind,
        (start, end): Interval,
    ) -> Span {
        Span {
            trace_id: self.trace_id,
            span_id,
            parent,
            name: name.into(),
            kind,
            start_unix_ns: self.at(start),
            end_unix_ns: self.at(end),
            attributes: Vec::new(),
            error: false,
        }
    }

    /// The request's spans, now that it is over.
    pub fn finish(&self, facts: &Facts<'_>) -> Vec<Span> {
        let now = Instant::now();
        let mut spans = Vec::with_capacity(5);
        let name = format!("{} {}", facts.method, facts.route.unwrap_or("(no route)"));
        let mut server = self.span(
            self.server_span,
            self.parent,
            name,
            SpanKind::Server,
            (self.started, now),
        );
        server.attributes.extend([
            ("http.request.method", facts.method.into()),
            ("url.path", facts.path.into()),
            (
                "http.response.status_code",
                AttrValue::Int(i64::from(facts.status)),
            ),
            ("turnstile.decision", facts.decision.into()),
        ]);
        if let Some(route) = facts.route {
            server.attributes.push(("http.route", route.into()));
        }
        server.error = facts.status >= 500 || facts.status == 0;
        spans.push(server);
        if let Some(limits) = self.limits {
            let limits_span = new_span_id();
            let mut span = self.span(
                limits_span,
                Some(self.server_span),
                "rate limits",
                SpanKind::Internal,
                limits,
            );
            span.attributes
                .push(("turnstile.decision", facts.decision.into()));
            if let Some(policy) = facts.limited_by {
                span.attributes
                    .push(("turnstile.limited_by", policy.into()));
            }
            if let Some(client) = facts.client {
                span.attributes.push(("turnstile.client", client.into()));
            }
            spans.push(span);
            if let Some(store) = self.store {
                let mut span = self.span(
                    new_span_id(),
                    Some(limits_span),
                    "store check",
                    SpanKind::Client,
                    store,
                );
                let result = self.store_result.unwrap_or("ok");
                span.attributes.extend([
                    ("db.system", facts.store_kind.into()),
                    ("turnstile.store.result", result.into()),
                ]);
                span.error = result != "ok";
                spans.push(span);
            }
        }
        if let Some(gate) = self.gate {
            let mut span = self.span(
                new_span_id(),
                Some(self.server_span),
                "shedding gate",
                SpanKind::Internal,
                gate,
            );
            span.attributes
                .push(("turnstile.decision", facts.decision.into()));
            spans.push(span);
        }
        if let Some((sent, answered)) = self.upstream {
            let mut span = self.span(
                self.upstream_span,
                Some(self.server_span),
                "upstream",
                SpanKind::Client,
                (sent, answered.unwrap_or(now)),
            );
            if let Some(pool) = facts.upstream_pool {
                span.attributes.push(("turnstile.upstream", pool.into()));
            }
            if let Some(addr) = &facts.upstream_addr {
                span.attributes
                    .push(("server.address", addr.as_str().into()));
            }
            if facts.upstream_attempts > 1 {
                span.attributes.push((
                    "turnstile.upstream.attempts",
                    AttrValue::Int(i64::from(facts.upstream_attempts)),
                ));
            }
            match self.upstream_status {
                Some(status) => span.attributes.push((
                    "http.response.status_code",
                    AttrValue::Int(i64::from(status)),
                )),
                None => span.error = true,
            }
            spans.push(span);
        }
        spans
    }
}

pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::trace::context::new_trace_id;

    #[test]
    fn spans_link_up_and_carry_no_request_input_but_the_path() {
        let mut t = RequestTrace::new(new_trace_id(), Some(SpanId([7; 8])), true, None);
        let now = Instant::now();
        t.limits = Some((now, now));
        t.store = Some((now, now));
        t.upstream = Some((now, Some(now)));
        t.upstream_status = Some(200);
        let spans = t.finish(&Facts {
            method: "GET",
            route: Some("orders"),
            path: "/orders/7",
            status: 200,
            decision: "allowed",
            limited_by: None,
            client: Some("ada"),
            store_kind: "redis",
            upstream_addr: Some("127.0.0.1:9001".into()),
            upstream_pool: Some("orders"),
            upstream_attempts: 1,
        });
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["GET orders", "rate limits", "store check", "upstream"]
        );
        assert_eq!(spans[0].parent, Some(SpanId([7; 8])));
        assert_eq!(spans[1].parent, Some(spans[0].span_id));
        assert_eq!(spans[2].parent, Some(spans[1].span_id));
        assert_eq!(spans[3].parent, Some(spans[0].span_id));
        assert_eq!(spans[3].span_id, t.upstream_span);
        assert!(spans.iter().all(|s| s.trace_id == t.trace_id && !s.error));
        assert!(spans.iter().all(|s| s.start_unix_ns <= s.end_unix_ns));
    }
}
