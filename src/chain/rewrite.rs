//! A route's path rewrite: `strip_prefix` removes the route's `path_prefix` from the path the
//! upstream receives, `add_prefix` puts another in front. It applies to the normal form of
//! the path (`chain::path`), the one the route was chosen by: what is routed is what is
//! forwarded, after the rewrite. The query is left as received.

use crate::chain::path::normalize;

/// `path` (in normal form, matched by `prefix` on a segment boundary) as the upstream gets
/// it; `None` when the rewrite changes nothing.
pub fn rewrite(path: &str, prefix: &str, strip: bool, add: Option<&str>) -> Option<String> {
    if !strip && add.is_none() {
        return None;
    }
    let prefix = trim_slash(prefix);
    let rest = match strip {
        true => path.strip_prefix(prefix).unwrap_or(path),
        false => path,
    };
    let rest = if rest.is_empty() { "/" } else { rest };
    let add = add.map_or("", trim_slash);
    let add = if add == "/" { "" } else { add };
    let out = format!("{add}{rest}");
    (out != path).then_some(out)
}

/// The prefix the upstream no longer sees (`X-Forwarded-Prefix`), when `strip_prefix` is on
/// and it is more than `/`.
pub fn stripped(prefix: &str, strip: bool) -> Option<&str> {
    let prefix = trim_slash(prefix);
    (strip && prefix != "/").then_some(prefix)
}

/// `add_prefix` as configured: an absolute path in normal form, without query or fragment.
pub fn check_add_prefix(add: &str) -> Result<(), String> {
    if add.contains(['?', '#']) {
        return Err("a path prefix has no query or fragment".to_owned());
    }
    match normalize(add) {
        Ok(normal) if normal == add => Ok(()),
        Ok(normal) => Err(format!("not in normal form; write it as {normal:?}")),
        Err(bad) => Err(bad.detail().to_owned()),
    }
}

fn trim_slash(prefix: &str) -> &str {
    match prefix.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => prefix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_and_add_rewrite_the_matched_prefix_only() {
        assert_eq!(rewrite("/api/orders/1", "/api", false, None), None);
        assert_eq!(
            rewrite("/api/orders/1", "/api", true, None).as_deref(),
            Some("/orders/1")
        );
        assert_eq!(rewrite("/api", "/api/", true, None).as_deref(), Some("/"));
        assert_eq!(
            rewrite("/api/orders", "/api", true, Some("/v2")).as_deref(),
            Some("/v2/orders")
        );
        assert_eq!(
            rewrite("/orders", "/", false, Some("/v2/")).as_deref(),
            Some("/v2/orders")
        );
        assert_eq!(
            rewrite("/", "/", true, None),
            None,
            "the root strips to itself"
        );
        assert_eq!(
            rewrite("/a/b", "/a", true, Some("/")).as_deref(),
            Some("/b")
        );
        assert_eq!(rewrite("/a/b", "/a", false, Some("/")), None);
    }

    #[test]
    fn the_stripped_prefix_is_named_for_the_upstream() {
        assert_eq!(stripped("/api/", true), Some("/api"));
        assert_eq!(stripped("/api", false), None);
        assert_eq!(stripped("/", true), None);
    }

    #[test]
    fn add_prefix_must_be_a_normal_path() {
        assert!(check_add_prefix("/v2").is_ok());
        assert!(check_add_prefix("/v2/").is_ok());
        assert!(check_add_prefix("v2").is_err());
        assert!(check_add_prefix("/v2/../admin").is_err());
        assert!(check_add_prefix("/v2?x=1").is_err());
        assert!(check_add_prefix("/a//b").is_err());
    }
}
