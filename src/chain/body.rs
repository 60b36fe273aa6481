//! The fields of a small request body that keyed limits read (a login form's `username`):
//! top-level string fields of `application/json`, or the pairs of
//! `application/x-www-form-urlencoded`. The body itself reaches the upstream unchanged; this
//! only reads a copy.
//!
//! **One reading or none.** A key read from a field is only sound if the upstream reads the
//! same field, so whatever common frameworks could read another way makes the field
//! *ambiguous* (the request is refused) instead of giving a value:
//!
//! - the field given twice: frameworks disagree on which one wins (first, last, a list);
//! - another name that folds to the field's (`USERNAME`, `uſername`, `user.name` for
//!   `user_name`): Go's `encoding/json` and ASP.NET match JSON keys ignoring case and take
//!   the last match, ASP.NET's form binding ignores case, PHP renames `.` and ` ` to `_`;
//! - a name hidden behind `;` (`a=1;username=x`): older Python parsers split on `;` too;
//! - more than one `Content-Type`, a list of media types in one, or a charset other than
//!   UTF-8: the upstream may parse the body as another type or decode it otherwise;
//! - a body declared JSON that is not valid JSON (lenient parsers read a prefix), or a form
//!   body that is also a JSON object (Go handlers decode JSON whatever the type says);
//! - a multipart body, whose fields Django, Flask and Spring read but this reader does not.
//!
//! A body of another type (or none) that is a JSON object is read as JSON, as a handler that
//! ignores the type would read it. The query string is checked too ([`query_names`]): Servlet's
//! `getParameter` (Spring Security's form login) and Flask's `request.values` read it first.

use crate::chain::fold;
use serde::de::{Deserializer, MapAccess, Visitor};
use std::fmt;

/// What a body says about one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field<'a> {
    Absent,
    Value(&'a str),
    /// A JSON number that is a whole number (keys never read these: only a reservation).
    Whole(u64),
    /// Another JSON value (a fraction, a negative number, `true`, an object...).
    Other,
    /// Given more than once.
    Repeated,
    /// Common frameworks could read the field otherwise: why.
    Ambiguous(String),
}

/// The fields of a body, in order: a string value, a whole number, a value of another type,
/// or repeated; with each name's folded form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields {
    fields: Vec<Named>,
    /// Folded names a reading splitting on `;` reads otherwise: hidden behind one, or whose
    /// value one would cut.
    split: Vec<String>,
    /// Why the body has no single reading, if it has none.
    unreadable: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    name: String,
    folded: String,
    seen: Seen,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Once(Scalar),
    Repeated,
}

/// A field's value as read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scalar {
    Text(String),
    /// A JSON number without fraction or exponent, from 0 to `u64::MAX`.
    Whole(u64),
    /// Anything else (a negative or fractional number, an object, `null`...).
    Other,
}

impl BodyFields {
    /// The fields of `body`, sent with these `Content-Type` values (every one the request
    /// has). Empty for a body of a type that has no fields; unreadable (every field
    /// ambiguous) where the body has no single reading.
    pub fn parse(content_types: &[&[u8]], body: &[u8]) -> BodyFields {
        let content_type = match content_types {
            [] => None,
            [one] => Some(*one),
            _ => return BodyFields::unreadable("the request has more than one Content-Type"),
        };
        let media = match content_type.map(MediaType::parse).transpose() {
            Ok(media) => media,
            Err(why) => return BodyFields::unreadable(why),
        };
        let essence = media.as_ref().map_or("", |m| m.essence.as_str());
        if essence == "application/x-www-form-urlencoded" {
            if json_object(body).is_some() {
                return BodyFields::unreadable(
                    "a form body that is also a JSON object (some handlers decode JSON whatever \
                     the Content-Type says)",
                );
            }
            return BodyFields::form(body);
        }
        if essence == "application/json" || essence.ends_with("+json") {
            return match json_object(body) {
                Some(Ok(pairs)) => BodyFields::collect(pairs.into_iter(), Vec::new()),
                None if body.trim_ascii().is_empty() || is_json_value(body) => {
                    BodyFields::default()
                }
                _ => BodyFields::unreadable("the body is not valid JSON"),
            };
        }
        if essence.starts_with("multipart/") {
            return BodyFields::unreadable(
                "a multipart body (its fields are not read here; send JSON or a form)",
            );
        }
        // Another type, or none: read as a handler that decodes JSON regardless would.
        match json_object(body) {
            Some(Ok(pairs)) => BodyFields::collect(pairs.into_iter(), Vec::new()),
            _ => BodyFields::default(),
        }
    }

