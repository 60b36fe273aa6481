//! A route that answers itself: `redirect = { to, status, keep_query }` or `respond = {
//! status, body, content_type }`. Pure: what the answer is for one request; `proxy/answer.rs`
//! writes it.
//!
//! A redirect's target is fixed in the configuration — scheme and host, checked at load —
//! and only the request's path (`${path}`, after the route's `strip_prefix` / `add_prefix`)
//! and query (unless `keep_query = false`) are carried over: nothing of the request can name
//! another host (no open redirect).

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

/// What a self-answering route answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Redirect(Redirect),
    Respond {
        status: StatusCode,
        body: Bytes,
        content_type: HeaderValue,
    },
}

impl Answer {
    /// What `/config` shows: `"redirect 301 https://new.example.com${path}"`, `"respond 503"`.
    pub fn describe(&self) -> String {
        match self {
            Answer::Redirect(r) => {
                let path = if r.with_path { "${path}" } else { "" };
                format!(
                    "redirect {} {}{path}{}",
                    r.status.as_u16(),
                    r.before,
                    r.after
                )
            }
            Answer::Respond { status, .. } => format!("respond {}", status.as_u16()),
        }
    }
}

/// A redirect: `before` + the path (when the target says `${path}`) + `after`, then the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub status: StatusCode,
    before: String,
    with_path: bool,
    after: String,
    keep_query: bool,
}

/// The statuses a redirect may have.
pub const REDIRECT_STATUSES: [u16; 4] = [301, 302, 307, 308];

impl Redirect {
    /// The target `to` (`https://new.example.com${path}`), parsed: an absolute http(s) URL
    /// whose host is written out, with at most one `${path}` after it and no fragment.
    pub fn parse(to: &str, status: StatusCode, keep_query: bool) -> Result<Redirect, String> {
        let lower = to.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"))
            .ok_or_else(|| {
                format!("{to:?}: the target must be an absolute http:// or https:// URL with its host (\"https://new.example.com${{path}}\")")
            })?;
        let authority_len = rest.find(['/', '?', '#', '$']).unwrap_or(rest.len());
        let authority = &rest[..authority_len];
        if authority.is_empty() || authority.contains('@') {
            return Err(format!(
                "{to:?}: the target names no host (or a user): write the host out; it is never taken from the request"
            ));
        }
        if to.contains('#') {
            return Err(format!(
                "{to:?}: a fragment is not sent to a server: remove it"
            ));
        }
        let (before, after, with_path) = match to.split_once("${path}") {
            Some((before, after)) => (before, after, true),
            None => (to, "", false),
        };
        if before.contains("${") || after.contains("${") {
            return Err(format!(
                "{to:?}: the only variable a target may use is ${{path}}, once"
            ));
        }
        HeaderValue::from_str(&to.replace("${path}", "/"))
            .map_err(|_| format!("{to:?}: not a valid Location (visible ASCII only)"))?;
        Ok(Redirect {
            status,
            before: before.to_owned(),
            with_path,
            after: after.to_owned(),
            keep_query,
        })
    }

    /// The `Location` for a request with `path` (as the upstream would get it) and `query`.
    pub fn location(&self, path: &str, query: Option<&str>) -> Option<HeaderValue> {
        let mut target = String::with_capacity(
            self.before.len() + path.len() + self.after.len() + query.map_or(0, str::len) + 2,
        );
        target.push_str(&self.before);
        if self.with_path {
            target.push_str(path);
        }
        target.push_str(&self.after);
        if let Some(query) = query.filter(|q| self.keep_query && !q.is_empty()) {
            target.push(if target.contains('?') { '&' } else { '?' });
            target.push_str(query);
        }
        HeaderValue::try_from(target).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(to: &str, keep_query: bool) -> Redirect {
        Redirect::parse(to, StatusCode::PERMANENT_REDIRECT, keep_query).unwrap()
    }

    #[test]
    fn the_target_keeps_its_host_and_takes_the_path_and_query() {
        let r = redirect("https://new.example.com/v2${path}", true);
        assert_eq!(
            r.location("/orders/7", Some("a=1&b=2")).unwrap(),
            "https://new.example.com/v2/orders/7?a=1&b=2"
        );
        assert_eq!(
            r.location("//evil.example/x", None).unwrap(),
            "https://new.example.com/v2//evil.example/x"
        );
        let fixed = redirect("https://docs.example.com/moved?from=api", true);
        assert_eq!(
            fixed.location("/x", Some("q=1")).unwrap(),
            "https://docs.example.com/moved?from=api&q=1"
        );
        let dropped = redirect("https://new.example.com${path}", false);
        assert_eq!(
            dropped.location("/a", Some("q=1")).unwrap(),
            "https://new.example.com/a"
        );
    }

    #[test]
    fn a_target_without_its_own_host_is_refused() {
        for bad in [
            "${path}",
            "/new${path}",
            "//evil.example${path}",
            "https://${path}",
            "https://user@host.example/",
            "ftp://files.example.com/",
            "https://new.example.com/${query}",
            "https://new.example.com${path}${path}",
            "https://new.example.com/#top",
        ] {
            assert!(
                Redirect::parse(bad, StatusCode::FOUND, true).is_err(),
                "{bad}"
            );
        }
    }
}
