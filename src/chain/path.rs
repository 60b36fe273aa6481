//! The request path a route is chosen by, and the one the upstream receives: the same.
//!
//! A gateway that routes by one reading of a path while the upstream acts on another can be
//! walked around: `//orders` routed as `/` but served as `/orders` by a framework that
//! merges slashes, `/%6Frders` served as `/orders` by one that decodes first,
//! `/public/..;/admin` served as `/admin` by a servlet container. So the path is normalised
//! once, before routing, and the normalised path is what is forwarded:
//!
//! - runs of `/` become one `/` (`//orders` → `/orders`), as nginx's `merge_slashes`;
//! - percent-encoded unreserved characters are decoded (`%6F` → `o`, RFC 3986 §6.2.2.2) and
//!   the hex digits of the other percent-encodings are upper-cased (§6.2.2.1);
//!
//! and what no normalisation can make unambiguous is refused (400):
//!
//! - dot segments (`.` and `..`, also encoded): frameworks resolve them differently;
//! - backslashes (`\`, `%5C`), read as `/` by some servers;
//! - `;` and `%3B`: servlet containers strip `;parameters` from every segment;
//! - an encoded `/` (`%2F`): decoded into a separator by some frameworks, not by others;
//! - an encoded `%` (`%25`): a second decoding by the upstream would reveal any of the above;
//! - a malformed percent-encoding (`%`, `%4`, `%zz`), NUL and other control bytes.
//!
//! Letter case and trailing slashes are the router's business (`router.rs`). A route may then
//! rewrite the path it was chosen by (`strip_prefix`, `add_prefix`: `rewrite.rs`); the
//! upstream gets the normal form after that rewrite, nothing else.

use std::borrow::Cow;

/// Why a request path is refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPath {
    NotAbsolute,
    DotSegment,
    Backslash,
    Semicolon,
    EncodedSlash,
    EncodedPercent,
    BadPercent,
    ControlByte,
}

impl BadPath {
    pub fn detail(self) -> &'static str {
        match self {
            BadPath::NotAbsolute => "the request path must start with '/'",
            BadPath::DotSegment => "the request path must not contain '.' or '..' segments",
            BadPath::Backslash => "the request path must not contain backslashes",
            BadPath::Semicolon => "the request path must not contain ';' (path parameters)",
            BadPath::EncodedSlash => "the request path must not contain an encoded '/' (%2F)",
            BadPath::EncodedPercent => "the request path must not contain an encoded '%' (%25)",
            BadPath::BadPercent => {
                "the request path has a '%' not followed by two hexadecimal digits"
            }
            BadPath::ControlByte => "the request path must not contain control characters",
        }
    }
}

/// The normalised form of a request path (without its query), or why it is refused.
/// Borrowed when the path is already normal: the common case allocates nothing.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, BadPath> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(BadPath::NotAbsolute);
    }
    // `out` stays None until the first byte that changes; then it holds the path so far.
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (emit, advance): (Option<Emit>, usize) = match b {
            b'/' if i > 0 && bytes[i - 1] == b'/' => (None, 1),
            b'\\' => return Err(BadPath::Backslash),
            b';' => return Err(BadPath::Semicolon),
            0..=0x1f | 0x7f => return Err(BadPath::ControlByte),
            b'%' => {
                let (hi, lo) = match (bytes.get(i + 1), bytes.get(i + 2)) {
                    (Some(&hi), Some(&lo)) => (hex(hi), hex(lo)),
                    _ => (None, None),
                };
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(BadPath::BadPercent);
                };
                let value = hi << 4 | lo;
                match value {
                    b'/' => return Err(BadPath::EncodedSlash),
                    b'\\' => return Err(BadPath::Backslash),
                    b';' => return Err(BadPath::Semicolon),
                    b'%' => return Err(BadPath::EncodedPercent),
                    0..=0x1f | 0x7f => return Err(BadPath::ControlByte),
                    v if is_unreserved(v) => (Some(Emit::Byte(v)), 3),
                    v => (Some(Emit::Encoded(v)), 3),
                }
            }
            _ => (Some(Emit::Byte(b)), 1),
        };
        let original = &bytes[i..i + advance];
        match (&mut out, emit) {
            (None, Some(e)) if e.same_as(original) => {}
            (None, e) => {
                let mut v = Vec::with_capacity(bytes.len());
                v.extend_from_slice(&bytes[..i]);
                if let Some(e) = e {
                    e.push(&mut v);
                }
                out = Some(v);
            }
            (Some(v), Some(e)) => e.push(v),
            (Some(_), None) => {}
        }
        i += advance;
    }
    let normal: Cow<'_, str> = match out {
        None => Cow::Borrowed(path),
        // Only ASCII was changed or added: still UTF-8 where the input was.
        Some(v) => Cow::Owned(String::from_utf8(v).map_err(|_| BadPath::ControlByte)?),
    };
    if normal.split('/').any(|s| s == "." || s == "..") {
        return Err(BadPath::DotSegment);
    }
    Ok(normal)
}

