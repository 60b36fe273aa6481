//! `[admin]`.

use super::checks::*;
use crate::control::config::defaults;
use crate::control::config::file::AdminFile;
use crate::control::config::model::AdminConfig;
use std::net::SocketAddr;

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

pub(super) fn admin_config(file: AdminFile, problems: &mut Problems) -> AdminConfig {
    let AdminFile { listen, token } = file;
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
    let token = token.and_then(|t| secret("admin.token", &t, problems));
    let token = token.map(|t| t.expose().to_owned());
    if let Some(token) = &token {
        if token.len() < MIN_ADMIN_TOKEN_LEN || !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            // The token itself is never echoed.
            problems.push(
                "admin.token",
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} visible ASCII characters"),
            );
        }
    }
    AdminConfig { listen, token }
}
