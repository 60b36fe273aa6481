//! The response head the client receives, with the gateway's headers added (request id,
//! `RateLimit`, `RateLimit-Policy`, the legacy trio, dry-run and delay notes), edited one of
//! two ways, as `[server] response_header_case` says:
//!
//! - **lower** (the default): Pingora's response header is taken apart into its `http` parts
//!   (a move, no copy of the map), the gateway's headers are inserted by names parsed once
//!   into a map with room reserved for them, and the parts are put back, the upstream's reason
//!   phrase restored. The upstream's spelling of names is not kept: an HTTP/1 client sees them
//!   lower-case (but for the standard names Pingora writes titled: `Content-Type`,
//!   `Content-Length`, `Date`, `Server`, ...), as an HTTP/2 client always does. Values, and
//!   their order per name, are as the upstream sent them.
//! - **preserve**: Pingora's header is edited in place, which keeps each name as the
//!   upstream spelled it (the gateway's own are lower-case either way).
//!
//! The gateway's own answers (problem+json refusals, `proxy/response.rs`) carry no names of
//! the upstream, and are built without a case map either way: the same bytes as with one.

use crate::chain::cors::Cors;
use crate::chain::header_rules::{HeaderRules, RuleHead, Vars};
use crate::upstream::config::HeaderCase;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::{Error, ErrorType, Result};

/// Room for the headers the gateway adds to a response (request id, `RateLimit`,
/// `RateLimit-Policy`, the legacy trio, dry-run and delay notes).
const ADDED: usize = 8;

/// Where the gateway's response headers go.
pub trait ResponseHead {
    /// Sets `name` (parsed once) to `value`, replacing what the upstream said.
    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<()>;
    /// A route's `response_headers` rules, applied to this head.
    fn apply(&mut self, rules: &HeaderRules, vars: &Vars<'_>) -> Result<()>;
    /// A route's `cors` headers: for an allowed `origin`, or (`None`) for any other request.
    fn cors(&mut self, cors: &Cors, origin: Option<&HeaderValue>) -> Result<()>;
}

fn rule_error(e: String) -> Box<Error> {
    Error::explain(ErrorType::InvalidHTTPHeader, e)
}

/// Edits `resp` with `edit`, the way `case` says (see the module's docs).
pub fn edit_response(
    resp: &mut ResponseHeader,
    case: HeaderCase,
    edit: impl FnOnce(&mut dyn ResponseHead) -> Result<()>,
) -> Result<()> {
    if case == HeaderCase::Preserve {
        return edit(&mut PingoraHead(resp));
    }
    // Only a phrase of the upstream's own is kept apart (the standard one is written anyway).
    let reason = resp
        .get_reason_phrase()
        .filter(|r| Some(*r) != resp.status.canonical_reason())
        .map(str::to_owned);
    let mut parts: http::response::Parts =
        std::mem::replace(resp, ResponseHeader::from(placeholder())).into();
    // A map at `http`'s bound already: the insert below says so.
    let _ = parts.headers.try_reserve(ADDED);
    let edited = edit(&mut PartsHead(&mut parts));
    *resp = ResponseHeader::from(parts);
    if reason.is_some() {
        resp.set_reason_phrase(reason.as_deref())?;
    }
    edited
}

/// Parts that stand in for the response while it is edited (allocate nothing).
fn placeholder() -> http::response::Parts {
    http::Response::new(()).into_parts().0
}

/// The head as `http` parts: names inserted as parsed once, lower-case on the wire.
struct PartsHead<'a>(&'a mut http::response::Parts);

impl ResponseHead for PartsHead<'_> {
    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<()> {
        // `try_insert`: a map full past `http`'s bound is an error, not a panic.
        self.0
            .headers
            .try_insert(name.clone(), value)
            .map(drop)
            .map_err(|e| Error::because(ErrorType::InvalidHTTPHeader, "response header", e))
    }

    fn apply(&mut self, rules: &HeaderRules, vars: &Vars<'_>) -> Result<()> {
        rules.apply(vars, self).map_err(rule_error)
    }

    fn cors(&mut self, cors: &Cors, origin: Option<&HeaderValue>) -> Result<()> {
        crate::proxy::cors::on_response(cors, origin, self).map_err(rule_error)
    }
}

