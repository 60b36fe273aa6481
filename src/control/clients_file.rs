//! The admin API's changes with the memory store: `server.clients_file` is the registry. A
//! change is written whole to a temporary file next to it, synced, renamed over it (a reader
//! never sees half a file), and the configuration is reloaded; if the reload refuses the
//! result, the previous file is put back. Only digests of keys are written. Clients of the
//! main configuration file are not the API's to change.

use crate::control::config::ClientConfig;
use crate::control::reload::{ReloadError, Reloader};
use crate::control::snapshot::Snapshot;
use crate::registry::model::{digest_hex, id_problem, new_key};
use crate::registry::write::{Issued, Put, RegistryError};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Most keys a client of the clients file gets through the API.
const MAX_KEYS: usize = 10;

/// One change at a time.
#[derive(Default)]
pub struct FileClients {
    writing: tokio::sync::Mutex<()>,
}

impl FileClients {
    pub async fn put(
        &self,
        snapshot: &Snapshot,
        reloader: &Reloader,
        id: &str,
        plan: &str,
        (metadata, groups): (BTreeMap<String, String>, Vec<String>),
    ) -> Result<Put, RegistryError> {
        if !snapshot.config.plans.contains_key(plan) {
            return Err(RegistryError::Invalid(format!("no plan {plan:?}")));
        }
        let mut outcome = Put::Created;
        self.change(snapshot, reloader, id, |clients| {
            match clients.iter_mut().find(|c| c.id == id) {
                Some(c) if c.plan == plan && c.metadata == metadata && c.groups == groups => {
                    outcome = Put::Unchanged
                }
                Some(c) => {
                    c.plan = plan.to_owned();
                    c.metadata = metadata.clone();
                    c.groups = groups.clone();
                    outcome = Put::Updated;
                }
                None => clients.push(ClientConfig {
                    id: id.to_owned(),
                    plan: plan.to_owned(),
                    api_keys: Vec::new(),
                    metadata: metadata.clone(),
                    groups: groups.clone(),
                    in_clients_file: true,
                }),
            }
            Ok(())
        })
        .await?;
        Ok(outcome)
    }

    pub async fn delete(
        &self,
        snapshot: &Snapshot,
        reloader: &Reloader,
        id: &str,
    ) -> Result<(), RegistryError> {
        self.change(snapshot, reloader, id, |clients| {
            let before = clients.len();
            clients.retain(|c| c.id != id);
            if clients.len() == before {
                Err(RegistryError::NotFound)
            } else {
                Ok(())
            }
        })
        .await
    }

    pub async fn issue_key(
        &self,
        snapshot: &Snapshot,
        reloader: &Reloader,
        id: &str,
    ) -> Result<Issued, RegistryError> {
        let prefix = snapshot
            .config
            .registry
            .as_ref()
            .map_or("tsk_", |r| r.key_prefix.as_str());
        let key = new_key(prefix).map_err(RegistryError::Store)?;
        let hex = digest_hex(&key);
        let digest = crate::chain::auth::KeyDigest::from_hex(&hex).expect("a digest");
        self.change(snapshot, reloader, id, |clients| {
            let c = clients
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or(RegistryError::NotFound)?;
            if c.api_keys.len() >= MAX_KEYS {
                return Err(RegistryError::Invalid(format!(
                    "the client has {MAX_KEYS} keys already: revoke one first"
                )));
            }
            c.api_keys.push(digest);
            Ok(())
        })
        .await?;
        Ok(Issued {
            key,
            key_id: hex[..12].to_owned(),
        })
    }

    pub async fn revoke_key(
        &self,
        snapshot: &Snapshot,
        reloader: &Reloader,
        id: &str,
        key_id: &str,
    ) -> Result<(), RegistryError> {
        self.change(snapshot, reloader, id, |clients| {
            let c = clients
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or(RegistryError::NotFound)?;
            let before = c.api_keys.len();
            c.api_keys
                .retain(|d| !d.hex().starts_with(key_id) || key_id.len() < 12);
            if c.api_keys.len() == before {
                return Err(RegistryError::NotFound);
            }
            Ok(())
        })
        .await
    }

    /// The clients file's clients changed by `f`, written and reloaded.
    async fn change(
        &self,
        snapshot: &Snapshot,
        reloader: &Reloader,
        id: &str,
        f: impl FnOnce(&mut Vec<ClientConfig>) -> Result<(), RegistryError>,
    ) -> Result<(), RegistryError> {
        if let Some(why) = id_problem(id) {
            return Err(RegistryError::Invalid(why));
        }
        let Some(path) = snapshot.config.clients_file.clone() else {
            return Err(RegistryError::Invalid(
                "no [registry] and server.clients_file: clients are managed in the configuration file".into(),
            ));
        };
        if snapshot.config.registry.is_none() {
            return Err(RegistryError::Invalid(
                "runtime clients need a [registry] table".into(),
            ));
        }
        let _writing = self.writing.lock().await;
        // The latest configuration, not the request's (a change just before this one).
        let current = reloader.snapshot();
        let config = &current.config;
        if config
            .clients
            .iter()
            .any(|c| c.id == id && !c.in_clients_file)
        {
            return Err(RegistryError::FileManaged);
        }
        let mut clients: Vec<ClientConfig> = config
            .clients
            .iter()
            .filter(|c| c.in_clients_file)
            .cloned()
            .collect();
        f(&mut clients)?;
        let before = std::fs::read(&path).ok();
        write_atomically(&path, render(&clients).as_bytes())
            .map_err(|e| RegistryError::Store(format!("{}: {e}", path.display())))?;
        match reloader.reload("admin API").await {
            Ok(_) => Ok(()),
            Err(e) => {
                if let Some(before) = before {
                    let _ = write_atomically(&path, &before);
                }
                Err(match e {
                    ReloadError::Busy => RegistryError::Busy,
                    ReloadError::Config(e) => RegistryError::Invalid(e.to_string()),
                })
            }
        }
    }
}

/// The clients file for `clients`: digests only.
fn render(clients: &[ClientConfig]) -> String {
    let mut out = String::from(
        "# Written by turnstile's admin API (PUT /clients/…): edits here are kept, but the next\n# change through the API rewrites the file.\n",
    );
    for c in clients {
        out.push_str("\n[[clients]]\n");
        out.push_str(&format!("id = {}\n", toml_string(&c.id)));
        out.push_str(&format!("plan = {}\n", toml_string(&c.plan)));
        let keys: Vec<String> = c
            .api_keys
            .iter()
            .map(|d| toml_string(&format!("sha256:{}", d.hex())))
            .collect();
        out.push_str(&format!("api_keys = [{}]\n", keys.join(", ")));
        if !c.metadata.is_empty() {
            let pairs: Vec<String> = c
                .metadata
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
                .collect();
            out.push_str(&format!("metadata = {{ {} }}\n", pairs.join(", ")));
        }
        if !c.groups.is_empty() {
            let groups: Vec<String> = c.groups.iter().map(|g| toml_string(g)).collect();
            out.push_str(&format!("groups = [{}]\n", groups.join(", ")));
        }
    }
    out
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Writes `path` so that a reader sees the old content or the new, never part of it.
fn write_atomically(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}
