//! `TURNSTILE.DECIDE`: `lua/check.lua` (`lua/decide.lua`'s decide_request) in native code.

use crate::algorithm::{self, Report};
use crate::args::{self, Time};
use crate::store;
use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

fn error(message: String) -> RedisError {
    RedisError::String(format!("ERR turnstile module: {message}"))
}

pub fn decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let numkeys = args
        .get(1)
        .ok_or(RedisError::WrongArity)
        .and_then(|n| args::number(n.as_slice(), "numkeys").map_err(error))?;
    let n = usize::try_from(numkeys).map_err(|_| RedisError::WrongArity)?;
    if n > args::MAX_LIMITS || args.len() < 2 + n {
        return Err(error(format!(
            "numkeys {n} past the arguments, or over {}",
            args::MAX_LIMITS
        )));
    }
    if ctx.is_keys_position_request() {
        for pos in 2..2 + n {
            ctx.key_at_pos(pos as i32);
        }
        return Ok(RedisValue::NoReply);
    }
    let argv: Vec<&[u8]> = args[2 + n..].iter().map(RedisString::as_slice).collect();
    let decision = args::decision(n, &argv).map_err(error)?;
    // SAFETY: an API function Redis fills in before any command runs.
    let clock = unsafe { raw::RedisModule_Milliseconds.unwrap()() };
    let now = match decision.time {
        Time::Clock => clock,
        Time::ClockPlus(ms) => clock + ms,
        Time::At(ms) => ms,
    };
    let keys = &args[2..2 + n];

    let mut states = Vec::with_capacity(n);
    let mut reports: Vec<Report> = Vec::with_capacity(n);
    let mut writes = Vec::with_capacity(n);
    let mut rejected: Option<&[u8]> = None;
    for (limit, key) in decision.limits.iter().zip(keys) {
        let state = store::read(ctx, key, limit, now)?;
        let (report, write) = algorithm::decide(limit, &state, now, limit.cost);
        if report[0] == 0 && rejected.is_none() && !limit.shadow {
            rejected = Some(limit.name);
        }
        states.push(state);
        reports.push(report);
        writes.push(write);
    }
    match rejected {
        None => {
            for (key, write) in keys.iter().zip(writes) {
                if let Some(write) = write {
                    store::apply(ctx, key, write, (clock, decision.slot_id))?;
                }
            }
        }
        Some(_) => {
            // Nothing is written: limits that would have admitted report their state as it stays.
            for (i, limit) in decision.limits.iter().enumerate() {
                if reports[i][0] == 1 {
                    reports[i] = algorithm::decide(limit, &states[i], now, 0).0;
                }
            }
        }
    }
    Ok(RedisValue::StringBuffer(reply(now, &reports, rejected)))
}

/// check.lua's reply: "<admitted> <now>", four integers per limit, then the rejecting limit's
/// name (after one more space; empty when admitted).
pub fn reply(now: i64, reports: &[Report], rejected: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 24 * reports.len());
    let mut buf = itoa::Buffer::new();
    out.push(if rejected.is_none() { b'1' } else { b'0' });
    out.push(b' ');
    out.extend_from_slice(buf.format(now).as_bytes());
    for report in reports {
        for v in report {
            out.push(b' ');
            out.extend_from_slice(buf.format(*v).as_bytes());
        }
    }
    out.push(b' ');
    out.extend_from_slice(rejected.unwrap_or_default());
    out
}
