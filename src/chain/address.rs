//! Address rules (`allow_ips` / `deny_ips`, per route and in `[server]`): whether a client
//! address may call at all. Pure: the address is the one `identity::client_ip` derived
//! through `trusted_proxies`, so a spoofed `X-Forwarded-For` from an untrusted peer changes
//! nothing here.
//!
//! A list of networks becomes a sorted table of disjoint address ranges (IPv4 as the
//! IPv4-mapped part of the IPv6 space), looked up by binary search: a 10 000-entry list
//! costs about 14 comparisons, not 10 000.

use ipnet::IpNet;
use std::net::IpAddr;

/// A set of networks as sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressSet {
    ranges: Box<[(u128, u128)]>,
}

impl AddressSet {
    pub fn new(nets: &[IpNet]) -> AddressSet {
        let mut spans: Vec<(u128, u128)> = nets.iter().map(span).collect();
        spans.sort_unstable();
        let mut ranges: Vec<(u128, u128)> = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            match ranges.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => ranges.push((start, end)),
            }
        }
        AddressSet {
            ranges: ranges.into_boxed_slice(),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let at = point(ip);
        // The last range starting at or before `at`.
        let after = self.ranges.partition_point(|&(start, _)| start <= at);
        after > 0 && at <= self.ranges[after - 1].1
    }

    /// Disjoint ranges in the table (after merging overlapping and adjacent networks).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// `allow_ips` and `deny_ips` of one scope (a route, or the whole server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRules {
    /// `None`: every address not denied may call.
    allow: Option<AddressSet>,
    deny: AddressSet,
    /// As configured (for `/config`).
    pub allow_nets: Vec<IpNet>,
    pub deny_nets: Vec<IpNet>,
}

impl AddressRules {
    /// `None` when neither list has an entry (the scope has no rules: nothing to check).
    pub fn new(allow_nets: Vec<IpNet>, deny_nets: Vec<IpNet>) -> Option<AddressRules> {
        if allow_nets.is_empty() && deny_nets.is_empty() {
            return None;
        }
        Some(AddressRules {
            allow: (!allow_nets.is_empty()).then(|| AddressSet::new(&allow_nets)),
            deny: AddressSet::new(&deny_nets),
            allow_nets,
            deny_nets,
        })
    }

    /// Whether a client at `ip` may call. A denied address is refused even inside an allowed
    /// network (a deny list carves exceptions out of an allow list). A client without an IP
    /// address (a Unix socket) is refused where an allow list exists: it is not in it.
    pub fn admits(&self, ip: Option<IpAddr>) -> bool {
        match ip {
            Some(ip) => {
                !self.deny.contains(ip) && self.allow.as_ref().is_none_or(|a| a.contains(ip))
            }
            None => self.allow.is_none(),
        }
    }
}

/// Pairs (allow index, deny index) where the deny network covers the whole allow network:
/// that allow entry can never let anyone in (a configuration mistake).
pub fn shadowed(allow: &[IpNet], deny: &[IpNet]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (i, a) in allow.iter().enumerate() {
        let (a_start, a_end) = span(a);
        if let Some(j) = deny.iter().position(|d| {
            let (d_start, d_end) = span(d);
            d_start <= a_start && a_end <= d_end
        }) {
            found.push((i, j));
        }
    }
    found
}

const V4_MAPPED: u128 = 0xffff << 32;

