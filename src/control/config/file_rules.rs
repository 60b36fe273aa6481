//! The route's rules about what it answers and how, as written in the TOML file: header
//! rules, CORS, and the answers of a route that answers itself.

use super::units::HumanDuration;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// `request_headers` / `response_headers`: `set` (replacing), `add` (appending), `remove`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRulesFile {
    pub set: Option<BTreeMap<String, String>>,
    pub add: Option<BTreeMap<String, String>>,
    pub remove: Option<Vec<String>>,
}

/// `cors`: the origins a browser may call a route from, and what it may send and read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsFile {
    pub origins: Vec<String>,
    pub methods: Option<Vec<String>>,
    pub headers: Option<Vec<String>>,
    pub expose: Option<Vec<String>>,
    pub credentials: Option<bool>,
    pub max_age: Option<HumanDuration>,
    /// What becomes of the upstream's own `Access-Control-*` headers: "replace" | "keep".
    pub upstream: Option<String>,
}

/// `redirect`: the target (`${path}` for the request's path), its status, the query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectFile {
    pub to: String,
    pub status: Option<u16>,
    pub keep_query: Option<bool>,
}

/// `respond`: a fixed answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondFile {
    pub status: u16,
    pub body: Option<String>,
    pub content_type: Option<String>,
}

/// A route's `cors`: a table, or `"off"` / `false` to opt out of `[server] cors`.
#[derive(Debug)]
pub enum CorsSetting {
    Off,
    Rules(CorsFile),
}

impl<'de> Deserialize<'de> for CorsSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CorsSetting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table like { origins = [\"https://app.example.com\"] }, or \"off\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CorsSetting, E> {
                match v {
                    "off" => Ok(CorsSetting::Off),
                    other => Err(E::custom(format_args!(
                        "invalid cors {other:?}: expected a table like {{ origins = [\"https://app.example.com\"] }}, or \"off\""
                    ))),
                }
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<CorsSetting, E> {
                match v {
                    false => Ok(CorsSetting::Off),
                    true => Err(E::custom(
                        "cors = true says nothing: give { origins = [\"https://app.example.com\"] }",
                    )),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CorsSetting, A::Error> {
                CorsFile::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(CorsSetting::Rules)
            }
        }
        deserializer.deserialize_any(V)
    }
}
