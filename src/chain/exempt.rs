//! Exemptions: callers that skip some limits — health checkers and internal callers by
//! address, premium partners by client id (a route's `exempt`), a plan's clients from some
//! of a route's own limits (`exempt_from`). Decided before any store call: an exempt limit
//! is not asked about at all, and is counted as `exempt` (metrics, the access log).
//!
//! The per-IP bucket runs before the caller is identified, so only an address can exempt a
//! request from it.

use ipnet::IpNet;
use std::net::IpAddr;
use std::sync::Arc;

/// One of a route's exemptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exemption {
    pub nets: Vec<IpNet>,
    pub clients: Vec<Arc<str>>,
    /// The limits skipped (`None`: every one, the per-IP bucket included).
    pub limits: Option<Vec<Arc<str>>>,
}

/// What a request skips.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Skips {
    #[default]
    Nothing,
    Everything,
    These(Vec<Arc<str>>),
}

impl Skips {
    pub fn skips(&self, limit: &str) -> bool {
        match self {
            Skips::Nothing => false,
            Skips::Everything => true,
            Skips::These(names) => names.iter().any(|n| **n == *limit),
        }
    }

    fn add(&mut self, more: Option<&[Arc<str>]>) {
        match (more, &mut *self) {
            (_, Skips::Everything) => {}
            (None, _) => *self = Skips::Everything,
            (Some(names), Skips::Nothing) => *self = Skips::These(names.to_vec()),
            (Some(names), Skips::These(have)) => have.extend(names.iter().cloned()),
        }
    }
}

/// The per-IP bucket is skipped for `ip` (an exemption by address naming "ip", or all).
pub fn skips_ip(exemptions: &[Exemption], ip: Option<IpAddr>) -> bool {
    let Some(ip) = ip else { return false };
    exemptions.iter().any(|e| {
        e.nets.iter().any(|n| n.contains(&ip))
            && e.limits
                .as_ref()
                .is_none_or(|l| l.iter().any(|n| &**n == crate::limit::IP_POLICY_NAME))
    })
}

/// What a request from `ip`, identified as `client` on a plan exempt from `plan_exempt`,
/// skips of a route's limits.
pub fn skips(
    exemptions: &[Exemption],
    ip: Option<IpAddr>,
    client: Option<&str>,
    plan_exempt: &[Arc<str>],
) -> Skips {
    let mut out = Skips::Nothing;
    for e in exemptions {
        let by_ip = ip.is_some_and(|ip| e.nets.iter().any(|n| n.contains(&ip)));
        let by_client = client.is_some_and(|c| e.clients.iter().any(|id| **id == *c));
        if by_ip || by_client {
            out.add(e.limits.as_deref());
        }
    }
    if !plan_exempt.is_empty() {
        out.add(Some(plan_exempt));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(nets: &[&str], clients: &[&str], limits: Option<&[&str]>) -> Exemption {
        Exemption {
            nets: nets.iter().map(|n| n.parse().unwrap()).collect(),
            clients: clients.iter().map(|c| Arc::from(*c)).collect(),
            limits: limits.map(|l| l.iter().map(|n| Arc::from(*n)).collect()),
        }
    }

    #[test]
    fn addresses_and_clients_skip_what_their_rule_names() {
        let rules = [
            rule(&["10.0.0.0/8"], &[], None),
            rule(&[], &["partner"], Some(&["per-minute"])),
        ];
        let ip = |s: &str| Some(s.parse().unwrap());
        assert!(skips_ip(&rules, ip("10.1.2.3")));
        assert!(!skips_ip(&rules, ip("192.0.2.1")));
        assert_eq!(skips(&rules, ip("10.1.2.3"), None, &[]), Skips::Everything);
        let partner = skips(&rules, ip("192.0.2.1"), Some("partner"), &[]);
        assert!(partner.skips("per-minute") && !partner.skips("per-day"));
        assert_eq!(
            skips(&rules, ip("192.0.2.1"), Some("other"), &[]),
            Skips::Nothing
        );
        let plan = skips(&rules, None, Some("x"), &[Arc::from("per-tenant")]);
        assert!(plan.skips("per-tenant"));
    }
}
