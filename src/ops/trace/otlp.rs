//! Spans as an OTLP `ExportTraceServiceRequest` (the `opentelemetry-proto` types), encoded
//! as protobuf (`http/protobuf`, OTLP's default) or in the protocol's JSON mapping
//! (`http/json`: ids in hex, enums as numbers, 64-bit integers as strings), optionally gzipped.
//! Pure: spans in, bytes out.

use super::span::{AttrValue, Span};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{status, ResourceSpans, ScopeSpans, Status};
use prost::Message;
use std::io::Write;

/// How a batch travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `application/x-protobuf`.
    Protobuf,
    /// `application/json`.
    Json,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Protobuf => "http/protobuf",
            Protocol::Json => "http/json",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Protocol::Protobuf => "application/x-protobuf",
            Protocol::Json => "application/json",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
        }
    }
}

/// The export request for `spans` of the service `service_name`.
pub fn request(service_name: &str, spans: &[Span]) -> ExportTraceServiceRequest {
    let version = env!("CARGO_PKG_VERSION");
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    attribute("service.name", &AttrValue::from(service_name)),
                    attribute("service.version", &AttrValue::from(version)),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "turnstile".into(),
                    version: version.into(),
                    ..Default::default()
                }),
                spans: spans.iter().map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn span(s: &Span) -> opentelemetry_proto::tonic::trace::v1::Span {
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        parent_span_id: s.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
        name: s.name.clone(),
        kind: s.kind as i32,
        start_time_unix_nano: s.start_unix_ns,
        end_time_unix_nano: s.end_unix_ns,
        attributes: s.attributes.iter().map(|(k, v)| attribute(k, v)).collect(),
        status: Some(Status {
            code: if s.error {
                status::StatusCode::Error as i32
            } else {
                status::StatusCode::Unset as i32
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn attribute(key: &str, value: &AttrValue) -> KeyValue {
    let value = match value {
        AttrValue::Str(s) => any_value::Value::StringValue(s.to_string()),
        AttrValue::Int(i) => any_value::Value::IntValue(*i),
    };
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The request's bytes as `protocol`, compressed as asked.
pub fn encode(
    request: &ExportTraceServiceRequest,
    protocol: Protocol,
    compression: Compression,
) -> Vec<u8> {
    let body = match protocol {
        Protocol::Protobuf => request.encode_to_vec(),
        Protocol::Json => serde_json::to_vec(request).expect("spans serialize"),
    };
    match compression {
        Compression::None => body,
        Compression::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 2),
                flate2::Compression::fast(),
            );
            gz.write_all(&body).expect("writing to memory");
            gz.finish().expect("writing to memory")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::trace::context::{new_span_id, new_trace_id};
    use crate::ops::trace::span::SpanKind;
    use std::io::Read;

    fn sample() -> Span {
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
        let s = sample();
        let req = request("gw", std::slice::from_ref(&s));
        let bytes = encode(&req, Protocol::Json, Compression::None);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let out = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(out["traceId"], s.trace_id.to_hex());
        assert_eq!(out["kind"], 2);
        assert_eq!(out["startTimeUnixNano"], "1");
        assert_eq!(out["attributes"][0]["value"]["intValue"], "200");
        assert_eq!(out["parentSpanId"], "", "a root span has none");
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "gw"
        );
    }

    #[test]
    fn protobuf_and_gzip_decode_back_to_the_same_request() {
        let req = request("gw", &[sample(), sample()]);
        let bytes = encode(&req, Protocol::Protobuf, Compression::Gzip);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(ExportTraceServiceRequest::decode(&plain[..]).unwrap(), req);
    }
}