enum Emit {
    Byte(u8),
    /// A byte kept percent-encoded, with upper-case hex digits.
    Encoded(u8),
}

impl Emit {
    fn same_as(&self, original: &[u8]) -> bool {
        match self {
            Emit::Byte(b) => original == [*b],
            Emit::Encoded(v) => original == encoded(*v),
        }
    }

    fn push(&self, out: &mut Vec<u8>) {
        match self {
            Emit::Byte(b) => out.push(*b),
            Emit::Encoded(v) => out.extend_from_slice(&encoded(*v)),
        }
    }
}

fn encoded(v: u8) -> [u8; 3] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [b'%', HEX[usize::from(v >> 4)], HEX[usize::from(v & 15)]]
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~".
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Validation of a configured `path_prefix` (used by the config loader): it must be a path
/// in the normal form requests are routed in ([`normalize`]).
pub fn check_path_prefix(prefix: &str) -> Result<(), String> {
    let expected = "expected a path like \"/orders\" (starting with '/', no query, spaces, empty or dot segments, ';', or escapes of unreserved characters)";
    if prefix
        .bytes()
        .any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#')
    {
        return Err(format!("{prefix:?}: {expected}"));
    }
    match normalize(prefix) {
        Ok(std::borrow::Cow::Borrowed(_)) => Ok(()),
        Ok(normal) => Err(format!("{prefix:?}: {expected}; write it as {normal:?}")),
        Err(_) => Err(format!("{prefix:?}: {expected}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, BadPath> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_unchanged() {
        for good in [
            "/",
            "/orders/1",
            "/a/...",
            "/file.json",
            "/.well-known/x",
            "/a%20b",
            "/caf%C3%A9",
            "/orders/",
        ] {
            assert!(
                matches!(normalize(good), Ok(Cow::Borrowed(p)) if p == good),
                "{good}"
            );
        }
    }

    #[test]
    fn empty_segments_collapse_and_unreserved_escapes_decode() {
        assert_eq!(norm("//orders"), Ok("/orders".into()));
        assert_eq!(norm("/echo//private///x"), Ok("/echo/private/x".into()));
        assert_eq!(norm("/orders//"), Ok("/orders/".into()));
        assert_eq!(norm("/%6Frders"), Ok("/orders".into()));
        assert_eq!(norm("/%7euser/%41-%5F"), Ok("/~user/A-_".into()));
        assert_eq!(norm("/caf%c3%a9"), Ok("/caf%C3%A9".into()));
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        for (bad, why) in [
            ("/a/../b", BadPath::DotSegment),
            ("/..", BadPath::DotSegment),
            ("/a/./b", BadPath::DotSegment),
            ("/a/%2e%2E/b", BadPath::DotSegment),
            ("/a/.%2e", BadPath::DotSegment),
            ("/%2E", BadPath::DotSegment),
            ("//..//x", BadPath::DotSegment),
            ("/a\\b", BadPath::Backslash),
            ("/a%5Cb", BadPath::Backslash),
            ("/a%5cb", BadPath::Backslash),
            ("/public/..;/admin", BadPath::Semicolon),
            ("/orders;jsessionid=1", BadPath::Semicolon),
            ("/orders%3Bx", BadPath::Semicolon),
            ("/orders%2F1", BadPath::EncodedSlash),
            ("/orders%2f1", BadPath::EncodedSlash),
            ("/%252e%252e/admin", BadPath::EncodedPercent),
            ("/a%", BadPath::BadPercent),
            ("/a%4", BadPath::BadPercent),
            ("/a%zz", BadPath::BadPercent),
            ("/a%00b", BadPath::ControlByte),
            ("/a\0b", BadPath::ControlByte),
            ("*", BadPath::NotAbsolute),
            ("", BadPath::NotAbsolute),
        ] {
            assert_eq!(norm(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn normalising_twice_changes_nothing() {
        for p in ["//a//b", "/%6Frders//x", "/caf%c3%a9/", "/a%20b"] {
            let once = norm(p).unwrap();
            assert_eq!(norm(&once), Ok(once.clone()), "{p}");
        }
    }
    #[test]
    fn configured_prefixes_are_checked() {
        assert!(check_path_prefix("/orders").is_ok());
        assert!(check_path_prefix("/admin/").is_ok());
        for bad in [
            "orders",
            "/a b",
            "/a?x",
            "//a",
            "/a/../b",
            "",
            "/a;b",
            "/%6Frders",
            "/a%2Fb",
        ] {
            assert!(check_path_prefix(bad).is_err(), "{bad}");
        }
    }
}
