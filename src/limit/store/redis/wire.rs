//! What every kind of Redis connection shares: which lane a call takes, how a script call
//! is sent (by SHA, loaded again after `NOSCRIPT`), the scripts loaded on each new
//! connection, credentials and TLS material, and how a Redis error reads as a store error.

use crate::limit::store::error::StoreError;
use crate::limit::store::redis::config::{RedisAuth, RedisTls};
use crate::limit::store::redis::native::{native_cmd, unknown_command, verb, Native};
use crate::limit::store::redis::scripts::{Call, Scripts};
use redis::{ErrorKind, RedisConnectionInfo, RedisError, ServerErrorKind, TlsCertificates};
use std::time::Duration;

/// Which connection a call uses.
#[derive(Clone, Copy)]
pub enum Lane {
    /// Decisions and releases: the connection made (and so driven) by the runtime serving
    /// requests, so a decision never hops threads to reach Redis.
    Requests,
    /// Heartbeats and shutdown give-backs, from the background runtime.
    Background,
}

/// How long a connection waits for any reply. Each call is bounded by the configured timeout
/// on the caller's side; the connection itself waits longer, so that a reply arriving after
/// that timeout still reaches a caller that kept waiting for it (a lease renewal, whose grant
/// is then kept instead of lost).
pub const LATE_REPLY: Duration = Duration::from_secs(30);

/// Sends `call` to the module (where `allowed`, the connection's Redis has it and the call
/// has a command there), else by SHA (`run`); a module gone since the connect turns it off
/// and the call goes by SHA.
pub async fn run_on<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
    call: &Call<'_>,
    conn: &mut C,
    (allowed, native, scripts): (bool, &Native, &Scripts),
) -> Result<T, RedisError> {
    if allowed && native.on() {
        if let Some(verb) = verb(scripts, call.script) {
            match native_cmd(&call.cmd, verb).query_async(conn).await {
                Err(e) if unknown_command(&e) => native.lost(),
                result => return result,
            }
        }
    }
    run(call, conn).await
}

/// Sends `call` by SHA; if Redis does not know the script (it restarted, or its scripts were
/// flushed, since the connection loaded them), loads it and sends the call again.
pub async fn run<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
    call: &Call<'_>,
    conn: &mut C,
) -> Result<T, RedisError> {
    match call.cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // Boxed, as in `first_or`.
            Box::pin(async {
                call.script.prepare_invoke().load_async(conn).await?;
                call.cmd.query_async(conn).await
            })
            .await
        }
        result => result,
    }
}

/// Loads every script on a new connection, so that each call is one EVALSHA that Redis runs
/// in the order it was sent. A script loaded only on its first `NOSCRIPT` would be sent again
/// after that reply: behind calls sent meanwhile (a release queued after a stalled check must
/// run after it, and before the next check).
///
/// All in one round trip (a pipeline): a new connection's first decisions wait for this, and
/// on a busy machine each round trip is a wake-up or two — ten of them in a row could outlast
/// `store.timeout` and leave a freshly started gateway's first decisions to the failure mode.
///
/// `native` (single node, Sentinel): the same round trip asks whether this Redis has the
/// module (`native.rs`).
pub async fn load<C: redis::aio::ConnectionLike>(
    scripts: &Scripts,
    conn: &mut C,
    native: Option<&Native>,
) -> Result<(), RedisError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for source in scripts.sources() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source);
    }
    pipe.cmd("SCRIPT")
        .arg("LOAD")
        .arg(super::scripts::BATCH_SOURCE);
    if native.is_some() {
        pipe.cmd("TURNSTILE.VERSION");
    }
    let mut loaded: Vec<redis::RedisResult<String>> = pipe.query_async(conn).await?;
    if let (Some(native), Some(answer)) = (native, native.and(loaded.pop())) {
        native.found(answer)?;
    }
    // Batching only: where Redis refuses it (older than 7), every decision is its own call.
    if let Some(Err(e)) = loaded.pop() {
        log::debug!("Redis did not load the batch script: {e}");
    }
    loaded.into_iter().try_for_each(|sha| sha.map(drop))
}

/// The connection is gone (not merely an error Redis answered with).
pub fn lost_connection(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// Whether a URL chooses its protocol itself (`?protocol=resp2`).
pub fn names_protocol(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| u.query_pairs().any(|(k, _)| k == "protocol"))
}

/// The URL's connection settings with the configured user and password over them.
pub fn with_auth(mut redis: RedisConnectionInfo, auth: &RedisAuth) -> RedisConnectionInfo {
    if let Some(user) = &auth.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &auth.password {
        redis = redis.set_password(password);
    }
    redis
}

/// The CA and client certificate files, read now (`None`: the system roots, no client
/// certificate).
pub fn tls_certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, StoreError> {
    if tls.ca_file.is_none() && tls.client_cert.is_none() {
        return Ok(None);
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot read the {what}: {}", e.kind())))
    };
    let root_cert = match &tls.ca_file {
        Some(ca) => Some(read(ca, "Redis CA file")?),
        None => None,
    };
    let client_tls = match &tls.client_cert {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "Redis client certificate")?,
            client_key: read(key, "Redis client key")?,
        }),
        None => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> StoreError {
        if e.is_timeout() {
            return StoreError::Unavailable(format!("timed out: {e}"));
        }
        let auth_code = matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
        if e.kind() == ErrorKind::AuthenticationFailed || auth_code {
            return StoreError::Auth(e.to_string());
        }
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            return StoreError::Unavailable(e.to_string());
        }
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::ClusterDown)
            | ErrorKind::Server(ServerErrorKind::TryAgain) => {
                StoreError::Unavailable(e.to_string())
            }
            ErrorKind::Server(_) | ErrorKind::Extension => StoreError::Refused(e.to_string()),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                StoreError::Protocol(e.to_string())
            }
            _ => StoreError::Unavailable(e.to_string()),
        }
    }
}
