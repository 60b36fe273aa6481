//! gRPC-native answers. A gRPC library reads only `grpc-status`: an HTTP 429 with a JSON body
//! reaches the application as UNAVAILABLE ("unexpected HTTP status") with no retry hint, and
//! a gRPC-Web library may take the body for a reply. So every answer the gateway gives itself
//! to a gRPC or gRPC-Web request is a gRPC response — HTTP 200, the call's gRPC content type,
//! and the status in a "trailers-only" response (no body; one HEADERS frame ending the stream
//! on HTTP/2) — with the code that says what happened. And the client's `grpc-timeout` is
//! the request's deadline.

use crate::chain::problem::Kind;
use std::time::Duration;

/// How a gRPC call is carried: gRPC over HTTP/2, or gRPC-Web (`-text`: base64 bodies), which
/// browsers and HTTP/1 clients speak. A trailers-only answer is the same in all three — HTTP
/// 200, the status in the header, no body — only its content type differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Grpc,
    Web,
    WebText,
}

impl Flavor {
    /// The content type of the gateway's own answer.
    pub fn content_type(self) -> &'static str {
        match self {
            Flavor::Grpc => "application/grpc",
            Flavor::Web => "application/grpc-web",
            Flavor::WebText => "application/grpc-web-text",
        }
    }
}

/// The request is a gRPC call: `application/grpc`, `application/grpc-web` or
/// `application/grpc-web-text`, each optionally `+<codec>` and with parameters.
pub fn flavor(content_type: Option<&[u8]>) -> Option<Flavor> {
    let value = content_type?;
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii();
    let essence = match essence.iter().position(|&b| b == b'+') {
        Some(plus) => &essence[..plus],
        None => essence,
    };
    [
        (b"application/grpc".as_slice(), Flavor::Grpc),
        (b"application/grpc-web", Flavor::Web),
        (b"application/grpc-web-text", Flavor::WebText),
    ]
    .into_iter()
    .find(|(name, _)| essence.eq_ignore_ascii_case(name))
    .map(|(_, flavor)| flavor)
}

/// gRPC status codes (`grpc/doc/statuscodes.md`) the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
    Unknown = 2,
}

impl Code {
    /// The code's name in the gRPC documentation.
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Unknown => "UNKNOWN",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "3",
            Code::DeadlineExceeded => "4",
            Code::PermissionDenied => "7",
            Code::ResourceExhausted => "8",
            Code::Unimplemented => "12",
            Code::Internal => "13",
            Code::Unavailable => "14",
            Code::Unauthenticated => "16",
            Code::Unknown => "2",
        }
    }
}

/// The gRPC status of the gateway's own answer of `kind`: a limit → RESOURCE_EXHAUSTED (the
/// client may retry after the hint); the limiter, the identity provider, shedding or the
/// upstream unavailable → UNAVAILABLE (retryable by gRPC's own retry policy); a timeout →
/// DEADLINE_EXCEEDED; no credential or a refused one → UNAUTHENTICATED; an address not let
/// in → PERMISSION_DENIED; no route or method
/// → UNIMPLEMENTED (as gRPC's HTTP mapping reads a 404); a request the gateway refuses to
/// read (framing, size, key parts) → INVALID_ARGUMENT, except a message too large,
/// RESOURCE_EXHAUSTED as gRPC's own servers answer it.
pub fn code(kind: Kind) -> Code {
    match kind {
        Kind::QuotaExceeded | Kind::PayloadTooLarge => Code::ResourceExhausted,
        Kind::LimiterUnavailable
        | Kind::IdentityUnavailable
        | Kind::Overloaded
        | Kind::NoHealthyUpstream
        | Kind::UpstreamUnavailable => Code::Unavailable,
        Kind::UpstreamTimeout => Code::DeadlineExceeded,
        Kind::Unauthorized => Code::Unauthenticated,
        Kind::Forbidden => Code::PermissionDenied,
        Kind::RouteNotFound | Kind::MethodNotAllowed => Code::Unimplemented,
        Kind::BadRequest | Kind::UriTooLong | Kind::HeadersTooLarge => Code::InvalidArgument,
        Kind::Internal => Code::Internal,
        Kind::Other(status) => match status {
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Unknown,
        },
    }
}

