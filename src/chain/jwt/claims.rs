//! A token's claims, read one way. The payload is JSON, and JSON readers disagree on an object
//! that names a member twice (most take the last, some the first, some refuse) and on names
//! that differ only in case (Go's `encoding/json` and .NET match struct fields ignoring case,
//! the last match winning). The gateway decides who the caller is from these claims and the
//! upstream may read them again, so a payload with either shape, at any depth, is refused
//! rather than read one way here and another way there.
//!
//! Claims are named by a path: a top-level name as it is (`https://example.com/tier`, as
//! Auth0 namespaces its custom claims), or else dotted segments into nested objects
//! (`org.id`).

use crate::chain::fold;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::fmt;

/// Longest text taken from a claim (an id, a plan name, a key part, a forwarded header).
pub const MAX_CLAIM_TEXT: usize = 256;

/// The claims of a verified token.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims(Map<String, Value>);

/// A claim's name as configured: `sub`, `org.id`, `https://example.com/tier`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimPath(String);

impl ClaimPath {
    /// 1 to 128 visible ASCII characters.
    pub fn parse(text: &str) -> Result<ClaimPath, String> {
        let ok = !text.is_empty()
            && text.len() <= 128
            && text.bytes().all(|b| (0x21..=0x7e).contains(&b))
            && !text.starts_with('.')
            && !text.ends_with('.')
            && !text.contains("..");
        if ok {
            Ok(ClaimPath(text.to_owned()))
        } else {
            Err(format!(
                "{text:?}: a claim is named by 1 to 128 visible ASCII characters (dots reach into nested objects)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClaimPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Claims {
    pub fn new(map: Map<String, Value>) -> Claims {
        Claims(map)
    }

    /// The claim at `path`: the top-level member of that exact name, or else the dotted walk.
    pub fn get(&self, path: &ClaimPath) -> Option<&Value> {
        if let Some(v) = self.0.get(&path.0) {
            return Some(v);
        }
        let mut segments = path.0.split('.');
        let mut current = self.0.get(segments.next()?)?;
        for segment in segments {
            current = current.as_object()?.get(segment)?;
        }
        Some(current)
    }

    /// The claim as text, when it is a non-empty string or an integer of at most
    /// [`MAX_CLAIM_TEXT`] bytes (`Err` names why it is not usable; `Ok(None)`: absent).
    pub fn text(&self, path: &ClaimPath) -> Result<Option<String>, String> {
        match self.get(path) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) if s.len() <= MAX_CLAIM_TEXT => Ok(Some(s.clone())),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(Some(n.to_string())),
            Some(Value::String(_)) => Err(format!(
                "claim {path} is longer than {MAX_CLAIM_TEXT} bytes"
            )),
            Some(_) => Err(format!("claim {path} is not a string or an integer")),
        }
    }

    /// A numeric date claim (`exp`, `nbf`, `iat`) in whole seconds, if present.
    pub fn seconds(&self, name: &str) -> Option<f64> {
        self.0.get(name).and_then(Value::as_f64)
    }

    pub fn contains(&self, path: &ClaimPath) -> bool {
        !matches!(self.get(path), None | Some(Value::Null))
    }
}

/// Deserializes the payload, refusing a member named twice or two names one reader would
/// take for the same field, at every depth.
impl<'de> Deserialize<'de> for Claims {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Claims, D::Error> {
        match deserializer.deserialize_any(StrictVisitor)? {
            Value::Object(map) => Ok(Claims(map)),
            _ => Err(de::Error::custom("the claims are not a JSON object")),
        }
    }
}

struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut folded: HashSet<String> = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if !folded.insert(fold::name(&name)) {
                return Err(de::Error::custom(format_args!(
                    "a claim is named twice, or twice ignoring case ({:?})",
                    name.chars().take(64).collect::<String>()
                )));
            }
            let Strict(value) = map.next_value()?;
            out.insert(name, value);
        }
        Ok(Value::Object(out))
    }
}

/// `Ok` when `claims` (a payload's JSON) has one reading; the claims.
pub fn parse(json: &[u8]) -> Result<Claims, String> {
    serde_json::from_slice(json).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> ClaimPath {
        ClaimPath::parse(p).unwrap()
    }

    #[test]
    fn members_named_twice_or_alike_ignoring_case_are_refused_at_any_depth() {
        for payload in [
            r#"{"sub":"a","sub":"b"}"#,
            r#"{"sub":"a","SUB":"b"}"#,
            r#"{"sub":"a","ſub":"b"}"#,
            r#"{"org":{"id":"a","Id":"b"}}"#,
            r#"{"list":[{"x":1,"x":2}]}"#,
        ] {
            assert!(parse(payload.as_bytes()).is_err(), "{payload}");
        }
        assert!(parse(br#"[1,2]"#).is_err());
        assert!(parse(br#"{"sub":"a","org":{"sub":"b"}}"#).is_ok());
    }

    #[test]
    fn paths_reach_top_level_names_first_then_nested_objects() {
        let c = parse(
            br#"{"sub":"u1","org":{"id":"acme","n":7},"https://x.example/tier":"pro","org.id":"flat"}"#,
        )
        .unwrap();
        assert_eq!(c.text(&path("sub")), Ok(Some("u1".into())));
        assert_eq!(c.text(&path("org.n")), Ok(Some("7".into())));
        assert_eq!(c.text(&path("org.id")), Ok(Some("flat".into())));
        assert_eq!(
            c.text(&path("https://x.example/tier")),
            Ok(Some("pro".into()))
        );
        assert_eq!(c.text(&path("missing.x")), Ok(None));
        assert!(c.text(&path("org")).is_err());
        assert!(ClaimPath::parse("a..b").is_err());
        assert!(ClaimPath::parse("").is_err());
        assert!(ClaimPath::parse("has space").is_err());
    }

    #[test]
    fn long_or_odd_values_are_not_usable_as_text() {
        let long = format!(r#"{{"sub":"{}","f":1.5,"e":""}}"#, "x".repeat(300));
        let c = parse(long.as_bytes()).unwrap();
        assert!(c.text(&path("sub")).is_err());
        assert!(c.text(&path("f")).is_err());
        assert_eq!(c.text(&path("e")), Ok(None));
    }
}
