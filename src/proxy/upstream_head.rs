//! The request head the upstream receives, edited one of two ways, as the route's pool says
//! (`header_case`):
//!
//! - **lower** (the default): Pingora's request header is taken apart into its `http` parts
//!   (a move, no copy of the map), the gateway's headers are inserted by names parsed once
//!   (`HeaderName` statics) into a map with room reserved for them, and the parts are put
//!   back. The client's spelling of names is not kept: an HTTP/1 server sees them lower-case
//!   (but for a dozen standard names Pingora writes titled: `Host`, `Content-Length`, ...),
//!   as an HTTP/2 one always does (RFC 9110: names are case-insensitive). Values, and their
//!   order per name, are as received; names that were interleaved (`A`, `B`, `A`) are grouped
//!   (`a`, `a`, `b`), which RFC 9110 allows (only the order within a name is meaningful).
//! - **preserve**: Pingora's header is edited in place, which records each name's spelling
//!   (the client's, and the gateway's own lower-case) and writes names as recorded.
//!
//! A request target the URI does not reproduce (absolute-form, kept verbatim by Pingora) is
//! edited in place as well, so that the upstream's request line is what it was.

use crate::chain::forward::UpstreamHead;
use crate::upstream::config::HeaderCase;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::RequestHeader;

/// Room for the headers the gateway adds to a request (forwarding, request id, client id,
/// claims, trace context, deadline), reserved once instead of grown into.
const ADDED: usize = 12;

/// Edits `req` with `edit`, the way `case` says (see the module's docs).
pub fn edit_head<E>(
    req: &mut RequestHeader,
    case: HeaderCase,
    edit: impl FnOnce(&mut dyn UpstreamHead) -> Result<(), E>,
) -> Result<(), E> {
    if case == HeaderCase::Preserve || !target_from_uri(req) {
        return edit(&mut PingoraHead(req));
    }
    let end_stream = req.send_end_stream();
    let mut parts: http::request::Parts =
        std::mem::replace(req, RequestHeader::from(placeholder())).into();
    // A map at `http`'s bound already: the insert below says so.
    let _ = parts.headers.try_reserve(ADDED);
    let edited = edit(&mut PartsHead(&mut parts));
    *req = RequestHeader::from(parts);
    if let Some(end_stream) = end_stream {
        req.set_send_end_stream(end_stream);
    }
    edited
}

/// Whether the request line written from the URI is the one received (origin-form):
/// otherwise Pingora keeps the target's bytes, which the `http` parts do not carry.
fn target_from_uri(req: &RequestHeader) -> bool {
    let uri = req
        .uri
        .path_and_query()
        .map(|p| p.as_str().as_bytes())
        .or_else(|| req.uri.authority().map(|a| a.as_str().as_bytes()))
        .unwrap_or_default();
    req.raw_path() == uri
}

/// Parts that stand in for the request while it is edited (allocate nothing).
fn placeholder() -> http::request::Parts {
    http::Request::new(()).into_parts().0
}

/// The head as `http` parts: names inserted as parsed once, lower-case on the wire.
struct PartsHead<'a>(&'a mut http::request::Parts);

impl UpstreamHead for PartsHead<'_> {
    fn headers(&self) -> &HeaderMap {
        &self.0.headers
    }

    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<(), String> {
        insert(&mut self.0.headers, name.clone(), value)
    }

    fn set_named(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        insert(&mut self.0.headers, name.clone(), value)
    }

    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0
            .headers
            .try_append(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn remove(&mut self, name: &HeaderName) {
        self.0.headers.remove(name);
    }

    fn query(&self) -> Option<&str> {
        self.0.uri.query()
    }

    fn set_target(&mut self, target: &str) -> Result<(), String> {
        self.0.uri = uri(target)?;
        Ok(())
    }
}

/// `try_insert`: a map full past `http`'s bound is an error, not a panic.
fn insert(map: &mut HeaderMap, name: HeaderName, value: HeaderValue) -> Result<(), String> {
    map.try_insert(name, value)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn uri(target: &str) -> Result<http::Uri, String> {
    http::Uri::try_from(target).map_err(|e| format!("normalised request path: {e}"))
}

/// Pingora's request header, edited in place: each name's spelling recorded.
struct PingoraHead<'a>(&'a mut RequestHeader);

impl UpstreamHead for PingoraHead<'_> {
    fn headers(&self) -> &HeaderMap {
        &self.0.headers
    }

    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<(), String> {
        // The `&'static str` spelling: recorded without a copy.
        self.0
            .insert_header(name.as_str(), value)
            .map_err(|e| e.to_string())
    }

    fn remove(&mut self, name: &HeaderName) {
        self.0.remove_header(name);
    }

    fn set_named(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0
            .insert_header(name.clone(), value)
            .map_err(|e| e.to_string())
    }

    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0
            .append_header(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn query(&self) -> Option<&str> {
        self.0.uri.query()
    }

    fn set_target(&mut self, target: &str) -> Result<(), String> {
        self.0.set_uri(uri(target)?);
        Ok(())
    }
}

/// A route's `request_headers` rules edit the upstream head through this.
pub struct RuleEdit<'a>(pub &'a mut dyn UpstreamHead);

impl crate::chain::header_rules::RuleHead for RuleEdit<'_> {
    fn headers(&self) -> &HeaderMap {
        self.0.headers()
    }
    fn replace(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0.set_named(name, value)
    }
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0.append(name, value)
    }
    fn remove(&mut self, name: &HeaderName) {
        self.0.remove(name);
    }
}
