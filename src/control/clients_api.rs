//! The admin API for clients: list and read them (configuration, clients file and registry),
//! create / update / delete them, issue and revoke their keys, read their usage — JSON in and
//! out, errors as problem+json, one audit line per change (who: the admin token's name;
//! never a key). Writes need a named admin token.
//!
//! ```text
//! GET    /clients                       every client, keys as digest prefixes only
//! GET    /clients/{id}
//! PUT    /clients/{id}                  {"plan": "...", "metadata": {...}, "groups": [...]}: create or update
//! DELETE /clients/{id}
//! POST   /clients/{id}/keys             a new key, in this answer only
//! DELETE /clients/{id}/keys/{key_id}
//! GET    /clients/{id}/usage            remaining and reset of each plan limit, per route
//! POST   /registry/restore              write this instance's copy into a Redis that lost it
//! ```
//!
//! With a Redis store the changes go to the registry (`registry/`); with the memory store
//! they rewrite `server.clients_file` atomically and reload it (`clients_file.rs`).

use crate::chain::auth::Client;
use crate::control::clients_file::FileClients;
use crate::control::reload::Reloader;
use crate::control::snapshot::Snapshot;
use crate::registry::write::{Put, RegistryError};
use http::{Response, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest request body the API reads.
pub const MAX_BODY: usize = 64 * 1024;

pub struct ClientsApi<'a> {
    pub snapshot: &'a Arc<Snapshot>,
    pub reloader: &'a Reloader,
    pub files: &'a FileClients,
    /// The admin token's name, when the request carried one.
    pub actor: Option<&'a str>,
}

/// A problem+json answer of the admin API.
pub fn problem(status: StatusCode, slug: &str, detail: &str) -> Response<Vec<u8>> {
    let body = json!({
        "type": format!("{}admin-{slug}", crate::chain::problem::TYPE_BASE),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    respond(status, &body, "application/problem+json")
}

fn respond(status: StatusCode, body: &Value, content_type: &str) -> Response<Vec<u8>> {
    let body = serde_json::to_vec_pretty(body).expect("json serializes");
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .body(body)
        .expect("valid response")
}

fn ok(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    respond(status, body, "application/json")
}

impl From<RegistryError> for Response<Vec<u8>> {
    fn from(e: RegistryError) -> Response<Vec<u8>> {
        match e {
            RegistryError::NotFound => problem(StatusCode::NOT_FOUND, "not-found", "no such client or key"),
            RegistryError::FileManaged => problem(
                StatusCode::CONFLICT,
                "file-managed",
                "the configuration file defines this client: change it there",
            ),
            RegistryError::Invalid(why) => problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid", &why),
            RegistryError::Full => problem(
                StatusCode::CONFLICT,
                "registry-full",
                "registry.max_clients is reached",
            ),
            RegistryError::Lost => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "registry-lost",
                "Redis lost the registry; keys keep working from every instance's copy. Restore it with POST /registry/restore on the instance that saw the latest change",
            ),
            RegistryError::Busy => problem(
                StatusCode::CONFLICT,
                "busy",
                "other writers kept changing this client; try again",
            ),
            RegistryError::Store(why) => problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", &why),
        }
    }
}

/// The body of a `PUT /clients/{id}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    plan: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    groups: Vec<String>,
}