fn point(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => V4_MAPPED | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inclusive range of a network; an IPv4 network (or an IPv4-mapped IPv6 one, which is
/// the same addresses) lies in `::ffff:0:0/96`.
fn span(net: &IpNet) -> (u128, u128) {
    let (start, host_bits) = match net {
        IpNet::V4(v4) => (
            V4_MAPPED | u128::from(u32::from(v4.network())),
            32 - u32::from(v4.prefix_len()),
        ),
        IpNet::V6(v6) => (u128::from(v6.network()), 128 - u32::from(v6.prefix_len())),
    };
    let size_minus_one = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (start, start | size_minus_one)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn ranges_merge_and_look_up_at_their_edges() {
        let set = AddressSet::new(&nets(&[
            "10.0.0.0/24",
            "10.0.1.0/24",
            "10.0.0.128/25",
            "192.0.2.7/32",
            "2001:db8::/32",
        ]));
        assert_eq!(set.len(), 3, "adjacent and nested networks merge");
        for inside in ["10.0.0.0", "10.0.1.255", "192.0.2.7", "2001:db8:ffff::1"] {
            assert!(set.contains(inside.parse().unwrap()), "{inside}");
        }
        for outside in [
            "9.255.255.255",
            "10.0.2.0",
            "192.0.2.6",
            "192.0.2.8",
            "2001:db9::",
        ] {
            assert!(!set.contains(outside.parse().unwrap()), "{outside}");
        }
    }

    #[test]
    fn ipv4_mapped_ipv6_peers_match_ipv4_rules_and_the_other_way_round() {
        let v4 = AddressSet::new(&nets(&["203.0.113.0/24"]));
        assert!(v4.contains("::ffff:203.0.113.9".parse().unwrap()));
        let mapped = AddressSet::new(&nets(&["::ffff:203.0.113.0/120"]));
        assert!(mapped.contains("203.0.113.9".parse().unwrap()));
        assert!(!mapped.contains("203.0.114.9".parse().unwrap()));
    }

    #[test]
    fn the_whole_space_and_a_single_address() {
        let all = AddressSet::new(&nets(&["::/0"]));
        assert!(all.contains("::".parse().unwrap()));
        assert!(all.contains("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap()));
        assert!(all.contains("127.0.0.1".parse().unwrap()));
        let every_v4 = AddressSet::new(&nets(&["0.0.0.0/0"]));
        assert!(every_v4.contains("255.255.255.255".parse().unwrap()));
        assert!(!every_v4.contains("::1".parse().unwrap()));
    }

    #[test]
    fn deny_carves_out_of_allow_and_no_address_is_not_allowed() {
        let rules = AddressRules::new(nets(&["10.0.0.0/8"]), nets(&["10.9.0.0/16"])).unwrap();
        assert!(rules.admits(ip("10.1.2.3")));
        assert!(!rules.admits(ip("10.9.2.3")));
        assert!(!rules.admits(ip("11.0.0.1")));
        assert!(!rules.admits(None));
        let deny_only = AddressRules::new(vec![], nets(&["10.9.0.0/16"])).unwrap();
        assert!(deny_only.admits(ip("11.0.0.1")));
        assert!(deny_only.admits(None));
        assert!(AddressRules::new(vec![], vec![]).is_none());
    }

    #[test]
    fn ten_thousand_entries_agree_with_a_scan() {
        let list: Vec<IpNet> = (0..10_000u32)
            .map(|i| {
                let base = 0x0a00_0000u32.wrapping_add(i.wrapping_mul(2_654_435_761) & 0x00ff_fff0);
                let prefix = 24 + (i % 9) as u8;
                IpNet::V4(ipnet::Ipv4Net::new(base.into(), prefix).unwrap().trunc())
            })
            .collect();
        let set = AddressSet::new(&list);
        for probe in (0..20_000u32).map(|i| 0x0a00_0000u32 | (i.wrapping_mul(40_503) & 0x00ff_ffff))
        {
            let addr = IpAddr::V4(probe.into());
            let scanned = list.iter().any(|n| n.contains(&addr));
            assert_eq!(set.contains(addr), scanned, "{addr}");
        }
    }

    #[test]
    fn an_allow_entry_inside_a_deny_entry_is_named() {
        let allow = nets(&["10.0.0.0/24", "192.0.2.0/24", "2001:db8::/48"]);
        let deny = nets(&["10.0.0.0/8", "192.0.2.128/25", "2001:db8::/32"]);
        assert_eq!(shadowed(&allow, &deny), vec![(0, 0), (2, 2)]);
    }
}
