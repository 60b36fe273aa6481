//! Whether a connection's Redis decides with turnstile's module (`module/`) or the Lua
//! scripts (`store.decide_with`), and a decision's call in the module's form.
//!
//! Asked at every connect (`TURNSTILE.VERSION`, in the pipeline that loads the scripts):
//! `auto` uses the module where it answers with a version this gateway speaks, `lua` never,
//! `module` refuses a connection to a Redis without it, naming why. A call the module
//! does not know (Redis restarted without it) turns it off and is sent again as its script;
//! the next connect asks again. A Cluster decides with Lua on every node (its batches name
//! keys of many slots, which a module command cannot declare).

use crate::limit::store::redis::config::DecideWith;
use crate::limit::store::redis::scripts::Scripts;
use redis::{Cmd, RedisError, Script};
use std::sync::atomic::{AtomicBool, Ordering};

/// The module's command set this gateway speaks (`TURNSTILE.VERSION`'s first number).
pub const MODULE_VERSION: &str = "1";

/// The store's choice and what the last connect found.
pub struct Native {
    with: DecideWith,
    on: AtomicBool,
}

impl Native {
    pub fn new(with: DecideWith) -> Native {
        Native {
            with,
            on: AtomicBool::new(false),
        }
    }

    /// Whether decisions go to the module now.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// "module" or "lua": what decides now (`/readyz`, the metric).
    pub fn path(&self) -> &'static str {
        if self.on() {
            "module"
        } else {
            "lua"
        }
    }

    /// What a new connection's `TURNSTILE.VERSION` answered (`Err`: an unknown command, on a
    /// Redis without the module). An error when `decide_with = "module"` and it is missing.
    pub fn found(&self, answer: Result<String, RedisError>) -> Result<(), RedisError> {
        let version = answer
            .ok()
            .filter(|v| v.split(' ').nth(1) == Some(MODULE_VERSION));
        let on = version.is_some() && self.with != DecideWith::Lua;
        let was = self.on.swap(on, Ordering::Relaxed);
        if on != was {
            log::info!("Redis decisions now by {}", self.path());
        }
        if self.with == DecideWith::Module && version.is_none() {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "store.decide_with = \"module\", but this Redis has no turnstile module of \
                 version 1 (load module/'s library with loadmodule, or set decide_with = \"auto\")",
            )));
        }
        Ok(())
    }

    /// The module answered that it does not know its own command: gone since the connect.
    pub fn lost(&self) {
        if self.on.swap(false, Ordering::Relaxed) {
            log::warn!("Redis no longer has the turnstile module: decisions by Lua");
        }
    }
}

/// The module's command for a call of `script` (a decision, a quota question, a batch of
/// them), if it has one.
pub fn verb(scripts: &Scripts, script: &Script) -> Option<&'static str> {
    let hash = script.get_hash();
    if hash == scripts.check.get_hash() {
        Some("TURNSTILE.DECIDE")
    } else if hash == scripts.batch.get_hash() {
        Some("TURNSTILE.BATCH")
    } else if hash == scripts.usage.get_hash() {
        Some("TURNSTILE.USAGE")
    } else {
        None
    }
}

/// `EVALSHA <sha> <numkeys> …` as `<verb> <numkeys> …`: the module takes the scripts'
/// arguments as they are.
pub fn native_cmd(cmd: &Cmd, verb: &'static str) -> Cmd {
    let args = || {
        cmd.args_iter().skip(2).filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
    };
    // Sized once: a batch's arguments run to kilobytes, grown step by step they were copied
    // again at each step.
    let bytes = verb.len() + args().map(<[u8]>::len).sum::<usize>();
    let mut native = Cmd::with_capacity(cmd.args_iter().len() - 1, bytes);
    native.arg(verb);
    for arg in args() {
        native.arg(arg);
    }
    native
}

/// Redis does not know the command (the module is not loaded).
pub fn unknown_command(e: &RedisError) -> bool {
    e.to_string().contains("unknown command")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_of_another_version_or_none_leaves_lua_deciding() {
        let auto = Native::new(DecideWith::Auto);
        assert!(
            auto.found(Ok("turnstile-module 1 0.1.0 decide".into()))
                .is_ok()
                && auto.on()
        );
        assert!(
            auto.found(Ok("turnstile-module 2 0.9.0 decide".into()))
                .is_ok()
                && !auto.on()
        );
        let unknown = RedisError::from((redis::ErrorKind::Client, "ERR unknown command"));
        let must = Native::new(DecideWith::Module);
        assert!(must.found(Err(unknown)).is_err() && !must.on());
        let lua = Native::new(DecideWith::Lua);
        assert!(lua.found(Ok("turnstile-module 1 0.1.0".into())).is_ok() && !lua.on());
    }

    #[test]
    fn a_script_call_becomes_the_modules_command_with_the_same_arguments() {
        let scripts = Scripts::new();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts.check.get_hash())
            .arg(1)
            .arg("k")
            .arg("")
            .arg(1);
        assert_eq!(verb(&scripts, &scripts.check), Some("TURNSTILE.DECIDE"));
        assert_eq!(verb(&scripts, &scripts.charge), None);
        let native = native_cmd(&cmd, "TURNSTILE.DECIDE");
        let args: Vec<_> = native.args_iter().collect();
        assert_eq!(args.len(), 5);
        assert!(matches!(args[0], redis::Arg::Simple(b"TURNSTILE.DECIDE")));
        assert!(matches!(args[1], redis::Arg::Simple(b"1")));
    }
}