impl ClientsApi<'_> {
    /// The answer, or `None` when `path` is not the API's.
    pub async fn handle(&self, method: &str, path: &str, body: &[u8]) -> Option<Response<Vec<u8>>> {
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        let writes = matches!(method, "PUT" | "POST" | "DELETE");
        match parts.as_slice() {
            ["clients", ..] | ["registry", "restore"] => {}
            _ => return None,
        }
        if writes && self.actor.is_none() {
            return Some(problem(
                StatusCode::FORBIDDEN,
                "writes-need-a-token",
                "changes need a named admin token: set admin.token or admin.tokens",
            ));
        }
        Some(match (method, parts.as_slice()) {
            ("GET", ["clients"]) => self.list(),
            ("GET", ["clients", id]) => self.show(id),
            ("PUT", ["clients", id]) => self.put(id, body).await,
            ("DELETE", ["clients", id]) => self.delete(id).await,
            ("POST", ["clients", id, "keys"]) => self.issue(id).await,
            ("DELETE", ["clients", id, "keys", key_id]) => self.revoke(id, key_id).await,
            ("GET", ["clients", id, "usage"]) => self.usage(id).await,
            ("POST", ["registry", "restore"]) => self.restore().await,
            _ => problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                &format!("{method} {path} is not an operation of the clients API"),
            ),
        })
    }

    fn audit(&self, action: &str, id: &str, key_id: Option<&str>) {
        log::info!(
            target: "turnstile::audit",
            "admin change: actor={} action={action} client={id}{}",
            self.actor.unwrap_or("-"),
            key_id.map(|k| format!(" key_id={k}")).unwrap_or_default()
        );
    }

    /// Every client: the configuration's, then the registry's it does not shadow.
    fn all(&self) -> Vec<Value> {
        let config = &self.snapshot.config;
        let mut out: Vec<Value> = config
            .clients
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "plan": c.plan,
                    "metadata": c.metadata,
                    "groups": c.groups,
                    "source": if c.in_clients_file { "clients_file" } else { "config" },
                    "keys": c.api_keys.iter().map(|d| json!({"id": &d.hex()[..12]})).collect::<Vec<_>>(),
                })
            })
            .collect();
        if let Some(registry) = &self.snapshot.registry {
            let state = registry.state();
            let unserved = registry.ring().unserved.clone();
            for (id, entry) in &state.entries {
                out.push(json!({
                    "id": id,
                    "plan": entry.plan,
                    "metadata": entry.metadata,
                    "groups": entry.groups,
                    "source": "registry",
                    "served": !unserved.iter().any(|(u, _)| u == id),
                    "keys": entry.keys.iter().map(|k| json!({"id": k.id(), "created": k.created})).collect::<Vec<_>>(),
                }));
            }
        }
        out
    }

    fn list(&self) -> Response<Vec<u8>> {
        ok(StatusCode::OK, &json!({ "clients": self.all() }))
    }

    fn show(&self, id: &str) -> Response<Vec<u8>> {
        match self.all().into_iter().find(|c| c["id"] == id) {
            Some(c) => ok(StatusCode::OK, &c),
            None => RegistryError::NotFound.into(),
        }
    }

    async fn put(&self, id: &str, body: &[u8]) -> Response<Vec<u8>> {
        let body: PutBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "bad-body",
                    &format!(
                    "expected {{\"plan\": \"...\", \"metadata\": {{...}}, \"groups\": [...]}}: {e}"
                ),
                )
            }
        };
        if let Some(why) = crate::registry::model::groups_problem(&body.groups) {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad-body",
                &format!("groups: {why}"),
            );
        }
        let fields = (body.metadata, body.groups);
        let result = match &self.snapshot.registry {
            Some(r) => r.put(id, &body.plan, fields).await,
            None => {
                self.files
                    .put(self.snapshot, self.reloader, id, &body.plan, fields)
                    .await
            }
        };
        match result {
            Ok(put) => {
                let status = match put {
                    Put::Created => StatusCode::CREATED,
                    Put::Updated | Put::Unchanged => StatusCode::OK,
                };
                if put != Put::Unchanged {
                    self.audit(
                        if put == Put::Created {
                            "create"
                        } else {
                            "update"
                        },
                        id,
                        None,
                    );
                }
                ok(
                    status,
                    &json!({"id": id, "result": format!("{put:?}").to_lowercase()}),
                )
            }
            Err(e) => e.into(),
        }
    }

    async fn delete(&self, id: &str) -> Response<Vec<u8>> {
        let result = match &self.snapshot.registry {
            Some(r) => r.delete(id).await,
            None => self.files.delete(self.snapshot, self.reloader, id).await,
        };
        match result {
            Ok(()) => {
                self.audit("delete", id, None);
                no_content()
            }
            Err(e) => e.into(),
        }
    }

    async fn issue(&self, id: &str) -> Response<Vec<u8>> {
        let result = match &self.snapshot.registry {
            Some(r) => r.issue_key(id).await,
            None => self.files.issue_key(self.snapshot, self.reloader, id).await,
        };
        match result {
            Ok(issued) => {
                self.audit("issue_key", id, Some(&issued.key_id));
                ok(
                    StatusCode::CREATED,
                    &json!({
                        "client": id,
                        "key_id": issued.key_id,
                        "key": issued.key,
                        "note": "the key is shown this once: only its digest is kept",
                    }),
                )
            }
            Err(e) => e.into(),
        }
    }

    async fn revoke(&self, id: &str, key_id: &str) -> Response<Vec<u8>> {
        let result = match &self.snapshot.registry {
            Some(r) => r.revoke_key(id, key_id).await,
            None => {
                self.files
                    .revoke_key(self.snapshot, self.reloader, id, key_id)
                    .await
            }
        };
        match result {
            Ok(()) => {
                self.audit("revoke_key", id, Some(key_id));
                no_content()
            }
            Err(e) => e.into(),
        }
    }

    async fn restore(&self) -> Response<Vec<u8>> {
        let Some(registry) = &self.snapshot.registry else {
            return problem(
                StatusCode::NOT_FOUND,
                "no-registry",
                "no registry in a shared store is configured",
            );
        };
        match registry.restore().await {
            Ok(version) => {
                self.audit("restore", "*", None);
                ok(
                    StatusCode::OK,
                    &json!({"result": "restored", "version": version}),
                )
            }
            Err(e) => e.into(),
        }
    }

    /// The client as the request path would find it (configuration first, then registry).
    fn client(&self, id: &str) -> Option<Arc<Client>> {
        let plans = crate::control::snapshot::plan_of(self.snapshot, id)?;
        let config = &self.snapshot.config;
        let groups: Vec<String> = match config.clients.iter().find(|c| c.id == id) {
            Some(c) => c.groups.clone(),
            None => self
                .snapshot
                .registry
                .as_ref()
                .and_then(|r| r.state().entries.get(id).map(|e| e.groups.clone()))
                .unwrap_or_default(),
        };
        Some(Arc::new(Client {
            id: Arc::from(id),
            plan: plans,
            groups: groups.iter().map(|g| Arc::from(g.as_str())).collect(),
        }))
    }

    async fn usage(&self, id: &str) -> Response<Vec<u8>> {
        let Some(client) = self.client(id) else {
            return RegistryError::NotFound.into();
        };
        usage_body(self.snapshot, &client, None)
            .await
            .map(|body| ok(StatusCode::OK, &body))
            .unwrap_or_else(|why| {
                problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", &why)
            })
    }
}