    /// Fields from name/value pairs (tests and tools).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BodyFields {
        BodyFields::collect(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), Scalar::Text(v.to_owned()))),
            Vec::new(),
        )
    }

    fn unreadable(why: &'static str) -> BodyFields {
        BodyFields {
            unreadable: Some(why),
            ..BodyFields::default()
        }
    }

    fn form(body: &[u8]) -> BodyFields {
        let pairs = url::form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), Scalar::Text(v.into_owned())));
        BodyFields::collect(pairs, split_names(body))
    }

    fn collect(pairs: impl Iterator<Item = (String, Scalar)>, split: Vec<String>) -> Self {
        let mut fields: Vec<Named> = Vec::new();
        for (name, value) in pairs {
            match fields.iter_mut().find(|e| e.name == name) {
                Some(entry) => entry.seen = Seen::Repeated,
                None => fields.push(Named {
                    folded: fold::name(&name),
                    name,
                    seen: Seen::Once(value),
                }),
            }
        }
        BodyFields {
            fields,
            split,
            unreadable: None,
        }
    }

    /// The field `name`, whose folded form ([`fold::name`]) is `folded`.
    pub fn field(&self, name: &str, folded: &str) -> Field<'_> {
        if let Some(why) = self.unreadable {
            return Field::Ambiguous(why.to_owned());
        }
        let mut found = Field::Absent;
        for entry in &self.fields {
            if entry.name == name {
                found = match &entry.seen {
                    Seen::Once(Scalar::Text(v)) => Field::Value(v),
                    Seen::Once(Scalar::Whole(n)) => Field::Whole(*n),
                    Seen::Once(Scalar::Other) => Field::Other,
                    Seen::Repeated => Field::Repeated,
                };
            } else if entry.folded == folded {
                return Field::Ambiguous(format!(
                    "the body has another field that some frameworks read as {name:?}"
                ));
            }
        }
        if self.split.iter().any(|h| h == folded) {
            return Field::Ambiguous(format!(
                "a ';' in the body could cut or hide the field {name:?} (some parsers split on it)"
            ));
        }
        found
    }
}

/// The folded names of a query string or form, split on `&` and `;` alike (the strictest of
/// the readings), percent-decoded.
pub fn query_names(query: &[u8]) -> impl Iterator<Item = String> + '_ {
    query
        .split(|b| *b == b'&' || *b == b';')
        .filter(|piece| !piece.is_empty())
        .filter_map(|piece| url::form_urlencoded::parse(piece).next())
        .map(|(name, _)| fold::name(&name))
}

/// The names of every `&`-separated pair of a form holding a raw `;`: a reader splitting on
/// it too cuts that pair's value and finds the names behind it.
fn split_names(body: &[u8]) -> Vec<String> {
    if !body.contains(&b';') {
        return Vec::new();
    }
    body.split(|b| *b == b'&')
        .filter(|pair| pair.contains(&b';'))
        .flat_map(|pair| query_names(pair).collect::<Vec<_>>())
        .collect()
}

/// A `Content-Type` value: its essence (`type/subtype`, lower case) once the charset, if
/// any, is UTF-8.
struct MediaType {
    essence: String,
}

impl MediaType {
    fn parse(value: &[u8]) -> Result<MediaType, &'static str> {
        let text = std::str::from_utf8(value).map_err(|_| "a Content-Type that is not text")?;
        if text.contains(',') {
            return Err("a list of media types in Content-Type");
        }
        let mut parts = text.split(';');
        let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        for param in parts {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            if key.trim().eq_ignore_ascii_case("charset") {
                let charset = value.trim().trim_matches('"');
                if !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("utf8") {
                    return Err("a charset other than UTF-8 (the upstream would decode otherwise)");
                }
            }
        }
        Ok(MediaType { essence })
    }
}

/// The top-level entries of `body` if it is a JSON object (`Some(Err)`: it starts like one
/// but is not valid JSON); `None` when it does not start with `{`.
#[allow(clippy::type_complexity)]
fn json_object(body: &[u8]) -> Option<Result<Vec<(String, Scalar)>, ()>> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let pairs = de.deserialize_map(TopLevel).map_err(|_| ());
    Some(pairs.and_then(|p| de.end().map(|()| p).map_err(|_| ())))
}

