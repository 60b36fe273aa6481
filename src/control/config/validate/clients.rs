//! `[[clients]]`: ids, plans, API keys.

use super::checks::*;
use crate::chain::auth::KeyDigest;
use crate::control::config::file::ClientFile;
use crate::control::config::model::{ClientConfig, PlanConfig};
use std::collections::BTreeMap;

/// Shortest plaintext key accepted: anything shorter can be guessed.
pub const MIN_PLAINTEXT_KEY_LEN: usize = 16;

pub(super) fn clients_config(
    clients: Vec<ClientFile>,
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) -> Vec<ClientConfig> {
    let mut out: Vec<ClientConfig> = Vec::with_capacity(clients.len());
    for (i, client) in clients.into_iter().enumerate() {
        let ClientFile { id, plan, api_keys } = client;
        let base = format!("clients[{i}]");
        check_name(&format!("{base}.id"), &id, problems);
        if let Some(j) = out.iter().position(|c| c.id == id) {
            problems.push(
                format!("{base}.id"),
                format!("{id:?} is already the id of clients[{j}]"),
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
        if api_keys.is_empty() {
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
                .map(|j| format!("clients[{j}] ({:?})", out[j].id))
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
        });
    }
    out
}
