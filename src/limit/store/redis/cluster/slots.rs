//! The Cluster's slot map as values: which hash slot a key is in, and which node serves each
//! slot, read from a `CLUSTER SLOTS` reply. Pure: no connection here.

use redis::Value;

/// Hash slots in a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the text between the first `{`
/// and the next `}`, if not empty — or of the whole key, modulo [`SLOTS`].
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// A range of slots and the address (`host:port`) of the primary serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub first: u16,
    pub last: u16,
    pub primary: String,
}

/// Reads a `CLUSTER SLOTS` reply asked of `asked` (`host:port`): each entry is
/// `[first, last, [host, port, id, ...], replicas...]`; a host of `""` or `"?"` means the
/// node that answered. Errs on anything else, or on a map that leaves a slot unserved (a
/// cluster whose state is not `ok` is not worth switching to).
pub fn parse_slots(reply: &Value, asked: &str) -> Result<Vec<SlotRange>, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}"));
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err("a CLUSTER SLOTS entry is not an array".into());
        };
        let (Some(first), Some(last)) = (int(fields.first()), int(fields.get(1))) else {
            return Err("a CLUSTER SLOTS entry lacks its range".into());
        };
        let Some(primary) = fields.get(2).and_then(|n| node_at(n, asked)) else {
            return Err("a CLUSTER SLOTS entry lacks a usable primary".into());
        };
        if first > last || first < 0 || last >= SLOTS as i64 {
            return Err(format!("CLUSTER SLOTS named slots {first}-{last}"));
        }
        ranges.push(SlotRange {
            first: first as u16,
            last: last as u16,
            primary,
        });
    }
    let served: usize = ranges
        .iter()
        .map(|r| usize::from(r.last - r.first) + 1)
        .sum();
    if served < SLOTS {
        return Err(format!(
            "the cluster serves {served} of {SLOTS} slots (its state is not ok)"
        ));
    }
    Ok(ranges)
}

/// Every node a `CLUSTER SLOTS` reply names, replicas included.
pub fn nodes_named(reply: &Value, asked: &str) -> Vec<String> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => Some(fields.iter().skip(2).filter_map(|n| node_at(n, asked))),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The `host:port` of a node entry `[host, port, id, ...]`; a host of `""` or `"?"` is the
/// host of the node asked.
fn node_at(node: &Value, asked: &str) -> Option<String> {
    let Value::Array(fields) = node else {
        return None;
    };
    let host = text(fields.first())?;
    let port = u16::try_from(int(fields.get(1))?).ok().filter(|&p| p > 0)?;
    if host.is_empty() || host == "?" {
        let asked_host = split_address(asked).0;
        return Some(address(&asked_host, port));
    }
    Some(address(&host, port))
}

/// `host:port`, an IPv6 host in brackets.
pub fn address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Which of `nodes` serves each slot: `owner[slot]` is an index into `nodes`.
pub struct SlotTable<N> {
    owner: Box<[u16]>,
    pub nodes: Vec<N>,
}

impl<N> SlotTable<N> {
    /// The table of `ranges`, each primary's node made (or found again) by `node`.
    pub fn build(ranges: &[SlotRange], mut node: impl FnMut(&str) -> N) -> SlotTable<N>
    where
        N: Clone,
    {
        let mut names: Vec<&str> = Vec::new();
        let mut nodes = Vec::new();
        let mut owner = vec![0u16; SLOTS].into_boxed_slice();
        for range in ranges {
            let at = match names.iter().position(|n| *n == range.primary) {
                Some(at) => at,
                None => {
                    names.push(&range.primary);
                    nodes.push(node(&range.primary));
                    names.len() - 1
                }
            };
            owner[usize::from(range.first)..=usize::from(range.last)].fill(at as u16);
        }
        SlotTable { owner, nodes }
    }

    /// The node serving `slot`.
    pub fn node(&self, slot: u16) -> &N {
        &self.nodes[usize::from(self.owner[usize::from(slot) % SLOTS])]
    }

    /// How many slots each node serves, in `nodes` order.
    pub fn slot_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for &at in self.owner.iter() {
            counts[usize::from(at)] += 1;
        }
        counts
    }
}

/// `host:port` (an IPv6 host in brackets) as its parts.
pub fn split_address(addr: &str) -> (String, u16) {
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "6379"));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.to_owned(), port.parse().unwrap_or(6379))
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag_as_redis_computes_them() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    fn entry(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_full_map_is_read_and_an_unknown_host_is_the_node_asked() {
        let reply = Value::Array(vec![
            entry(0, 5460, "10.0.0.1", 7000),
            entry(5461, 10922, "", 7001),
            entry(10923, 16383, "::1", 7002),
        ]);
        let ranges = parse_slots(&reply, "10.0.0.9:7001").unwrap();
        assert_eq!(ranges[1].primary, "10.0.0.9:7001");
        assert_eq!(ranges[2].primary, "[::1]:7002");
        let table = SlotTable::build(&ranges, |name| name.to_owned());
        assert_eq!(table.node(0), "10.0.0.1:7000");
        assert_eq!(table.node(5461), "10.0.0.9:7001");
        assert_eq!(table.node(16383), "[::1]:7002");
        assert_eq!(table.slot_counts(), vec![5461, 5462, 5461]);
    }

    #[test]
    fn a_map_with_unserved_slots_or_bad_fields_is_refused() {
        let partial = Value::Array(vec![entry(0, 100, "h", 1)]);
        assert!(parse_slots(&partial, "h:1").unwrap_err().contains("101 of"));
        let bad = Value::Array(vec![entry(5, 1, "h", 1)]);
        assert!(parse_slots(&bad, "h:1").is_err());
        assert!(parse_slots(&Value::Nil, "h:1").is_err());
        let no_port = Value::Array(vec![entry(0, 16383, "h", 0)]);
        assert!(parse_slots(&no_port, "h:1").is_err());
    }
}