/// Whether `body` is one valid JSON value (an array, a string...: no fields, but readable).
fn is_json_value(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// A JSON object's top-level entries, strings and whole numbers kept, other values as
/// `Scalar::Other`, duplicates kept (serde_json's own maps would keep only the last).
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = Vec<(String, Scalar)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
            let v = match v {
                serde_json::Value::String(s) => Scalar::Text(s),
                serde_json::Value::Number(n) => n.as_u64().map_or(Scalar::Other, Scalar::Whole),
                _ => Scalar::Other,
            };
            out.push((k, v));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &[u8] = b"application/json";
    const FORM: &[u8] = b"application/x-www-form-urlencoded";

    /// How `username` reads: `value:…`, `absent`, `repeated` or `ambiguous`.
    fn username(content_types: &[&[u8]], body: &[u8]) -> String {
        read(&BodyFields::parse(content_types, body), "username")
    }

    fn read(fields: &BodyFields, name: &str) -> String {
        match fields.field(name, &fold::name(name)) {
            Field::Value(v) => format!("value:{v}"),
            Field::Whole(n) => format!("whole:{n}"),
            Field::Other => "other".into(),
            Field::Absent => "absent".into(),
            Field::Repeated => "repeated".into(),
            Field::Ambiguous(_) => "ambiguous".into(),
        }
    }

    #[test]
    fn json_and_form_bodies_give_their_string_fields() {
        let json = br#"{"username": "ada", "password": "x", "remember": true, "nested": {"username": "eve"}}"#;
        let fields = BodyFields::parse(&[b"Application/JSON; charset=utf-8"], json);
        assert_eq!(read(&fields, "username"), "value:ada");
        assert_eq!(read(&fields, "remember"), "other", "not a string");
        assert_eq!(read(&fields, "missing"), "absent");
        // Whole numbers are kept as numbers (a reservation reads them; keys do not).
        let numbers =
            br#"{"max_tokens": 4096, "t": 0.5, "n": -1, "e": 1e3, "big": 18446744073709551616}"#;
        let fields = BodyFields::parse(&[JSON], numbers);
        assert_eq!(read(&fields, "max_tokens"), "whole:4096");
        for other in ["t", "n", "e", "big"] {
            assert_eq!(read(&fields, other), "other", "{other}");
        }
        let form = BodyFields::parse(&[FORM], b"username=ada%40example.com&password=x+y");
        assert_eq!(read(&form, "username"), "value:ada@example.com");
        assert_eq!(read(&form, "password"), "value:x y");
        assert_eq!(
            username(&[b"application/problem+json"], br#"{"username":"a"}"#),
            "value:a"
        );
    }

    #[test]
    fn repeated_fields_and_bodies_without_fields_are_not_values() {
        assert_eq!(
            username(&[FORM], b"username=victim&username=other"),
            "repeated"
        );
        assert_eq!(
            username(&[JSON], br#"{"username": "victim", "username": "other"}"#),
            "repeated"
        );
        for (ct, body) in [
            (&[JSON][..], &b"[\"username\"]"[..]),
            (&[JSON], b"\"text\""),
            (&[b"text/plain"], b"username=ada"),
            (&[], b"username=ada"),
            (&[FORM], b""),
        ] {
            assert_eq!(username(ct, body), "absent", "{body:?}");
        }
    }

    #[test]
    fn names_that_frameworks_fold_together_make_the_field_ambiguous() {
        for body in [
            &br#"{"username":"decoy7","USERNAME":"victim"}"#[..],
            br#"{"USERNAME":"victim"}"#,
            "{\"u\u{17f}ername\":\"victim\",\"username\":\"decoy\"}".as_bytes(),
            "{\"ｕｓｅｒｎａｍｅ\":\"victim\"}".as_bytes(),
        ] {
            assert_eq!(username(&[JSON], body), "ambiguous", "{body:?}");
        }
        assert_eq!(
            username(&[FORM], b"username=decoy&UserName=victim"),
            "ambiguous"
        );
        let fields = BodyFields::parse(&[FORM], b"user.name=victim&user_name=decoy");
        assert_eq!(read(&fields, "user_name"), "ambiguous", "PHP");
        // Unrelated names are fine.
        assert_eq!(
            username(&[JSON], br#"{"username":"ada","username2":"x"}"#),
            "value:ada"
        );
    }

    #[test]
    fn bodies_with_two_readings_are_ambiguous() {
        let both = br#"{"username":"decoy","a":"&username=victim&b="}"#;
        for (ct, body) in [
            (&[JSON, FORM][..], &both[..]),
            (
                &[b"application/json, application/x-www-form-urlencoded"],
                both,
            ),
            (
                &[b"application/json; charset=utf-16"],
                br#"{"username":"a"}"#,
            ),
            (
                &[b"application/x-www-form-urlencoded; charset=\"iso-8859-1\""],
                b"username=a",
            ),
            (&[FORM], both),
            (&[JSON], br#"{"username":"victim"} trailing"#),
            (&[JSON], br#"{"username":"victim""#),
            (&[JSON], b"\xef\xbb\xbf{\"username\":\"a\"}"),
            (&[b"multipart/form-data; boundary=x"], b"--x\r\n"),
            (&[FORM], b"username=decoy;username=victim"),
            (&[FORM], b"a=1;USERNAME=victim&username=decoy"),
            (&[FORM], b"username=victim;x"),
        ] {
            assert_eq!(username(ct, body), "ambiguous", "{ct:?} {body:?}");
        }
        assert_eq!(
            username(
                &[b"application/json; charset=\"UTF-8\""],
                br#"{"username":"a"}"#
            ),
            "value:a"
        );
    }

    #[test]
    fn a_json_object_of_another_type_is_read_as_json() {
        let body = br#"{"username":"victim"}"#;
        assert_eq!(username(&[b"text/plain"], body), "value:victim");
        assert_eq!(username(&[], body), "value:victim");
        assert_eq!(username(&[b"text/plain"], b"{not json"), "absent");
    }

    #[test]
    fn query_names_split_on_both_separators_and_fold() {
        let names: Vec<String> = query_names(b"a=1&USER%4EAME=x;user.name=y&&b").collect();
        assert_eq!(names, ["a", "username", "user_name", "b"]);
    }
}
