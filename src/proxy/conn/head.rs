//! The admin listener's request head, measured as it arrives: Pingora's HTTP/1 server (which
//! the admin listener uses as it is) reads a head up to 1 MiB and closes the connection
//! without a word when one is too large or its target too long to parse. A head scanned here
//! gets an answer instead — 414 for a request line longer than the server's
//! `max_uri_length`, 431 for a head longer than its `max_header_bytes` — as the proxy
//! listener gives. (The proxy listener's own check runs on the parsed request: chain/message.rs.)

/// How a request head broke its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The request line (method, target, version) is too long: 414.
    Target,
    /// The whole head is too long: 431.
    Head,
}

impl Over {
    pub fn status(self) -> u16 {
        match self {
            Over::Target => 414,
            Over::Head => 431,
        }
    }
}

/// A head's bytes counted as they arrive, until its end (`\r\n\r\n`).
#[derive(Debug)]
pub struct HeadScan {
    line_max: usize,
    head_max: usize,
    seen: usize,
    line_done: bool,
    /// The last four bytes seen (the end of the head is `\r\n\r\n`).
    last: u32,
    done: bool,
}

impl HeadScan {
    /// `target_max`: the longest request target; the request line may be that plus room for
    /// a method and the version.
    pub fn new(target_max: usize, head_max: usize) -> HeadScan {
        HeadScan {
            line_max: target_max + 32,
            head_max,
            seen: 0,
            line_done: false,
            last: 0,
            done: false,
        }
    }

    /// Counts `bytes`; what bound they break, if any (the first time only).
    pub fn feed(&mut self, bytes: &[u8]) -> Option<Over> {
        for &b in bytes {
            if self.done {
                return None;
            }
            self.seen += 1;
            self.last = (self.last << 8) | u32::from(b);
            if !self.line_done && self.last & 0xffff == 0x0d0a {
                self.line_done = true;
            }
            if self.last == 0x0d0a_0d0a {
                self.done = true;
                return None;
            }
            if !self.line_done && self.seen > self.line_max {
                self.done = true;
                return Some(Over::Target);
            }
            if self.seen > self.head_max {
                self.done = true;
                return Some(Over::Head);
            }
        }
        None
    }
}

/// A head being measured, and the answer being written once it broke a bound (bytes, and
/// how many are written).
#[derive(Debug)]
pub struct HeadGuard {
    pub scan: HeadScan,
    pub answer: Option<(Vec<u8>, usize)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_target_is_414_a_long_head_431_and_a_body_is_never_counted() {
        let mut scan = HeadScan::new(100, 300);
        let long_target = format!("GET /{} HTTP/1.1\r\n", "a".repeat(200));
        assert_eq!(scan.feed(long_target.as_bytes()), Some(Over::Target));
        assert_eq!(scan.feed(b"more"), None, "once");

        let mut scan = HeadScan::new(100, 300);
        assert_eq!(scan.feed(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
        let header = format!("X-A: {}\r\n", "b".repeat(300));
        // In pieces, as reads deliver it.
        let (a, b) = header.as_bytes().split_at(150);
        assert_eq!(scan.feed(a), None);
        assert_eq!(scan.feed(b), Some(Over::Head));

        let mut scan = HeadScan::new(100, 300);
        assert_eq!(
            scan.feed(b"POST /x HTTP/1.1\r\nContent-Length: 999\r\n\r\n"),
            None
        );
        assert_eq!(scan.feed("z".repeat(999).as_bytes()), None, "the body");
    }
}
