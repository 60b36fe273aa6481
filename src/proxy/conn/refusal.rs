//! Pingora's own refusals, with our problem+json body. Pingora answers some requests itself
//! before any hook runs (an unparseable head, two `Host` headers, an absolute-form target
//! naming another host, `CONNECT`): an empty error response. A response written while the
//! connection's header deadline is armed can only be one of those (every response of ours is
//! written after the proxy disarmed it), so the guard writes the same status with a
//! problem+json body instead.

use crate::chain::problem::{render, Kind, CONTENT_TYPE};

/// Our response for a complete, bodiless error response head that Pingora wrote itself
/// (`HTTP/1.x 4xx/5xx … Content-Length: 0`): the same status, with a problem+json body, and
/// the connection closed. `None` for anything else, which is then written as it is.
pub fn replace_bodiless_error(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_prefix("HTTP/1.")?;
    if !text.ends_with("\r\n\r\n") {
        return None;
    }
    let status: u16 = rest.get(2..5)?.parse().ok()?;
    if !(400..600).contains(&status) {
        return None;
    }
    let bodiless = text.split("\r\n").any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("content-length") && value.trim() == "0"
        })
    });
    if !bodiless {
        return None;
    }
    let kind = Kind::from_status(status);
    let detail = match status {
        400 => "the request could not be parsed: a malformed request line or header, more than one Host header, or a target whose host differs from Host",
        405 => "this method is not supported by the gateway",
        _ => kind.title(),
    };
    Some(problem_response(status, detail))
}

/// A whole response: `status` with a problem+json body saying `detail`, and the connection
/// closed.
pub fn problem_response(status: u16, detail: &str) -> Vec<u8> {
    let kind = Kind::from_status(status);
    let body = render(kind, detail, None);
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        CONTENT_TYPE,
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingoras_empty_error_responses_become_problems() {
        let canned = b"HTTP/1.1 400 Bad Request\r\nServer: Pingora\r\nDate: x\r\nContent-Length: 0\r\nCache-Control: private, no-store\r\n\r\n";
        let out = String::from_utf8(replace_bodiless_error(canned).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(head.contains("Content-Type: application/problem+json"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(head.contains("Connection: close"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["status"], 400);
        let ours_too = b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n";
        assert!(replace_bodiless_error(ours_too).is_some());
        for other in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n",
            b"garbage",
        ] {
            assert_eq!(replace_bodiless_error(other), None);
        }
    }
}
