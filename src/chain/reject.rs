//! Why the gateway answers a request itself instead of proxying it: one value per reason,
//! mapped to the problem+json kind and detail the client gets.

use crate::chain::auth::ApiKeyError;
use crate::chain::credential::CredentialError;
use crate::chain::jwt::verify::TokenError;
use crate::chain::problem::Kind;
use crate::limit::store::StoreError;
use crate::upstream::shed::Shed;

/// Why the gateway answers a request itself instead of proxying it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// Ambiguous or unsupported message framing (request smuggling attempts), or a request
    /// head HTTP/1.1 does not allow (no `Host`, several).
    BadMessage(&'static str),
    UriTooLong(usize),
    HeadersTooLarge(String),
    BodyTooLarge(u64),
    BadPath(&'static str),
    /// The path matches a route's prefix only when letter case is ignored.
    CaseMismatch(String),
    NotFound(String),
    MethodNotAllowed {
        detail: String,
        allow: String,
    },
    Key(ApiKeyError),
    /// No single credential among the route's methods.
    Credential(CredentialError),
    /// The bearer token is refused.
    Token(TokenError),
    /// A limit rejected the request; the decisions are in the request's [`LimitStatus`].
    TooManyRequests,
    /// The store could not decide (down, slow, refusing).
    Store(StoreError),
    /// A keyed limit's key needs a part the request lacks (and the limit says reject).
    MissingKeyPart(String),
    /// A keyed limit's key part is given twice (a header, a body field).
    AmbiguousKeyPart(String),
    /// The upstream pool is at its concurrency limit (load shedding).
    Overloaded(Shed),
    /// The cost the request declares (`cost_from_request`) is not usable.
    BadCost(String),
    /// The gRPC call's `grpc-timeout` is malformed.
    BadDeadline(&'static str),
    /// Admitted to wait its turn, but this instance holds as many waiting requests as it
    /// may (`server.max_delayed`).
    TooManyWaiting,
    /// An upgrade (`Upgrade:`) the route does not let through (`upgrades`).
    UpgradeRefused(String),
    /// The client's address is not let in (`allow_ips` / `deny_ips`): by the server's rules
    /// (`None`) or the named route's.
    AddressRefused(Option<String>),
    /// The identified client may not call the named route (`allow_clients`, `deny_plans`...).
    ClientRefused(String),
    /// A CORS preflight the route's `cors` does not allow (origin, method or a header).
    CorsRefused(crate::chain::cors::Refusal),
    /// Admitted to wait its turn, but this instance holds as many of this client's waiting
    /// requests (by client id or by address) as it may (`server.max_delayed_per_client`).
    WaitingShareTaken,
}

impl Reject {
    pub fn kind(&self) -> Kind {
        match self {
            Reject::BadMessage(_)
            | Reject::BadPath(_)
            | Reject::CaseMismatch(_)
            | Reject::MissingKeyPart(_)
            | Reject::AmbiguousKeyPart(_)
            | Reject::BadCost(_)
            | Reject::BadDeadline(_)
            | Reject::UpgradeRefused(_)
            | Reject::Key(ApiKeyError::Ambiguous | ApiKeyError::RepeatedAuthorization)
            | Reject::Credential(
                CredentialError::Ambiguous(_)
                | CredentialError::Key(ApiKeyError::Ambiguous | ApiKeyError::RepeatedAuthorization),
            ) => Kind::BadRequest,
            Reject::Token(TokenError::NoKeys) => Kind::IdentityUnavailable,
            Reject::Token(TokenError::TooManyFailures) => Kind::QuotaExceeded,
            Reject::Credential(_) | Reject::Token(_) => Kind::Unauthorized,
            Reject::AddressRefused(_) | Reject::ClientRefused(_) | Reject::CorsRefused(_) => {
                Kind::Forbidden
            }
            Reject::UriTooLong(_) => Kind::UriTooLong,
            Reject::HeadersTooLarge(_) => Kind::HeadersTooLarge,
            Reject::BodyTooLarge(_) => Kind::PayloadTooLarge,
            Reject::NotFound(_) => Kind::RouteNotFound,
            Reject::MethodNotAllowed { .. } => Kind::MethodNotAllowed,
            Reject::Key(_) => Kind::Unauthorized,
            Reject::TooManyRequests | Reject::WaitingShareTaken => Kind::QuotaExceeded,
            Reject::Store(_) => Kind::LimiterUnavailable,
            Reject::Overloaded(_) | Reject::TooManyWaiting => Kind::Overloaded,
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Reject::BadMessage(d) | Reject::BadPath(d) | Reject::BadDeadline(d) => {
                (*d).to_owned()
            }
            Reject::UriTooLong(max) => format!("the request target is longer than {max} bytes"),
            Reject::HeadersTooLarge(why) => why.clone(),
            Reject::BodyTooLarge(max) => format!("the request body is larger than {max} bytes"),
            Reject::NotFound(d)
            | Reject::CaseMismatch(d)
            | Reject::MissingKeyPart(d)
            | Reject::AmbiguousKeyPart(d)
            | Reject::BadCost(d)
            | Reject::UpgradeRefused(d)
            | Reject::MethodNotAllowed { detail: d, .. } => d.clone(),
            Reject::AddressRefused(None) => {
                "requests from this address are not accepted by this gateway".to_owned()
            }
            Reject::AddressRefused(Some(route)) => {
                format!("requests from this address are not accepted on route {route}")
            }
            Reject::ClientRefused(route) => {
                format!("this client may not call route {route}")
            }
            Reject::CorsRefused(why) => why.detail().to_owned(),
            Reject::Key(e) => e.detail().to_owned(),
            Reject::Credential(e) => e.detail(),
            Reject::Token(e) => e.detail(),
            Reject::TooManyRequests => {
                "rate limit exceeded; retry after the time in Retry-After".to_owned()
            }
            Reject::Store(_) => {
                "the rate limiter is unavailable; this is not caused by the request".to_owned()
            }
            Reject::TooManyWaiting => "too many requests are waiting their turn on this instance; this is not caused by the request, retry after the time in Retry-After".to_owned(),
            Reject::WaitingShareTaken => "too many of this client's requests are waiting their turn on this instance already; retry after the time in Retry-After".to_owned(),
            Reject::Overloaded(why) => format!(
                "the upstream is overloaded and this request was not sent to it ({}); this is \
                 not caused by the request, retry after the time in Retry-After",
                match why {
                    Shed::QueueFull => "its queue is full",
                    Shed::Timeout => "no slot came free in time",
                    Shed::Displaced => "a more important request took its place",
                }
            ),
        }
    }
}

/// Whether the answer to this rejection must close the connection (the request's body, if
/// any, was not read, or its framing cannot be trusted).
pub fn closes_connection(reject: &Reject) -> bool {
    matches!(
        reject,
        Reject::BadMessage(_)
            | Reject::UriTooLong(_)
            | Reject::HeadersTooLarge(_)
            | Reject::BodyTooLarge(_)
            | Reject::BadPath(_)
            // The client may send the other protocol's bytes right after the handshake.
            | Reject::UpgradeRefused(_)
            | Reject::Key(ApiKeyError::Ambiguous | ApiKeyError::RepeatedAuthorization)
            | Reject::Credential(
                CredentialError::Ambiguous(_)
                    | CredentialError::Key(
                        ApiKeyError::Ambiguous | ApiKeyError::RepeatedAuthorization
                    )
            )
    )
}
