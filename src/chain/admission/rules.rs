//! What admission needs of one route: built once per snapshot from its configuration.

use crate::chain::headers::policy_header;
use crate::chain::partition::{KeyHasher, KeyPart, Missing};
use crate::limit::ip::IpLimiter;
use crate::limit::store::FailureMode;
use crate::limit::Policy;
use http::HeaderValue;
use std::sync::Arc;

/// What admission needs of one route, built once per snapshot.
pub struct RouteRules {
    pub name: Arc<str>,
    /// Units one request costs against the plan's limits.
    pub cost: u64,
    /// Every limit of the route is a dry run.
    pub shadow: bool,
    pub on_store_error: FailureMode,
    /// The per-IP table the route uses, if any.
    pub ip: Option<IpRule>,
    /// The route's own per-client concurrency limit, with its `RateLimit-Policy`.
    pub concurrency: Option<(Policy, HeaderValue)>,
    /// The route's keyed limits, in configuration order.
    pub keyed: Vec<KeyedLimit>,
    /// `RateLimit-Policy` of the enforced keyed limits, rendered once (`None`: none).
    pub keyed_header: Option<HeaderValue>,
    /// Turns key parts into partitions (the same secret on every instance).
    pub hasher: Arc<KeyHasher>,
    /// Callers that skip some of the route's limits.
    pub exempt: Vec<crate::chain::exempt::Exemption>,
    /// Where a request states what it reserves of limits charged from the response.
    pub reserve_from: Option<KeyPart>,
}

/// A route's limit counted per key.
pub struct KeyedLimit {
    pub policy: Policy,
    pub shadow: bool,
    pub key: Vec<KeyPart>,
    pub missing: Missing,
}

impl KeyedLimit {
    /// `RateLimit-Policy` of the enforced ones among `limits` (none on a dry-run route).
    pub fn header(limits: &[KeyedLimit], route_shadow: bool) -> Option<HeaderValue> {
        let enforced: Vec<&Policy> = limits
            .iter()
            .filter(|l| !l.shadow && !route_shadow)
            .map(|l| &l.policy)
            .collect();
        if enforced.is_empty() {
            return None;
        }
        let rendered = policy_header(enforced.into_iter());
        Some(HeaderValue::from_str(&rendered).expect("policy names are header-safe"))
    }
}

/// A per-IP table and its `RateLimit-Policy`, rendered once.
pub struct IpRule {
    pub limiter: Arc<IpLimiter>,
    pub policy_header: HeaderValue,
}

impl IpRule {
    pub fn new(limiter: Arc<IpLimiter>) -> IpRule {
        let header = policy_header(std::iter::once(&limiter.policy));
        IpRule {
            policy_header: HeaderValue::from_str(&header).expect("policy names are header-safe"),
            limiter,
        }
    }
}
