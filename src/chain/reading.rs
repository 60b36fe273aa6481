//! How a request's values are read for keys and reservations — one way, or refused where the
//! upstream could read them otherwise (`chain::partition` has the rules): what is read from
//! ([`KeyInputs`]), a header's one value, a body field's, and whole numbers.

use crate::chain::body::{query_names, BodyFields, Field};
use crate::chain::cert::PeerCert;
use crate::chain::fold;
use crate::chain::jwt::claims::ClaimPath;
use http::HeaderMap;
use std::sync::Arc;

/// A body field a key reads: its name, and the name folded (`chain::fold::name`) to find the
/// names frameworks would read as this one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyField {
    pub name: Arc<str>,
    folded: Arc<str>,
}

impl BodyField {
    pub fn new(name: &str) -> BodyField {
        BodyField {
            name: name.into(),
            folded: fold::name(name).into(),
        }
    }
}

/// The claims of a request's verified token, as text (`chain::jwt` keeps them).
pub trait TokenClaims {
    fn claim(&self, path: &ClaimPath) -> Option<&str>;
}

/// The request values key parts are read from.
pub struct KeyInputs<'a> {
    /// The grouped client address (`identity::group_key`), if an IP connection.
    pub ip: Option<u128>,
    /// The client address itself (after trusted proxies), for exemptions by address.
    pub addr: Option<std::net::IpAddr>,
    pub client: Option<&'a str>,
    pub route: &'a str,
    pub headers: &'a HeaderMap,
    /// The request target's query string, if any (as sent).
    pub query: Option<&'a str>,
    /// The body's fields, when the route reads them and the body could be read.
    pub body: Option<&'a BodyFields>,
    /// The verified token's claims, when the request was authenticated by one.
    pub token: Option<&'a (dyn TokenClaims + Sync)>,
    /// The connection's verified client certificate, if any.
    pub cert: Option<&'a PeerCert>,
}

/// Why a key could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartError {
    /// The request lacks this part (no such header, field, or readable body; no client).
    Missing(String),
    /// A part the upstream could read otherwise (a header given twice, a field named twice):
    /// which one counts would be the client's choice.
    Ambiguous(String),
}

/// The folded value of header `name` (see [`header_value`]).
pub(crate) fn header(headers: &HeaderMap, name: &http::HeaderName) -> Result<Vec<u8>, PartError> {
    let first = header_value(headers, name)?;
    fold::value(first.as_bytes())
        .map(String::into_bytes)
        .ok_or_else(|| PartError::Missing(format!("the {name} header")))
}

/// The one value of header `name`, unless the upstream could read another: given twice,
/// spelled with `_` too, or holding a list.
pub(crate) fn header_value<'h>(
    headers: &'h HeaderMap,
    name: &http::HeaderName,
) -> Result<&'h http::HeaderValue, PartError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(PartError::Ambiguous(format!(
            "the {name} header is given more than once"
        )));
    }
    if has_underscore_alias(headers, name) {
        return Err(PartError::Ambiguous(format!(
            "the request has a header that CGI-style servers read as {name} (\"_\" for \"-\")"
        )));
    }
    let first = first.ok_or_else(|| PartError::Missing(format!("the {name} header")))?;
    if first.as_bytes().contains(&b',') {
        return Err(PartError::Ambiguous(format!(
            "the {name} header holds a list (a comma), which frameworks split and pick from differently"
        )));
    }
    Ok(first)
}

/// Whether another header name reads as `name` once `_` is taken for `-`.
fn has_underscore_alias(headers: &HeaderMap, name: &http::HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    headers.keys().any(|other| {
        let other = other.as_str().as_bytes();
        other.len() == name.len()
            && other != name
            && other
                .iter()
                .zip(name)
                .all(|(a, b)| a == b || (*a == b'_' && *b == b'-'))
    })
}

/// The folded value of body field `field` (see [`body_value`]); keys read strings only.
pub(crate) fn body_field(inputs: &KeyInputs<'_>, field: &BodyField) -> Result<Vec<u8>, PartError> {
    let missing = || PartError::Missing(format!("the body field {:?}", field.name));
    match body_value(inputs, field)? {
        Field::Value(v) => fold::value(v.as_bytes())
            .map(String::into_bytes)
            .ok_or_else(missing),
        _ => Err(missing()),
    }
}

/// The body field `field` as read, unless the upstream could read it otherwise: named in the
/// query too, given twice, or ambiguous in the body (`chain::body`).
pub(crate) fn body_value<'b>(
    inputs: &KeyInputs<'b>,
    field: &BodyField,
) -> Result<Field<'b>, PartError> {
    let name = &field.name;
    if let Some(query) = inputs.query {
        if query_names(query.as_bytes()).any(|n| *n == *field.folded) {
            return Err(PartError::Ambiguous(format!(
                "the query string names the body field {name:?} too (some frameworks read the \
                 query first)"
            )));
        }
    }
    match inputs
        .body
        .map_or(Field::Absent, |b| b.field(name, &field.folded))
    {
        Field::Repeated => Err(PartError::Ambiguous(format!(
            "the body field {name:?} is given more than once"
        ))),
        Field::Ambiguous(why) => Err(PartError::Ambiguous(why)),
        read => Ok(read),
    }
}

/// ASCII digits as a number (saturating); `None` for anything else, or nothing.
pub(crate) fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        text.iter()
            .try_fold(0u64, |n, d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
            .unwrap_or(u64::MAX),
    )
}
