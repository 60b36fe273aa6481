//! The fields of a small request body that keyed limits read (a login form's `username`):
//! top-level string fields of `application/json`, or the pairs of
//! `application/x-www-form-urlencoded`. The body itself reaches the upstream unchanged; this
//! only reads a copy.
//!
//! A field given twice is *repeated*, not one of its values: frameworks disagree on which one
//! wins (first, last, a list), so a key read from either could count the wrong account.

use serde::de::{Deserializer, MapAccess, Visitor};
use std::fmt;

/// What a body says about one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    Absent,
    Value(&'a str),
    /// Given more than once.
    Repeated,
}

/// The fields of a body, in order: a string value, a value of another type (`None`), or
/// repeated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields {
    fields: Vec<(String, Seen)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Once(Option<String>),
    Repeated,
}

impl BodyFields {
    /// The fields of `body` sent as `content_type`; empty for any other type or a body that
    /// does not parse.
    pub fn parse(content_type: Option<&[u8]>, body: &[u8]) -> BodyFields {
        let Some(mime) = content_type.map(media_type) else {
            return BodyFields::default();
        };
        if mime == "application/x-www-form-urlencoded" {
            BodyFields::collect(url::form_urlencoded::parse(body).map(|(k, v)| (k, Some(v))))
        } else if mime == "application/json" || mime.ends_with("+json") {
            let mut de = serde_json::Deserializer::from_slice(body);
            de.deserialize_map(TopLevel)
                .ok()
                .map(|pairs| BodyFields::collect(pairs.into_iter()))
                .unwrap_or_default()
        } else {
            BodyFields::default()
        }
    }

    /// Fields from name/value pairs (tests and tools).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BodyFields {
        BodyFields::collect(pairs.into_iter().map(|(k, v)| (k, Some(v))))
    }

    fn collect<K: Into<String>, V: Into<String>>(
        pairs: impl Iterator<Item = (K, Option<V>)>,
    ) -> BodyFields {
        let mut fields: Vec<(String, Seen)> = Vec::new();
        for (k, v) in pairs {
            let k = k.into();
            match fields.iter_mut().find(|(name, _)| *name == k) {
                Some((_, seen)) => *seen = Seen::Repeated,
                None => fields.push((k, Seen::Once(v.map(Into::into)))),
            }
        }
        BodyFields { fields }
    }

    pub fn field(&self, name: &str) -> Field<'_> {
        match self.fields.iter().find(|(k, _)| k == name) {
            Some((_, Seen::Once(Some(v)))) => Field::Value(v),
            Some((_, Seen::Repeated)) => Field::Repeated,
            _ => Field::Absent,
        }
    }
}

/// `Application/JSON; charset=utf-8` → `application/json`.
fn media_type(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    text.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A JSON object's top-level entries, strings kept, other values as `None`, duplicates kept
/// (serde_json's own maps would keep only the last).
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = Vec<(String, Option<String>)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
            let v = match v {
                serde_json::Value::String(s) => Some(s),
                _ => None,
            };
            out.push((k, v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_form_bodies_give_their_string_fields() {
        let json = BodyFields::parse(
            Some(b"Application/JSON; charset=utf-8"),
            br#"{"username": "ada", "password": "x", "remember": true, "nested": {"username": "eve"}}"#,
        );
        assert_eq!(json.field("username"), Field::Value("ada"));
        assert_eq!(json.field("remember"), Field::Absent, "not a string");
        assert_eq!(json.field("missing"), Field::Absent);
        let form = BodyFields::parse(
            Some(b"application/x-www-form-urlencoded"),
            b"username=ada%40example.com&password=x+y",
        );
        assert_eq!(form.field("username"), Field::Value("ada@example.com"));
        assert_eq!(form.field("password"), Field::Value("x y"));
        let problem = BodyFields::parse(Some(b"application/problem+json"), br#"{"username":"a"}"#);
        assert_eq!(problem.field("username"), Field::Value("a"));
    }

    #[test]
    fn repeated_fields_and_unreadable_bodies_are_not_values() {
        let form = BodyFields::parse(
            Some(b"application/x-www-form-urlencoded"),
            b"username=victim&username=other",
        );
        assert_eq!(form.field("username"), Field::Repeated);
        let json = BodyFields::parse(
            Some(b"application/json"),
            br#"{"username": "victim", "username": "other"}"#,
        );
        assert_eq!(json.field("username"), Field::Repeated);
        for (ct, body) in [
            (Some(&b"application/json"[..]), &b"{not json"[..]),
            (Some(b"application/json"), b"[\"username\"]"),
            (Some(b"text/plain"), b"username=ada"),
            (None, b"username=ada"),
        ] {
            assert_eq!(BodyFields::parse(ct, body).field("username"), Field::Absent);
        }
    }
}
