//! Configuration: one TOML file, read into the serde mirror ([`file`]), then converted and
//! validated ([`validate`], one file per TOML table) into the typed [`Config`] ([`model`]).
//! Nothing downstream of this module sees a string that encodes a choice; every error names
//! the TOML path it is about ([`error`]).

pub mod defaults;
pub mod error;
pub mod file;
mod file_auth;
mod file_rules;
mod file_store;
mod file_upstream;
mod load;
mod locate;
pub mod model;
#[cfg(test)]
mod reference;
pub mod restart;
pub mod units;
mod validate;
pub mod view;

pub use error::{ConfigError, Problem};
pub use model::*;
pub use validate::MAX_NAME_LEN;
