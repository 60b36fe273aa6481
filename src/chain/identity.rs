//! Who is calling: the client IP address (for the per-IP limit) from the TCP peer and, only
//! when the peer is a trusted proxy, from `X-Forwarded-For`.
//!
//! `X-Forwarded-For` is walked from the right: each entry was written by the hop to its
//! right, so an entry is believable only while every hop after it is a trusted proxy. The
//! first untrusted address found is the client. A client that is not a trusted proxy cannot
//! pick its address by sending the header (the peer address is used as is), and garbage in
//! the header never panics: an entry that does not parse ends the walk and the peer address
//! is used. At most [`MAX_HOPS`] entries are examined.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};

/// Most `X-Forwarded-For` entries examined from the right.
pub const MAX_HOPS: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies(nets)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.0
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// The client address of a request whose TCP peer is `peer` and whose `X-Forwarded-For`
/// header lines are `forwarded` (in the order received).
pub fn client_ip<'a, I>(peer: IpAddr, forwarded: I, trusted: &TrustedProxies) -> IpAddr
where
    I: DoubleEndedIterator<Item = &'a [u8]>,
{
    let peer = peer.to_canonical();
    if trusted.is_empty() || !trusted.contains(peer) {
        return peer;
    }
    let mut last_trusted = peer;
    let mut hops = 0;
    for line in forwarded.rev() {
        for entry in line.rsplit(|&b| b == b',') {
            let entry = entry.trim_ascii();
            if entry.is_empty() {
                continue;
            }
            hops += 1;
            if hops > MAX_HOPS {
                return last_trusted;
            }
            let Some(ip) = parse_entry(entry) else {
                return peer;
            };
            if !trusted.contains(ip) {
                return ip;
            }
            last_trusted = ip;
        }
    }
    // Every hop is trusted: the request started inside the trusted network.
    last_trusted
}

/// One `X-Forwarded-For` entry: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:443`, `fe80::1%eth0`. Anything else (`unknown`, garbage) is `None`.
pub fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    if entry.len() > 64 {
        return None;
    }
    let text = std::str::from_utf8(entry).ok()?;
    let ip = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        strip_zone(inside)
            .parse::<Ipv6Addr>()
            .ok()
            .map(IpAddr::V6)?
    } else if let Ok(ip) = strip_zone(text).parse::<IpAddr>() {
        ip
    } else {
        // IPv4 with a port.
        let (host, port) = text.rsplit_once(':')?;
        if !is_port(port) {
            return None;
        }
        IpAddr::V4(host.parse().ok()?)
    };
    Some(ip.to_canonical())
}

fn strip_zone(text: &str) -> &str {
    text.split_once('%').map_or(text, |(addr, _)| addr)
}

fn is_port(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u16>().is_ok()
}

/// Prefix lengths used to group client addresses: one IPv6 host usually owns a whole /64, so
/// limiting per /128 would let it rotate addresses freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouping {
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

impl Default for Grouping {
    fn default() -> Grouping {
        Grouping {
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
}

/// The key an address is limited under: the address masked to its group's prefix, IPv4 as
/// IPv4-mapped IPv6 so both families share one key space without colliding.
pub fn group_key(ip: IpAddr, grouping: Grouping) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4) & mask32(grouping.ipv4_prefix);
            (0xffff_u128 << 32) | u128::from(bits)
        }
        IpAddr::V6(v6) => u128::from(v6) & mask128(grouping.ipv6_prefix),
    }
}

fn mask32(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - p),
    }
}

fn mask128(prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p if p >= 128 => u128::MAX,
        p => u128::MAX << (128 - p),
    }
}

