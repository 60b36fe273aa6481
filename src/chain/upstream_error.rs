//! Upstream failures as problems: what Pingora reports while connecting to or proxying from
//! an upstream, mapped to the status and detail the client gets (502 unreachable, 504
//! timeout, or nothing when the client itself is gone).

use crate::chain::problem::Kind;
use crate::upstream::outlier::Attempt;
use pingora::{Error, ErrorSource, ErrorType};

/// Error type used when every server of a route's pool is unhealthy.
pub const NO_HEALTHY_UPSTREAM: ErrorType = ErrorType::Custom("no healthy upstream");

/// Maps a proxying error to the problem reported to the client; `None` when the downstream
/// connection is dead and nothing can be written.
pub fn classify(e: &Error) -> Option<Kind> {
    use ErrorType::*;
    let etype = e.etype();
    if *etype == NO_HEALTHY_UPSTREAM {
        return Some(Kind::NoHealthyUpstream);
    }
    if let HTTPStatus(code) = etype {
        return Some(Kind::from_status(*code));
    }
    match e.esource() {
        ErrorSource::Upstream => Some(match etype {
            ConnectTimedout | ReadTimedout | WriteTimedout | TLSHandshakeTimedout => {
                Kind::UpstreamTimeout
            }
            _ => Kind::UpstreamUnavailable,
        }),
        ErrorSource::Downstream => match etype {
            ReadError | WriteError | ConnectionClosed => None,
            ReadTimedout | WriteTimedout => None,
            _ => Some(Kind::BadRequest),
        },
        ErrorSource::Internal | ErrorSource::Unset => Some(match etype {
            ConnectTimedout => Kind::UpstreamTimeout,
            ConnectRefused | ConnectNoRoute | ConnectError | SocketError => {
                Kind::UpstreamUnavailable
            }
            _ => Kind::Internal,
        }),
    }
}

/// How a failed attempt at a server counts for passive outlier detection: `connecting`
/// errors are reported by `fail_to_connect` (a refused or timed-out connect, a failed TLS
/// handshake); the others by `fail_to_proxy`, where connect errors were already counted and
/// only the upstream's own failures (a timeout, a reset, garbage) count. `None`: not the
/// server's doing (the client left, no server was tried).
pub fn attempt(e: &Error, connecting: bool) -> Option<Attempt> {
    use ErrorType::*;
    let connect_error = matches!(
        e.etype(),
        ConnectTimedout
            | ConnectRefused
            | ConnectNoRoute
            | ConnectError
            | ConnectProxyFailure
            | TLSHandshakeFailure
            | TLSHandshakeTimedout
            | InvalidCert
    );
    if connecting {
        return Some(match e.etype() {
            ConnectTimedout | TLSHandshakeTimedout => Attempt::Timeout,
            _ => Attempt::Connect,
        });
    }
    if connect_error || *e.esource() != ErrorSource::Upstream {
        return None;
    }
    Some(match e.etype() {
        ReadTimedout | WriteTimedout => Attempt::Timeout,
        _ => Attempt::Reset,
    })
}

/// The problem's detail for an error of `kind` while proxying to the pool `upstream`.
pub fn describe(kind: Kind, e: &Error, upstream: &str) -> String {
    match kind {
        Kind::NoHealthyUpstream => format!("no healthy server in upstream {upstream:?}"),
        Kind::UpstreamTimeout => format!("upstream {upstream:?} did not answer in time"),
        Kind::UpstreamUnavailable => format!(
            "upstream {upstream:?} could not be reached or failed ({})",
            e.etype().as_str()
        ),
        Kind::BadRequest => "the request could not be parsed".to_owned(),
        _ => kind.title().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_errors_map_to_502_and_504() {
        let timeout = Error::new(ErrorType::ReadTimedout).into_up();
        assert_eq!(classify(&timeout), Some(Kind::UpstreamTimeout));
        let connect = Error::new(ErrorType::ConnectTimedout).into_up();
        assert_eq!(classify(&connect), Some(Kind::UpstreamTimeout));
        let refused = Error::new(ErrorType::ConnectRefused).into_up();
        assert_eq!(classify(&refused), Some(Kind::UpstreamUnavailable));
        let closed = Error::new(ErrorType::ConnectionClosed).into_up();
        assert_eq!(classify(&closed), Some(Kind::UpstreamUnavailable));
        let none = Error::explain(NO_HEALTHY_UPSTREAM, "x");
        assert_eq!(classify(&none), Some(Kind::NoHealthyUpstream));
    }

    #[test]
    fn failed_attempts_count_once_and_only_the_servers_own() {
        let refused = Error::new(ErrorType::ConnectRefused).into_up();
        assert_eq!(attempt(&refused, true), Some(Attempt::Connect));
        assert_eq!(attempt(&refused, false), None, "counted when connecting");
        let slow = Error::new(ErrorType::ConnectTimedout).into_up();
        assert_eq!(attempt(&slow, true), Some(Attempt::Timeout));
        let read = Error::new(ErrorType::ReadTimedout).into_up();
        assert_eq!(attempt(&read, false), Some(Attempt::Timeout));
        let reset = Error::new(ErrorType::ConnectionClosed).into_up();
        assert_eq!(attempt(&reset, false), Some(Attempt::Reset));
        let client_gone = Error::new(ErrorType::ConnectionClosed).into_down();
        assert_eq!(attempt(&client_gone, false), None);
        let none = Error::explain(NO_HEALTHY_UPSTREAM, "x");
        assert_eq!(attempt(&none, false), None);
    }

    #[test]
    fn dead_downstreams_get_no_response() {
        let gone = Error::new(ErrorType::ConnectionClosed).into_down();
        assert_eq!(classify(&gone), None);
        let garbage = Error::new(ErrorType::InvalidHTTPHeader).into_down();
        assert_eq!(classify(&garbage), Some(Kind::BadRequest));
    }
}
