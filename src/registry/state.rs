//! Every instance's copy of the registry, and how it follows Redis: the version counter is
//! read every `poll` (one small script call), the whole registry when the version moved or
//! every `resync` in any case — so a change reaches every instance within `poll` while Redis
//! answers, and a copy that diverged for any reason heals by itself. Requests look keys up
//! in the copy (an atomic load and a hash lookup): no store call on the request path, and a
//! Redis that is down leaves every instance with its last known registry.
//!
//! When Redis comes back without the registry (its version key is gone: restarted without
//! persistence), the copy is kept and marked lost: keys keep working as they were, nothing
//! is written until an operator restores the registry from an instance's copy
//! (`POST /registry/restore`). Re-seeding by itself could resurrect a revoked key from an
//! instance that missed the revocation; an operator chooses the instance.

use super::model::Entry;
use crate::chain::auth::{Client, KeyRing, Plan};
use crate::limit::store::redis::scripts::RegistryOp;
use crate::limit::store::redis::RedisStore;
use crate::limit::store::StoreError;
use arc_swap::ArcSwap;
use redis::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// `[registry]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    pub poll: Duration,
    pub resync: Duration,
    /// Bound on one registry call (a whole registry is more than a decision).
    pub timeout: Duration,
    /// What issued keys start with.
    pub key_prefix: String,
    pub max_clients: usize,
    pub max_keys: usize,
}

/// The registry as this instance last read it.
#[derive(Debug, Default, Clone)]
pub struct State {
    pub version: u64,
    pub entries: BTreeMap<String, Entry>,
    /// Entries that could not be read, and why (skipped, never a panic).
    pub skipped: Vec<(String, String)>,
    pub synced_at: Option<SystemTime>,
    pub last_error: Option<String>,
    /// Redis lost the registry; this copy is kept and writes wait for a restore.
    pub lost: bool,
}

/// What the configuration says that the registry's clients depend on.
#[derive(Default)]
struct Inputs {
    plans: BTreeMap<String, Arc<Plan>>,
    /// Client ids defined in the configuration: they win over registry clients of that id.
    file_ids: BTreeSet<String>,
}

/// The registry's clients as the request path reads them.
#[derive(Default)]
pub struct Ring {
    pub keys: KeyRing,
    /// Entries not served, and why (a plan that does not exist, an id the file defines).
    pub unserved: Vec<(String, String)>,
}

pub struct Registry {
    pub(super) store: Arc<RedisStore>,
    pub settings: RegistrySettings,
    pub(super) state: ArcSwap<State>,
    inputs: ArcSwap<Inputs>,
    ring: ArcSwap<Ring>,
    last_full: Mutex<Option<Instant>>,
    /// One admin write at a time on this instance (Redis orders writes across instances).
    pub(super) writing: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn new(store: Arc<RedisStore>, settings: RegistrySettings) -> Registry {
        Registry {
            store,
            settings,
            state: ArcSwap::from_pointee(State::default()),
            inputs: ArcSwap::from_pointee(Inputs::default()),
            ring: ArcSwap::from_pointee(Ring::default()),
            last_full: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// The client owning `key`, if a registry client does.
    pub fn lookup(&self, key: &[u8]) -> Option<Arc<Client>> {
        self.ring.load().keys.lookup(key).cloned()
    }

    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.ring.load_full()
    }

    /// The configuration's plans and client ids (on every snapshot build).
    pub fn configure(&self, plans: BTreeMap<String, Arc<Plan>>, file_ids: BTreeSet<String>) {
        self.inputs.store(Arc::new(Inputs { plans, file_ids }));
        self.rebuild();
    }

    pub fn plan_exists(&self, plan: &str) -> bool {
        self.inputs.load().plans.contains_key(plan)
    }

    pub fn file_defines(&self, id: &str) -> bool {
        self.inputs.load().file_ids.contains(id)
    }

    /// Reads the version, and the whole registry when it moved or a resync is due.
    pub async fn sync(&self) {
        let current = self.state.load_full();
        let version = match self.call(&RegistryOp::Version).await.and_then(integer) {
            Ok(v) => v,
            Err(e) => return self.failed(&current, e),
        };
        if version == 0 && current.version > 0 {
            if !current.lost {
                log::warn!(
                    "the client registry is gone from Redis (version {} known here): keeping this copy; writes wait for POST /registry/restore",
                    current.version
                );
            }
            let mut state = (*current).clone();
            state.lost = true;
            state.last_error = Some("Redis holds no registry: restore it".into());
            self.state.store(Arc::new(state));
            return;
        }
        let due = self
            .last_full
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= self.settings.resync);
        if version == current.version && !due && !current.lost {
            return;
        }
        self.read_all(&current).await;
    }

