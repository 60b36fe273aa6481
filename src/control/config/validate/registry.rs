//! `[registry]`: clients managed at runtime — in Redis with a Redis store, in
//! `server.clients_file` with the memory store.

use super::checks::*;
use crate::control::config::file::RegistryFile;
use crate::control::config::model::StoreConfig;
use crate::registry::state::RegistrySettings;
use std::time::Duration;

pub(super) fn registry_config(
    file: RegistryFile,
    store: &StoreConfig,
    clients_file: Option<&str>,
    problems: &mut Problems,
) -> RegistrySettings {
    let RegistryFile {
        poll,
        resync,
        timeout,
        key_prefix,
        max_clients,
        max_keys_per_client,
    } = file;
    if matches!(store, StoreConfig::Memory) && clients_file.is_none() {
        problems.push(
            "registry",
            "with the memory store, runtime clients are written to server.clients_file: set it (an absolute path)",
        );
    }
    let key_prefix = key_prefix.unwrap_or_else(|| "tsk_".to_owned());
    let ok_prefix = key_prefix.len() <= 16
        && key_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !ok_prefix {
        problems.push("registry.key_prefix", "at most 16 of A-Z a-z 0-9 _ - .");
    }
    RegistrySettings {
        poll: positive(
            "registry.poll".into(),
            poll,
            Duration::from_secs(1),
            problems,
        ),
        resync: positive(
            "registry.resync".into(),
            resync,
            Duration::from_secs(60),
            problems,
        ),
        timeout: positive(
            "registry.timeout".into(),
            timeout,
            Duration::from_secs(2),
            problems,
        ),
        key_prefix,
        max_clients: at_least_one("registry.max_clients", max_clients, 100_000, problems),
        max_keys: at_least_one(
            "registry.max_keys_per_client",
            max_keys_per_client,
            10,
            problems,
        ),
    }
}
