//! The quota status endpoint (`server.quota_path`, e.g. `GET /_turnstile/quota`): an
//! identified client asks what is left of its plan's limits on every route, read from the
//! state the limiter decides with and without counting anything (`chain::usage`). Callers
//! are identified as on a route accepting every method the configuration offers (API keys,
//! bearer tokens of every issuer, client certificates); the per-IP bucket of the server
//! applies first, as on routes, then the client's own bucket for this endpoint
//! (`server.quota_limit`, in process: 429 `"quota"` beyond it). The answer is one store call
//! that writes nothing: for one route (`?route=NAME`) it reads what a decision on that route
//! reads; for every route, each route's limits.

use crate::chain::admission::IpRule;
use crate::chain::auth::Auth;
use crate::chain::credential::TokenFrom;
use crate::chain::reject::Reject;
use crate::clock::{Clock, MonotonicClock};
use crate::control::snapshot::IpTableId;
use crate::proxy::context::RequestCtx;
use crate::proxy::identify::{identify, Accepted};
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use std::sync::Arc;

/// Whether this request is for the quota endpoint.
pub fn is_quota(session: &Session, ctx: &RequestCtx) -> bool {
    ctx.snapshot
        .config
        .server
        .quota_path
        .as_deref()
        .is_some_and(|p| session.req_header().uri.path() == p)
}

/// Answers the quota endpoint (200 and the usage JSON), or the rejection.
pub async fn answer(
    session: &mut Session,
    ctx: &mut RequestCtx,
    ip: Option<u128>,
) -> Result<(), Reject> {
    let snapshot = Arc::clone(&ctx.snapshot);
    if let (Some(table), Some(ip)) = (snapshot.ip_tables.get(&IpTableId::ServerDefault), ip) {
        let rule = IpRule::new(Arc::clone(&table.limiter));
        ctx.admission
            .check_ip_rule(&rule, ip, MonotonicClock.now_ms())?;
    }
    if ctx.preflight {
        // `[server] cors`: answered here, never authenticated (a browser sends no
        // credentials with it) and never charged.
        return match crate::proxy::cors::answer_preflight(session, ctx).await {
            Ok(None) => Ok(()),
            Ok(Some(refused)) => Err(refused),
            Err(_) => Err(Reject::BadMessage("the answer could not be written")),
        };
    }
    if session.req_header().method != http::Method::GET {
        return Err(Reject::MethodNotAllowed {
            detail: "the quota endpoint answers GET".into(),
            allow: "GET".into(),
        });
    }
    let issuers: Vec<_> = snapshot.identity.issuers.values().cloned().collect();
    let accepted = Accepted {
        auth: Auth {
            api_key: true,
            jwt: !issuers.is_empty(),
            client_cert: snapshot.identity.cert.is_some(),
        },
        token_from: &TokenFrom::Authorization,
        issuers: &issuers,
        ip,
    };
    identify(session, ctx, &accepted).await?;
    let client = ctx.client.clone().expect("identified");
    if let Some(table) = snapshot.ip_tables.get(&IpTableId::Quota) {
        let rule = IpRule::new(Arc::clone(&table.limiter));
        ctx.admission
            .check_ip_rule(&rule, client_key(&client.id), MonotonicClock.now_ms())?;
    }
    let only = asked_route(session.req_header().uri.query(), &snapshot)?;
    let body = crate::control::clients_api::usage_body(&snapshot, &client, only.as_deref())
        .await
        .map_err(|_| Reject::Store(crate::limit::store::StoreError::Unavailable("usage".into())))?;
    let body = serde_json::to_vec_pretty(&body).expect("json serializes");
    let write = async {
        // No case map: the same bytes (`response_head.rs`).
        let mut resp = ResponseHeader::build_no_case(200, Some(4))?;
        resp.insert_header(CONTENT_TYPE, "application/json")?;
        resp.insert_header(CONTENT_LENGTH, body.len())?;
        resp.insert_header(CACHE_CONTROL, "no-store")?;
        resp.insert_header(
            crate::chain::request_id::NAME.clone(),
            ctx.request_id.clone(),
        )?;
        let mut cors = Vec::new();
        crate::proxy::cors::on_own_answer(ctx, session, &mut cors);
        for (name, value) in cors {
            resp.append_header(name, value)?;
        }
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
    };
    write
        .await
        .map_err(|_| Reject::BadMessage("the answer could not be written"))
}

/// The quota table's key for a client id: a hash, seeded once per process (the table is in
/// process), so ids of any length take one bounded entry.
fn client_key(id: &str) -> u128 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    let seed = SEED.get_or_init(foldhash::quality::RandomState::default);
    let (a, b) = (seed.hash_one((0u8, id)), seed.hash_one((1u8, id)));
    (u128::from(a) << 64) | u128::from(b)
}

/// `?route=NAME`: the one identified route asked about (`None`: every route). Given twice or
/// naming no such route: refused.
fn asked_route(
    query: Option<&str>,
    snapshot: &crate::control::snapshot::Snapshot,
) -> Result<Option<String>, Reject> {
    let mut asked = query
        .into_iter()
        .flat_map(|q| url::form_urlencoded::parse(q.as_bytes()))
        .filter(|(name, _)| name == "route");
    let Some((_, route)) = asked.next() else {
        return Ok(None);
    };
    if asked.next().is_some() {
        return Err(Reject::BadMessage("route is given more than once"));
    }
    let known = snapshot
        .routes
        .iter()
        .any(|r| r.config.auth.identifies() && *r.rules.name == *route);
    if !known {
        return Err(Reject::NotFound(format!(
            "no route {route:?} identifies its clients"
        )));
    }
    Ok(Some(route.into_owned()))
}