/// A grouped key back to a printable address (for logs and tests).
pub fn key_to_ip(key: u128) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(key)).to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect())
    }

    fn client(peer: &str, xff: &[&str], t: &TrustedProxies) -> IpAddr {
        client_ip(ip(peer), xff.iter().map(|s| s.as_bytes()), t)
    }

    #[test]
    fn an_untrusted_peer_cannot_choose_its_address() {
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(client("203.0.113.9", &["1.2.3.4"], &t), ip("203.0.113.9"));
        assert_eq!(
            client("203.0.113.9", &["1.2.3.4"], &TrustedProxies::default()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn a_trusted_peers_header_is_walked_from_the_right() {
        let t = trusted(&["10.0.0.0/8"]);
        assert_eq!(client("10.0.0.1", &["1.2.3.4"], &t), ip("1.2.3.4"));
        // The client prepended a fake entry: the proxy's own entry (rightmost untrusted) wins.
        assert_eq!(client("10.0.0.1", &["6.6.6.6, 1.2.3.4"], &t), ip("1.2.3.4"));
        // Two trusted hops.
        assert_eq!(
            client("10.0.0.1", &["6.6.6.6, 1.2.3.4, 10.9.9.9"], &t),
            ip("1.2.3.4")
        );
        // Several header lines are one list, in order.
        assert_eq!(
            client("10.0.0.1", &["6.6.6.6", "1.2.3.4", "10.9.9.9"], &t),
            ip("1.2.3.4")
        );
        // No header: the peer itself.
        assert_eq!(client("10.0.0.1", &[], &t), ip("10.0.0.1"));
        // All trusted: the leftmost.
        assert_eq!(
            client("10.0.0.1", &["10.0.0.7, 10.0.0.8"], &t),
            ip("10.0.0.7")
        );
    }

    #[test]
    fn garbage_falls_back_to_the_peer() {
        let t = trusted(&["10.0.0.0/8"]);
        for bad in [
            "garbage",
            "1.2.3.4.5",
            "unknown",
            "\u{ff}\u{fe}",
            "[::1",
            "1.2.3.4:99999",
            "::1]:80",
        ] {
            assert_eq!(client("10.0.0.1", &[bad], &t), ip("10.0.0.1"), "{bad:?}");
        }
        // Garbage to the left of the first untrusted entry is never reached.
        assert_eq!(client("10.0.0.1", &["garbage, 1.2.3.4"], &t), ip("1.2.3.4"));
        // Empty elements are skipped.
        assert_eq!(client("10.0.0.1", &[" , ,1.2.3.4, "], &t), ip("1.2.3.4"));
        assert_eq!(
            client_ip(ip("10.0.0.1"), [&[0xff_u8, 0xfe][..]].into_iter(), &t),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_walk_is_bounded() {
        let t = trusted(&["10.0.0.0/8"]);
        let many = vec!["10.1.1.1"; 500].join(", ");
        assert_eq!(
            client("10.0.0.1", &[&format!("1.2.3.4, {many}")], &t),
            ip("10.1.1.1")
        );
    }

    #[test]
    fn entries_with_ports_brackets_and_zones_parse() {
        assert_eq!(parse_entry(b"1.2.3.4:5678"), Some(ip("1.2.3.4")));
        assert_eq!(parse_entry(b"[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(parse_entry(b"[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_entry(b"fe80::1%eth0"), Some(ip("fe80::1")));
        assert_eq!(parse_entry(b"::ffff:1.2.3.4"), Some(ip("1.2.3.4")));
        assert_eq!(parse_entry(&[b'1'; 100]), None);
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        let g = Grouping::default();
        let a = group_key(ip("2001:db8:1:2:aaaa::1"), g);
        let b = group_key(ip("2001:db8:1:2:bbbb::2"), g);
        let c = group_key(ip("2001:db8:1:3::1"), g);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(key_to_ip(a), ip("2001:db8:1:2::"));
        // IPv4 is per address by default, and never collides with IPv6.
        assert_ne!(group_key(ip("1.2.3.4"), g), group_key(ip("1.2.3.5"), g));
        assert_eq!(key_to_ip(group_key(ip("1.2.3.4"), g)), ip("1.2.3.4"));
        let g24 = Grouping {
            ipv4_prefix: 24,
            ipv6_prefix: 128,
        };
        assert_eq!(
            group_key(ip("1.2.3.4"), g24),
            group_key(ip("1.2.3.200"), g24)
        );
        assert_ne!(
            group_key(ip("2001:db8::1"), g24),
            group_key(ip("2001:db8::2"), g24)
        );
    }
}
