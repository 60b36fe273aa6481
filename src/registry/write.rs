//! Changes to the registry (the admin API's writes): each reads one client, computes the new
//! entry, and compare-and-sets it in one script call; if another write got there first it
//! reads again (a few times, then says so). The instance then reads the registry at once, so
//! its own change applies to its next request; the others see it at their next poll.

use super::model::{digest_hex, new_key, Entry, StoredKey};
use super::state::{integer, text, Registry};
use crate::limit::store::redis::scripts::RegistryOp;
use crate::limit::store::StoreError;
use redis::Value;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Compare-and-set attempts before a write gives up (another writer kept winning).
const ATTEMPTS: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    NotFound,
    /// The configuration file defines this client: it is not the registry's to change.
    FileManaged,
    Invalid(String),
    /// `max_clients` reached.
    Full,
    /// Redis lost the registry: writes wait for a restore.
    Lost,
    /// Other writers kept changing the client.
    Busy,
    Store(String),
}

impl From<StoreError> for RegistryError {
    fn from(e: StoreError) -> RegistryError {
        RegistryError::Store(e.to_string())
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Created,
    Updated,
    Unchanged,
}

/// A key issued: the key itself (shown once) and its id.
pub struct Issued {
    pub key: String,
    pub key_id: String,
}

impl Registry {
    /// Creates or replaces a client's plan and metadata (its keys stay): idempotent.
    pub async fn put(
        &self,
        id: &str,
        plan: &str,
        (metadata, groups): (BTreeMap<String, String>, Vec<String>),
    ) -> Result<Put, RegistryError> {
        if !self.plan_exists(plan) {
            return Err(RegistryError::Invalid(format!("no plan {plan:?}")));
        }
        let mut outcome = Put::Unchanged;
        self.change(id, |current| {
            let entry = match current {
                Some(mut e) => {
                    outcome = if e.plan == plan && e.metadata == metadata && e.groups == groups {
                        Put::Unchanged
                    } else {
                        Put::Updated
                    };
                    e.plan = plan.to_owned();
                    e.metadata = metadata.clone();
                    e.groups = groups.clone();
                    e
                }
                None => {
                    outcome = Put::Created;
                    Entry {
                        plan: plan.to_owned(),
                        metadata: metadata.clone(),
                        keys: Vec::new(),
                        groups: groups.clone(),
                    }
                }
            };
            Ok(Some(entry))
        })
        .await?;
        Ok(outcome)
    }

    /// Deletes a client and every key of it.
    pub async fn delete(&self, id: &str) -> Result<(), RegistryError> {
        self.change(id, |current| match current {
            Some(_) => Ok(None),
            None => Err(RegistryError::NotFound),
        })
        .await
    }

    /// Issues a new key to a client.
    pub async fn issue_key(&self, id: &str) -> Result<Issued, RegistryError> {
        let key = new_key(&self.settings.key_prefix).map_err(RegistryError::Store)?;
        let stored = StoredKey {
            sha256: digest_hex(&key),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
        };
        let key_id = stored.id().to_owned();
        let max = self.settings.max_keys;
        self.change(id, |current| {
            let mut entry = current.ok_or(RegistryError::NotFound)?;
            if entry.keys.len() >= max {
                return Err(RegistryError::Invalid(format!(
                    "the client has {max} keys already: revoke one first"
                )));
            }
            entry.keys.push(stored.clone());
            Ok(Some(entry))
        })
        .await?;
        Ok(Issued { key, key_id })
    }

    /// Revokes the key `key_id` (its digest's first hex digits) of a client.
    pub async fn revoke_key(&self, id: &str, key_id: &str) -> Result<(), RegistryError> {
        self.change(id, |current| {
            let mut entry = current.ok_or(RegistryError::NotFound)?;
            let before = entry.keys.len();
            entry.keys.retain(|k| k.id() != key_id);
            if entry.keys.len() == before {
                return Err(RegistryError::NotFound);
            }
            Ok(Some(entry))
        })
        .await
    }

    /// Writes this instance's copy into a Redis that lost the registry.
    pub async fn restore(&self) -> Result<u64, RegistryError> {
        let _writing = self.writing.lock().await;
        let state = self.state();
        if !state.lost {
            return Err(RegistryError::Invalid(
                "Redis holds the registry: nothing to restore".into(),
            ));
        }
        let entries: Vec<(String, String)> = state
            .entries
            .iter()
            .map(|(id, e)| (id.clone(), e.to_json()))
            .collect();
        let op = RegistryOp::Restore {
            version: state.version,
            entries: &entries,
        };
        let (done, version) = pair(self.call(&op).await?)?;
        self.read_all(&self.state()).await;
        if done == 1 {
            log::info!("client registry restored from this instance's copy (version {version})");
            Ok(version)
        } else {
            Err(RegistryError::Invalid(format!(
                "Redis holds a registry again (version {version}): not overwritten"
            )))
        }
    }

    /// One client changed by `f` (its current entry → the new one, `None` to delete), by
    /// compare-and-set; then the registry is read again.
    async fn change(
        &self,
        id: &str,
        mut f: impl FnMut(Option<Entry>) -> Result<Option<Entry>, RegistryError>,
    ) -> Result<(), RegistryError> {
        if let Some(why) = super::model::id_problem(id) {
            return Err(RegistryError::Invalid(why));
        }
        if self.file_defines(id) {
            return Err(RegistryError::FileManaged);
        }
        let _writing = self.writing.lock().await;
        if self.state().lost {
            return Err(RegistryError::Lost);
        }
        for _ in 0..ATTEMPTS {
            let (_, current) = pair_text(self.call(&RegistryOp::Get(id)).await?)?;
            let entry = match current.as_str() {
                "" => None,
                json => Some(
                    Entry::from_json(json, self.settings.max_keys)
                        .map_err(|why| RegistryError::Store(format!("stored entry: {why}")))?,
                ),
            };
            let new = f(entry)?;
            if let Some(e) = &new {
                e.check(self.settings.max_keys)
                    .map_err(RegistryError::Invalid)?;
            }
            let new_json = new.as_ref().map(Entry::to_json).unwrap_or_default();
            let op = RegistryOp::Cas {
                id,
                expected: &current,
                new: &new_json,
                max: self.settings.max_clients,
            };
            match pair(self.call(&op).await?)? {
                (1, _) => {
                    self.read_all(&self.state()).await;
                    return Ok(());
                }
                (2, _) => return Err(RegistryError::Full),
                _ => continue,
            }
        }
        Err(RegistryError::Busy)
    }
}

fn pair(value: Value) -> Result<(u64, u64), RegistryError> {
    match value {
        Value::Array(items) if items.len() == 2 => {
            let mut items = items.into_iter();
            let a = integer(items.next().expect("two"))?;
            let b = integer(items.next().expect("two"))?;
            Ok((a, b))
        }
        other => Err(RegistryError::Store(format!("unexpected reply {other:?}"))),
    }
}

fn pair_text(value: Value) -> Result<(u64, String), RegistryError> {
    match value {
        Value::Array(items) if items.len() == 2 => {
            let mut items = items.into_iter();
            let a = integer(items.next().expect("two"))?;
            Ok((a, text(items.next().expect("two"))))
        }
        other => Err(RegistryError::Store(format!("unexpected reply {other:?}"))),
    }
}
