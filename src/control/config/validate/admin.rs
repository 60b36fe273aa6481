//! `[admin]`.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::AdminFile;
use crate::control::config::model::AdminConfig;
use std::net::SocketAddr;

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

pub(super) fn admin_config(file: AdminFile, problems: &mut Problems) -> AdminConfig {
    let AdminFile {
        listen,
        token,
        tokens: named,
        read_tokens,
        hosts,
    } = file;
    let text = listen.unwrap_or_else(|| defaults::ADMIN_LISTEN.to_owned());
    let listen = text.parse::<SocketAddr>().unwrap_or_else(|_| {
        problems.push(
            "admin.listen",
            format!("{text:?} is not an address: expected ip:port like \"127.0.0.1:9090\""),
        );
        defaults::ADMIN_LISTEN
            .parse()
            .expect("default admin address parses")
    });
    let mut tokens = Vec::new();
    let readers: Vec<String> = read_tokens
        .as_ref()
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default();
    let sources = token
        .map(|t| ("admin".to_owned(), "admin.token".to_owned(), t))
        .into_iter()
        .chain(
            named
                .unwrap_or_default()
                .into_iter()
                .map(|(name, t)| (name.clone(), format!("admin.tokens.{name}"), t)),
        )
        .chain(
            read_tokens
                .unwrap_or_default()
                .into_iter()
                .map(|(name, t)| (name.clone(), format!("admin.read_tokens.{name}"), t)),
        );
    for (name, path, source) in sources {
        if path != "admin.token" {
            check_name(&path, &name, problems);
        }
        let Some(value) = secret(&path, &source, problems) else {
            continue;
        };
        let value = value.expose().to_owned();
        if value.len() < MIN_ADMIN_TOKEN_LEN || !value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            // The token itself is never echoed.
            problems.push(
                &path,
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters"),
            );
        } else if let Some(why) = guessable(&value) {
            problems.push(&path, why);
        } else if tokens.iter().any(|(n, t)| *n == name || *t == value) {
            problems.push(&path, "the same name or token twice");
        } else {
            tokens.push((name, value));
        }
    }
    let hosts = hosts
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(i, host)| {
            let ok = !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'));
            if !ok {
                problems.push(
                    format!("admin.hosts[{i}]"),
                    format!("{host:?}: expected a host name (A-Z a-z 0-9 - ., no port)"),
                );
            }
            ok.then(|| host.to_ascii_lowercase())
        })
        .collect();
    AdminConfig {
        listen,
        tokens,
        readers,
        hosts,
    }
}

/// The least estimated entropy of an admin token, in bits.
pub const MIN_TOKEN_BITS: f64 = 48.0;

/// Why `token` is too easy to guess, judged by more than its length: too few distinct
/// characters, mostly repeats or steps (`aaaa…`, `abab…`, `abcd…`, `1234…`), or too little
/// entropy as estimated from how often each character occurs (a lower bound for a random
/// value: 16 random hex digits come out near 55 bits). Never echoes the token.
pub fn guessable(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    let mut counts = [0usize; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let distinct = counts.iter().filter(|&&c| c > 0).count();
    let n = bytes.len() as f64;
    let bits: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2() * n
        })
        .sum();
    let steps = bytes
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) <= 1)
        .count();
    let patterned = 2 * steps > bytes.len().saturating_sub(1);
    let advice = "use a random value, e.g. `openssl rand -hex 32`";
    if distinct < 8 || patterned {
        return Some(format!(
            "too easy to guess: a repeated or sequential pattern ({distinct} distinct characters); {advice}"
        ));
    }
    (bits < MIN_TOKEN_BITS).then(|| {
        format!("too easy to guess: about {bits:.0} bits, at least {MIN_TOKEN_BITS:.0} needed; {advice}")
    })
}

#[cfg(test)]
mod tests {
    use super::guessable;

    #[test]
    fn a_token_is_judged_by_more_than_its_length() {
        for weak in [
            "aaaaaaaaaaaaaaaa",
            "abababababababab",
            "abcdefghijklmnop",
            "0123456789012345",
            "aaaaaaaaaaaaaaab",
            "abcdabcdabcdabcdabcd",
        ] {
            assert!(guessable(weak).is_some(), "{weak} accepted");
            assert!(!guessable(weak).unwrap().contains(weak), "echoed");
        }
        for strong in [
            "c0nsole-admin-token-0123456789",
            "admin-token-0123456789",
            "9f86d081884c7d659a2feaa0c55ad015",
            "Zq7-Yv2_pL9xR4tW",
            "demo-admin-token-0001",
        ] {
            assert_eq!(guessable(strong), None, "{strong}");
        }
    }
}