/// `grpc-message`: the text percent-encoded as the protocol asks (every byte outside
/// printable ASCII, and `%`), bounded to `MAX_MESSAGE` bytes of text.
pub fn message(text: &str) -> String {
    const MAX_MESSAGE: usize = 512;
    let mut out = String::with_capacity(text.len().min(MAX_MESSAGE));
    let mut end = text.len().min(MAX_MESSAGE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for &b in &text.as_bytes()[..end] {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The longest deadline a `grpc-timeout` may set: the gateway's own timeouts bound the
/// request anyway, this only keeps the arithmetic sane.
const MAX_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `grpc-timeout`: at most 8 digits and a unit (`H` hours, `M` minutes, `S` seconds, `m`
/// milliseconds, `u` microseconds, `n` nanoseconds). `Err` for anything else: a malformed
/// deadline is refused (INVALID_ARGUMENT), not silently ignored.
pub fn timeout(value: &[u8]) -> Result<Duration, &'static str> {
    const BAD: &str = "grpc-timeout is not 1 to 8 digits and a unit (H, M, S, m, u, n)";
    let (&unit, digits) = value.split_last().ok_or(BAD)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BAD);
    }
    let n: u64 = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or(BAD)?;
    let d = match unit {
        b'H' => Duration::from_secs(n.saturating_mul(3600)),
        b'M' => Duration::from_secs(n.saturating_mul(60)),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(BAD),
    };
    Ok(d.min(MAX_TIMEOUT))
}

/// `grpc-timeout` for what is left of a deadline: milliseconds (rounded up, at least 1) while
/// they fit the 8 digits, else seconds, else hours.
pub fn timeout_value(left: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let ms = left.as_nanos().div_ceil(1_000_000).max(1);
    if ms <= MAX {
        return format!("{ms}m");
    }
    let secs = u128::from(left.as_secs());
    if secs <= MAX {
        return format!("{secs}S");
    }
    format!("{}H", (secs / 3600).min(MAX))
}

/// `grpc-retry-pushback-ms` (gRFC A6): how long a client's retry policy waits before trying
/// again, from the `Retry-After` seconds of the equivalent HTTP answer.
pub fn pushback_ms(retry_after_secs: u64) -> u64 {
    retry_after_secs.saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_and_grpc_web_content_types_are_recognised() {
        for (value, want) in [
            ("application/grpc", Flavor::Grpc),
            ("application/grpc+proto", Flavor::Grpc),
            ("Application/GRPC+json", Flavor::Grpc),
            ("application/grpc; charset=utf-8", Flavor::Grpc),
            ("application/grpc-web", Flavor::Web),
            ("application/grpc-web+proto", Flavor::Web),
            ("application/GRPC-WEB+proto ; x=y", Flavor::Web),
            ("application/grpc-web-text", Flavor::WebText),
            ("application/grpc-web-text+proto", Flavor::WebText),
        ] {
            assert_eq!(flavor(Some(value.as_bytes())), Some(want), "{value}");
        }
        for no in [
            "application/grpcx",
            "application/grpc-webx",
            "application/grpc-web-textual",
            "application/json",
            "text/plain+application/grpc",
            "",
        ] {
            assert_eq!(flavor(Some(no.as_bytes())), None, "{no}");
        }
        assert_eq!(flavor(None), None);
    }

    #[test]
    fn the_gateways_answers_map_to_the_codes_a_client_acts_on() {
        assert_eq!(code(Kind::QuotaExceeded), Code::ResourceExhausted);
        assert_eq!(code(Kind::LimiterUnavailable), Code::Unavailable);
        assert_eq!(code(Kind::Overloaded), Code::Unavailable);
        assert_eq!(code(Kind::Unauthorized), Code::Unauthenticated);
        assert_eq!(code(Kind::RouteNotFound), Code::Unimplemented);
        assert_eq!(code(Kind::UpstreamUnavailable), Code::Unavailable);
        assert_eq!(code(Kind::UpstreamTimeout), Code::DeadlineExceeded);
        assert_eq!(code(Kind::Other(418)), Code::Unknown);
        assert_eq!(Code::ResourceExhausted.as_str(), "8");
        assert_eq!(Code::Unauthenticated.as_str(), "16");
    }

    /// docs/problems.md's gRPC table names the code of every kind the gateway answers with.
    #[test]
    fn the_docs_table_names_every_code_used() {
        let docs = include_str!("../../docs/problems.md");
        for kind in Kind::NAMED {
            let code = code(kind);
            let cell = format!("| {} `{}` |", code.as_str(), code.name());
            let row = docs
                .lines()
                .find(|l| l.contains(kind.slug()) && l.ends_with(&cell));
            assert!(row.is_some(), "docs/problems.md: {} → {cell}", kind.slug());
        }
    }

    #[test]
    fn messages_are_percent_encoded_and_bounded() {
        assert_eq!(message("limit \"a\" 100%"), "limit \"a\" 100%25");
        assert_eq!(message("café\n"), "caf%C3%A9%0A");
        let long = "é".repeat(1000);
        let encoded = message(&long);
        assert!(encoded.len() <= 512 * 3);
        assert!(encoded.ends_with("%C3%A9"), "cut on a character boundary");
    }

    #[test]
    fn grpc_timeouts_parse_and_garbage_is_refused() {
        assert_eq!(timeout(b"100m"), Ok(Duration::from_millis(100)));
        assert_eq!(timeout(b"2S"), Ok(Duration::from_secs(2)));
        assert_eq!(timeout(b"1H"), Ok(Duration::from_secs(3600)));
        assert_eq!(timeout(b"5u"), Ok(Duration::from_micros(5)));
        assert_eq!(timeout(b"99999999H"), Ok(MAX_TIMEOUT));
        assert_eq!(timeout_value(Duration::from_micros(1500)), "2m");
        assert_eq!(timeout_value(Duration::ZERO), "1m");
        assert_eq!(timeout_value(Duration::from_secs(200_000)), "200000S");
        assert!(timeout(timeout_value(MAX_TIMEOUT).as_bytes()).is_ok());
        for bad in [
            &b""[..],
            b"m",
            b"10",
            b"123456789m",
            b"1x",
            b"-1S",
            b"1.5S",
            b" 1S",
        ] {
            assert!(timeout(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