impl RuleHead for PartsHead<'_> {
    fn headers(&self) -> &HeaderMap {
        &self.0.headers
    }
    fn replace(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        let headers = &mut self.0.headers;
        headers
            .try_insert(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        let headers = &mut self.0.headers;
        headers
            .try_append(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn remove(&mut self, name: &HeaderName) {
        self.0.headers.remove(name);
    }
}

/// Pingora's response header, edited in place: each name's spelling recorded.
struct PingoraHead<'a>(&'a mut ResponseHeader);

impl ResponseHead for PingoraHead<'_> {
    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<()> {
        // The `&'static str` spelling: recorded without a copy.
        self.0.insert_header(name.as_str(), value).map(drop)
    }

    fn apply(&mut self, rules: &HeaderRules, vars: &Vars<'_>) -> Result<()> {
        rules.apply(vars, self).map_err(rule_error)
    }

    fn cors(&mut self, cors: &Cors, origin: Option<&HeaderValue>) -> Result<()> {
        crate::proxy::cors::on_response(cors, origin, self).map_err(rule_error)
    }
}

impl RuleHead for PingoraHead<'_> {
    fn headers(&self) -> &HeaderMap {
        &self.0.headers
    }
    fn replace(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0
            .insert_header(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
        self.0
            .append_header(name.clone(), value)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn remove(&mut self, name: &HeaderName) {
        self.0.remove_header(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::ResponseHeader;

    static ADDED_NAME: HeaderName = HeaderName::from_static("x-request-id");

    fn upstream_head() -> ResponseHeader {
        let mut resp = ResponseHeader::build(299, None).unwrap();
        resp.set_reason_phrase(Some("Fine Thanks")).unwrap();
        resp.append_header("Content-Type", "text/plain").unwrap();
        resp.append_header("X-Custom-Thing", "a").unwrap();
        resp.append_header("Set-Cookie", "one=1").unwrap();
        resp.append_header("Set-Cookie", "two=2").unwrap();
        resp
    }

    fn wire(resp: &ResponseHeader) -> String {
        let mut buf = Vec::new();
        resp.header_to_h1_wire(&mut buf);
        String::from_utf8(buf).unwrap()
    }

    fn edited(case: HeaderCase) -> ResponseHeader {
        let mut resp = upstream_head();
        edit_response(&mut resp, case, |head| {
            head.set(&ADDED_NAME, HeaderValue::from_static("r-1"))
        })
        .unwrap();
        resp
    }

    #[test]
    fn lower_case_names_the_same_values_and_the_upstreams_reason() {
        let resp = edited(HeaderCase::Lower);
        assert_eq!(resp.get_reason_phrase(), Some("Fine Thanks"));
        assert_eq!(resp.status.as_u16(), 299);
        assert_eq!(
            wire(&resp),
            "Content-Type: text/plain\r\nx-custom-thing: a\r\nSet-Cookie: one=1\r\n\
             Set-Cookie: two=2\r\nx-request-id: r-1\r\n"
        );
    }

    #[test]
    fn preserve_keeps_the_upstreams_spelling() {
        let resp = edited(HeaderCase::Preserve);
        assert_eq!(resp.get_reason_phrase(), Some("Fine Thanks"));
        assert_eq!(
            wire(&resp),
            "Content-Type: text/plain\r\nX-Custom-Thing: a\r\nSet-Cookie: one=1\r\n\
             Set-Cookie: two=2\r\nx-request-id: r-1\r\n"
        );
    }

    #[test]
    fn a_standard_reason_stays_standard() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        edit_response(&mut resp, HeaderCase::Lower, |_| Ok(())).unwrap();
        assert_eq!(resp.get_reason_phrase(), Some("OK"));
    }
}
