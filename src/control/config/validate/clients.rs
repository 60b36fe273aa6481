//! `[[clients]]`: ids, plans, API keys.

use super::checks::*;
use crate::chain::auth::KeyDigest;
use crate::control::config::file::ClientFile;
use crate::control::config::model::{ClientConfig, PlanConfig};
use std::collections::BTreeMap;

/// Shortest plaintext key accepted: anything shorter can be guessed.
pub const MIN_PLAINTEXT_KEY_LEN: usize = 16;

/// `clients` are (TOML path, entry): the main file's `clients[i]`, then `clients_file`'s.
pub(super) fn clients_config(
    clients: Vec<(String, ClientFile)>,
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) -> Vec<ClientConfig> {
    let mut out: Vec<ClientConfig> = Vec::with_capacity(clients.len());
    let mut bases: Vec<String> = Vec::with_capacity(clients.len());
    for (base, client) in clients {
        let ClientFile {
            id,
            plan,
            api_keys,
            metadata,
            groups,
        } = client;
        let groups = groups.unwrap_or_default();
        if let Some(problem) = crate::registry::model::groups_problem(&groups) {
            problems.push(format!("{base}.groups"), problem);
        }
        let in_clients_file = base.starts_with("clients_file(");
        let metadata = metadata.unwrap_or_default();
        if metadata.len() > crate::registry::model::MAX_METADATA
            || metadata.iter().any(|(k, v)| {
                k.is_empty()
                    || k.len() > crate::registry::model::MAX_METADATA_TEXT
                    || v.len() > crate::registry::model::MAX_METADATA_TEXT
            })
        {
            problems.push(
                format!("{base}.metadata"),
                "at most 32 entries, names of 1 to 256 bytes, values of at most 256",
            );
        }
        check_name(&format!("{base}.id"), &id, problems);
        if let Some(j) = out.iter().position(|c| c.id == id) {
            problems.push(
                format!("{base}.id"),
                format!("{id:?} is already the id of {}", bases[j]),
            );
        }
        if !plans.contains_key(&plan) {
            let known: Vec<&str> = plans.keys().map(String::as_str).collect();
            problems.push(
                format!("{base}.plan"),
                format!(
                    "unknown plan {plan:?}: define [plans.{plan}] or use one of [{}]",
                    known.join(", ")
                ),
            );
        }
        // A client of the clients file may have none yet (the admin API creates clients
        // before it issues their keys); one in the main file without keys is a mistake.
        if api_keys.is_empty() && !in_clients_file {
            problems.push(
                format!("{base}.api_keys"),
                "a client needs at least one key",
            );
        }
        let mut digests = Vec::with_capacity(api_keys.len());
        for (k, key) in api_keys.iter().enumerate() {
            let path = format!("{base}.api_keys[{k}]");
            let Some(key) = secret(&path, key, problems) else {
                continue;
            };
            let key = key.expose();
            // Never echo a key (or what looks like one) in an error message.
            let digest = if let Some(hex) = key.strip_prefix("sha256:") {
                KeyDigest::from_hex(hex).or_else(|| {
                    problems.push(
                        path.clone(),
                        "expected \"sha256:\" followed by 64 hex digits",
                    );
                    None
                })
            } else if key.len() < MIN_PLAINTEXT_KEY_LEN
                || key.len() > crate::chain::auth::MAX_KEY_LEN
                || !key.bytes().all(|b| (0x21..=0x7e).contains(&b))
            {
                problems.push(
                    path.clone(),
                    format!(
                        "a plaintext key must be {MIN_PLAINTEXT_KEY_LEN} to {} visible ASCII characters (or write \"sha256:<hex>\")",
                        crate::chain::auth::MAX_KEY_LEN
                    ),
                );
                None
            } else {
                Some(KeyDigest::of(key.as_bytes()))
            };
            let Some(digest) = digest else { continue };
            let owner = out
                .iter()
                .position(|c| c.api_keys.contains(&digest))
                .map(|j| format!("{} ({:?})", bases[j], out[j].id))
                .or_else(|| digests.contains(&digest).then(|| "this client".to_owned()));
            match owner {
                Some(owner) => {
                    problems.push(path, format!("the same key is already given to {owner}"))
                }
                None => digests.push(digest),
            }
        }
        out.push(ClientConfig {
            id,
            plan,
            api_keys: digests,
            metadata,
            groups,
            in_clients_file,
        });
        bases.push(base);
    }
    out
}

/// The entries of `clients_file` (an absolute path), with their TOML paths. With
/// `missing_is_empty` (a `[registry]` with the memory store: the admin API writes the file)
/// a file not there yet has no clients.
pub(super) fn clients_from_file(
    path: Option<String>,
    missing_is_empty: bool,
    problems: &mut Problems,
) -> Vec<(String, ClientFile)> {
    let Some(path) = path else {
        return Vec::new();
    };
    if !std::path::Path::new(&path).is_absolute() {
        problems.push(
            "server.clients_file",
            format!("{path:?}: expected an absolute path"),
        );
        return Vec::new();
    }
    problems.files.push(path.clone().into());
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if missing_is_empty && e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            problems.push(
                "server.clients_file",
                format!("cannot read {path}: {}", e.kind()),
            );
            return Vec::new();
        }
    };
    let de = match toml::de::Deserializer::parse(&text) {
        Ok(de) => de,
        Err(e) => {
            problems.push(
                "server.clients_file",
                format!("{path}: {}", e.message().trim()),
            );
            return Vec::new();
        }
    };
    match serde_path_to_error::deserialize::<_, crate::control::config::file::ClientsFile>(de) {
        Ok(file) => file
            .clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| (format!("clients_file({path}).clients[{i}]"), c))
            .collect(),
        Err(e) => {
            // A key quoted in a parse error must not reach the output: only the path.
            problems.push(
                format!("clients_file({path}).{}", e.path()),
                "invalid entry (check the field names and types)",
            );
            Vec::new()
        }
    }
}