    /// Reads the whole registry now.
    pub(super) async fn read_all(&self, current: &State) {
        let reply = match self.call(&RegistryOp::Read).await {
            Ok(Value::Array(items)) => items,
            Ok(other) => {
                return self.failed(current, StoreError::Protocol(format!("{other:?}")));
            }
            Err(e) => return self.failed(current, e),
        };
        let mut items = reply.into_iter();
        let Some(Ok(version)) = items.next().map(integer) else {
            return self.failed(current, StoreError::Protocol("no version".into()));
        };
        let mut entries = BTreeMap::new();
        let mut skipped = Vec::new();
        while let (Some(id), Some(json)) = (items.next(), items.next()) {
            let (id, json) = (text(id), text(json));
            match Entry::from_json(&json, self.settings.max_keys) {
                Ok(entry) if super::model::valid_id(&id) => {
                    entries.insert(id, entry);
                }
                Ok(_) => skipped.push((id, "not a client id".into())),
                Err(why) => skipped.push((id, why)),
            }
        }
        for (id, why) in &skipped {
            if !current.skipped.iter().any(|(i, _)| i == id) {
                log::warn!("client registry: entry {id:?} skipped: {why}");
            }
        }
        *self
            .last_full
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let state = State {
            version,
            entries,
            skipped,
            synced_at: Some(SystemTime::now()),
            last_error: None,
            lost: false,
        };
        // The ring first: whoever sees the new state (the admin API) finds it served.
        self.ring.store(Arc::new(self.ring_of(&state)));
        self.state.store(Arc::new(state));
    }

    fn failed(&self, current: &State, error: StoreError) {
        let mut state = current.clone();
        state.last_error = Some(error.to_string());
        self.state.store(Arc::new(state));
    }

    pub(super) async fn call(&self, op: &RegistryOp<'_>) -> Result<Value, StoreError> {
        self.store.registry(op, self.settings.timeout).await
    }

    /// The ring from the state and the configuration's plans and ids.
    fn rebuild(&self) {
        let ring = self.ring_of(&self.state.load());
        self.ring.store(Arc::new(ring));
    }

    fn ring_of(&self, state: &State) -> Ring {
        let inputs = self.inputs.load();
        let mut unserved = Vec::new();
        let mut keys = Vec::new();
        for (id, entry) in &state.entries {
            if inputs.file_ids.contains(id) {
                unserved.push((id.clone(), "the configuration defines this id".into()));
                continue;
            }
            let Some(plan) = inputs.plans.get(&entry.plan) else {
                unserved.push((id.clone(), format!("no plan {:?}", entry.plan)));
                continue;
            };
            let client = Arc::new(Client {
                id: Arc::from(id.as_str()),
                plan: Arc::clone(plan),
                groups: entry.groups.iter().map(|g| Arc::from(g.as_str())).collect(),
            });
            keys.extend(
                entry
                    .keys
                    .iter()
                    .filter_map(|k| k.digest())
                    .map(|d| (d, Arc::clone(&client))),
            );
        }
        Ring {
            keys: KeyRing::new(keys),
            unserved,
        }
    }
}

pub(super) fn integer(value: Value) -> Result<u64, StoreError> {
    match value {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        other => Err(StoreError::Protocol(format!(
            "expected a count, got {other:?}"
        ))),
    }
}

pub(super) fn text(value: Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Value::SimpleString(s) => s,
        Value::Int(n) => n.to_string(),
        _ => String::new(),
    }
}
