//! A registry client as stored: its id, plan, metadata and API key digests (never a key),
//! the JSON it is stored as, the checks every write and every read applies, and how keys are
//! made.

use crate::chain::auth::KeyDigest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most metadata entries of a client, and the longest name and value.
pub const MAX_METADATA: usize = 32;
pub const MAX_METADATA_TEXT: usize = 256;
/// Hex digits of a key's digest that name it (in lists, and to revoke it).
pub const KEY_ID_LEN: usize = 12;

/// One client of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub plan: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub keys: Vec<StoredKey>,
    /// Left out when empty: an entry without groups is stored as before groups existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// An API key as the registry keeps it: its SHA-256 (hex) and when it was issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredKey {
    pub sha256: String,
    /// Unix seconds.
    pub created: u64,
}

impl StoredKey {
    pub fn digest(&self) -> Option<KeyDigest> {
        KeyDigest::from_hex(&self.sha256)
    }

    /// The digest's first [`KEY_ID_LEN`] hex digits: how lists show the key and revocation
    /// names it.
    pub fn id(&self) -> &str {
        &self.sha256[..KEY_ID_LEN.min(self.sha256.len())]
    }
}

/// Most groups a client may be in.
pub const MAX_GROUPS: usize = 16;

/// Why `groups` cannot be a client's, if they cannot: at most [`MAX_GROUPS`], each a name as
/// a client id is, none twice.
pub fn groups_problem(groups: &[String]) -> Option<String> {
    if groups.len() > MAX_GROUPS {
        return Some(format!("at most {MAX_GROUPS} groups"));
    }
    if let Some(bad) = groups.iter().find(|g| !valid_id(g)) {
        return Some(format!(
            "{bad:?}: a group name is 1 to 64 of A-Z a-z 0-9 _ - ., not only dots"
        ));
    }
    if groups
        .iter()
        .enumerate()
        .any(|(i, g)| groups[..i].contains(g))
    {
        return Some("a group is named twice".into());
    }
    None
}

/// A client id: 1 to 64 of `A-Z a-z 0-9 _ - .`, not only dots (as in the configuration;
/// never a `:`, so never one of the `jwt:` / `cert:` ids; never `.` or `..`, which a URL path
/// cannot name: `/clients/..` is `/`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !id.bytes().all(|b| b == b'.')
}

/// Why `id` is no client id, if it is none.
pub fn id_problem(id: &str) -> Option<String> {
    (!valid_id(id))
        .then(|| format!("{id:?}: a client id is 1 to 64 of A-Z a-z 0-9 _ - ., not only dots"))
}

impl Entry {
    /// The entry as stored (compact JSON; the same entry always gives the same text).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("entries serialize")
    }

    /// An entry read back: well-formed JSON of this shape, and [`Entry::check`] passes.
    pub fn from_json(text: &str, max_keys: usize) -> Result<Entry, String> {
        let entry: Entry = serde_json::from_str(text).map_err(|e| e.to_string())?;
        entry.check(max_keys)?;
        Ok(entry)
    }

    /// Bounds and shapes: a plan name, bounded metadata, at most `max_keys` keys, each a
    /// SHA-256 in hex, none twice.
    pub fn check(&self, max_keys: usize) -> Result<(), String> {
        if !valid_id(&self.plan) {
            return Err(format!("plan {:?} is not a name", self.plan));
        }
        if self.metadata.len() > MAX_METADATA {
            return Err(format!("more than {MAX_METADATA} metadata entries"));
        }
        if self.metadata.iter().any(|(k, v)| {
            k.is_empty() || k.len() > MAX_METADATA_TEXT || v.len() > MAX_METADATA_TEXT
        }) {
            return Err(format!(
                "metadata names are 1 to {MAX_METADATA_TEXT} bytes, values at most {MAX_METADATA_TEXT}"
            ));
        }
        if let Some(problem) = groups_problem(&self.groups) {
            return Err(problem);
        }
        if self.keys.len() > max_keys {
            return Err(format!("more than {max_keys} keys"));
        }
        for (i, key) in self.keys.iter().enumerate() {
            if key.digest().is_none() || key.sha256.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err("a key digest is not 64 lower-case hex digits".into());
            }
            if self.keys[..i].iter().any(|k| k.id() == key.id()) {
                return Err("two keys share a digest prefix".into());
            }
        }
        Ok(())
    }
}

/// A new API key: `prefix` and 32 random bytes (the operating system's CSPRNG) as 43
/// base64url characters. Returned to the caller once; only its digest is kept.
pub fn new_key(prefix: &str) -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(prefix.len() + 43);
    out.push_str(prefix);
    let mut acc = 0u32;
    let mut bits = 0;
    for b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    Ok(out)
}

/// The SHA-256 of `key` in lower-case hex.
pub fn digest_hex(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_bad_ones_are_refused() {
        let key = new_key("tsk_").unwrap();
        assert!(key.starts_with("tsk_") && key.len() == 4 + 43, "{key}");
        assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_ne!(key, new_key("tsk_").unwrap());
        let entry = Entry {
            plan: "pro".into(),
            metadata: BTreeMap::from([("team".into(), "billing".into())]),
            keys: vec![StoredKey {
                sha256: digest_hex(&key),
                created: 1,
            }],
            groups: Vec::new(),
        };
        assert_eq!(Entry::from_json(&entry.to_json(), 10), Ok(entry.clone()));
        // No groups: stored as before groups existed (a gateway of an older version reads it).
        assert!(!entry.to_json().contains("groups"), "{}", entry.to_json());
        let grouped = Entry {
            groups: vec!["partners".into(), "eu".into()],
            ..entry.clone()
        };
        assert_eq!(
            Entry::from_json(&grouped.to_json(), 10),
            Ok(grouped.clone())
        );
        for bad in [vec!["a:b".to_owned()], vec!["x".to_owned(), "x".to_owned()]] {
            let entry = Entry {
                groups: bad,
                ..entry.clone()
            };
            assert!(Entry::from_json(&entry.to_json(), 10).is_err());
        }
        assert_eq!(entry.keys[0].id().len(), KEY_ID_LEN);
        assert!(
            Entry::from_json(&entry.to_json(), 0).is_err(),
            "too many keys"
        );
        for bad in [
            r#"{"plan":"pro","keys":[{"sha256":"xyz","created":1}]}"#,
            r#"{"plan":"has space"}"#,
            r#"{"plan":"pro","extra":1}"#,
            r#"not json"#,
        ] {
            assert!(Entry::from_json(bad, 10).is_err(), "{bad}");
        }
        assert!(valid_id("acme-co.eu_1"));
        assert!(!valid_id("jwt:idp:x"));
        assert!(!valid_id(""));
    }
}
