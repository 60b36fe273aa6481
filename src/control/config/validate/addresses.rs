//! `allow_ips` / `deny_ips` (a route's and `[server]`'s): networks parsed strictly, an empty
//! allow list and an allow entry no address could pass refused.

use super::checks::Problems;
use crate::chain::address::{shadowed, AddressRules};
use ipnet::IpNet;
use std::sync::Arc;

/// The rules of one scope (`base` is `server` or `routes[N]`); `None` without entries.
pub(super) fn address_rules(
    base: &str,
    allow: Option<Vec<String>>,
    deny: Option<Vec<String>>,
    problems: &mut Problems,
) -> Option<Arc<AddressRules>> {
    if allow.as_ref().is_some_and(Vec::is_empty) {
        problems.push(
            format!("{base}.allow_ips"),
            "an empty allow list lets no address in: remove the key to let every address in",
        );
    }
    let (allow, allow_at) = networks(
        &format!("{base}.allow_ips"),
        allow.unwrap_or_default(),
        problems,
    );
    let (deny, deny_at) = networks(
        &format!("{base}.deny_ips"),
        deny.unwrap_or_default(),
        problems,
    );
    for (a, d) in shadowed(&allow, &deny) {
        problems.push(
            format!("{base}.allow_ips[{}]", allow_at[a]),
            format!(
                "{} lies inside deny_ips[{}] ({}): it can let no address in",
                allow[a], deny_at[d], deny[d]
            ),
        );
    }
    AddressRules::new(allow, deny).map(Arc::new)
}

/// CIDRs or single addresses, and where each was in the list; a network with host bits set
/// (`10.0.0.5/8`) is refused, as it says two different things.
fn networks(path: &str, list: Vec<String>, problems: &mut Problems) -> (Vec<IpNet>, Vec<usize>) {
    let mut nets = Vec::with_capacity(list.len());
    let mut at = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let parsed = text
            .trim()
            .parse::<IpNet>()
            .or_else(|_| text.trim().parse::<std::net::IpAddr>().map(IpNet::from));
        match parsed {
            Ok(net) if net != net.trunc() => problems.push(
                format!("{path}[{i}]"),
                format!(
                    "{text:?} has bits set past its prefix: write {} for the network, or the address alone",
                    net.trunc()
                ),
            ),
            Ok(net) => {
                nets.push(net);
                at.push(i);
            }
            Err(_) => problems.push(
                format!("{path}[{i}]"),
                format!(
                    "{text:?}: expected a CIDR like \"10.0.0.0/8\" or \"2001:db8::/32\", or an address like \"192.0.2.7\""
                ),
            ),
        }
    }
    (nets, at)
}