fn no_content() -> Response<Vec<u8>> {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header("cache-control", "no-store")
        .body(Vec::new())
        .expect("valid response")
}

/// `client`'s plan limits on every route that identifies callers: remaining units and the
/// seconds until they reset, read without counting (`chain::usage`).
pub async fn usage_body(
    snapshot: &Snapshot,
    client: &Arc<Client>,
    only: Option<&str>,
) -> Result<Value, String> {
    let routes: Vec<Arc<str>> = snapshot
        .routes
        .iter()
        .filter(|r| r.config.auth.identifies())
        .filter(|r| only.is_none_or(|name| *r.rules.name == *name))
        .map(|r| Arc::clone(&r.rules.name))
        .collect();
    let usage = crate::chain::usage::usage(&snapshot.store, client, &routes)
        .await
        .map_err(|e| e.to_string())?;
    let routes: Vec<Value> = routes
        .iter()
        .zip(usage)
        .map(|(route, limits)| {
            json!({
                "route": &**route,
                "limits": limits.iter().map(|(name, d)| json!({
                    "name": &**name,
                    "limit": d.limit,
                    "remaining": d.remaining,
                    "reset": d.reset_ms.div_ceil(1000),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({
        "client": &*client.id,
        "plan": &*client.plan.name,
        "groups": client.groups.iter().map(|g| &**g).collect::<Vec<_>>(),
        "routes": routes,
    }))
}
