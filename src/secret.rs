//! Secrets (API keys, tokens, passwords, key paths): values that are never printed.

use serde::Deserialize;
use std::fmt;

/// A secret from the file: deserialized like a string, never printed (`Debug` shows
/// `<redacted>`), compared by value only to decide whether a reload changed it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
