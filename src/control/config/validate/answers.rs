//! A route that answers itself: `redirect` (a target whose host is written out, a redirect
//! status) or `respond` (a status, a body, its type) — one of them, instead of an upstream.

use super::checks::Problems;
use crate::chain::answer::{Answer, Redirect, REDIRECT_STATUSES};
use crate::control::config::file::{RedirectFile, RespondFile};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use std::sync::Arc;

/// The most a fixed answer's body may hold.
const MAX_BODY: usize = 64 * 1024;

pub(super) fn answer(
    base: &str,
    (redirect, respond): (Option<RedirectFile>, Option<RespondFile>),
    upstream: Option<&str>,
    identifies: bool,
    problems: &mut Problems,
) -> Option<Arc<Answer>> {
    let answer = match (redirect, respond) {
        (None, None) => {
            if upstream.is_none() {
                problems.push(
                    format!("{base}.upstream"),
                    "is required: name the upstream this route's requests go to (or answer them with redirect / respond)",
                );
            }
            return None;
        }
        (Some(_), Some(_)) => {
            problems.push(
                format!("{base}.respond"),
                "a route either redirects or responds: keep one of them",
            );
            return None;
        }
        (Some(redirect), None) => redirect_answer(&format!("{base}.redirect"), redirect, problems)?,
        (None, Some(respond)) => respond_answer(&format!("{base}.respond"), respond, problems)?,
    };
    if upstream.is_some() {
        problems.warn(
            format!("{base}.upstream"),
            "is never used: the route answers every request itself (redirect / respond)",
        );
    }
    if identifies {
        problems.warn(
            format!("{base}.auth"),
            "is never checked: a route that answers itself does so before identity (after the address rules and the per-IP bucket)",
        );
    }
    Some(Arc::new(answer))
}

/// Warns of each of a self-answering route's `settings` that is set (`true`) but never
/// used: its requests are answered before identity, limits and the upstream.
pub(super) fn warn_unused(base: &str, settings: &[(&str, bool)], problems: &mut Problems) {
    for (key, _) in settings.iter().filter(|(_, set)| *set) {
        problems.warn(
            format!("{base}.{key}"),
            "is never used: the route answers every request itself (redirect / respond), before identity, limits and any upstream",
        );
    }
}

fn redirect_answer(path: &str, file: RedirectFile, problems: &mut Problems) -> Option<Answer> {
    let status = file.status.unwrap_or(301);
    let known = REDIRECT_STATUSES.contains(&status);
    if !known {
        problems.push(
            format!("{path}.status"),
            format!("{status}: a redirect is 301, 302, 307 or 308 (307 and 308 keep the method and body)"),
        );
    }
    let status = StatusCode::from_u16(status)
        .ok()
        .filter(|_| known)
        .unwrap_or(StatusCode::MOVED_PERMANENTLY);
    match Redirect::parse(&file.to, status, file.keep_query.unwrap_or(true)) {
        Ok(r) => known.then_some(Answer::Redirect(r)),
        Err(e) => {
            problems.push(format!("{path}.to"), e);
            None
        }
    }
}

fn respond_answer(path: &str, file: RespondFile, problems: &mut Problems) -> Option<Answer> {
    let Some(status) = StatusCode::from_u16(file.status)
        .ok()
        .filter(|s| (200..=599).contains(&s.as_u16()))
    else {
        problems.push(
            format!("{path}.status"),
            format!("{}: a status from 200 to 599", file.status),
        );
        return None;
    };
    let body = file.body.unwrap_or_default();
    if body.len() > MAX_BODY {
        problems.push(format!("{path}.body"), "at most 64 KiB");
        return None;
    }
    if !body.is_empty() && matches!(status.as_u16(), 204 | 304) {
        problems.push(
            format!("{path}.body"),
            format!("a {status} answer has no body"),
        );
        return None;
    }
    let content_type = file
        .content_type
        .unwrap_or_else(|| "text/plain; charset=utf-8".to_owned());
    let Ok(content_type) = HeaderValue::try_from(content_type) else {
        problems.push(format!("{path}.content_type"), "not a valid header value");
        return None;
    };
    Some(Answer::Respond {
        status,
        body: Bytes::from(body),
        content_type,
    })
}
