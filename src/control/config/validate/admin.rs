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
