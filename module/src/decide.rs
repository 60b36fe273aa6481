//! `TURNSTILE.DECIDE`: `lua/check.lua` (`lua/decide.lua`'s decide_request) in native code.

use crate::algorithm::{self, Report};
use crate::args::{self, Kind, Time};
use crate::store;
use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

fn error(message: String) -> RedisError {
    RedisError::String(format!("ERR turnstile module: {message}"))
}

/// `numkeys` and the keys of a call laid out as EVAL's: `args[1]` the count, then the keys
/// (the Cluster's key positions when Redis asks for them: `None`, answered).
fn keys_of(ctx: &Context, args: &[RedisString], most: usize) -> Result<Option<usize>, RedisError> {
    let numkeys = args
        .get(1)
        .ok_or(RedisError::WrongArity)
        .and_then(|n| args::number(n.as_slice(), "numkeys").map_err(error))?;
    let n = usize::try_from(numkeys).map_err(|_| RedisError::WrongArity)?;
    if n > most || args.len() < 2 + n {
        return Err(error(format!(
            "numkeys {n} past the arguments, or over {most}"
        )));
    }
    if ctx.is_keys_position_request() {
        for pos in 2..2 + n {
            ctx.key_at_pos(pos as i32);
        }
        return Ok(None);
    }
    Ok(Some(n))
}

fn clock() -> i64 {
    // SAFETY: an API function Redis fills in before any command runs.
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

/// `TURNSTILE.DECIDE`: check.lua.
pub fn decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    single(ctx, &args, Kind::Decide)
}

/// `TURNSTILE.USAGE`: usage.lua (what a client has left, read without writing).
pub fn usage(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    single(ctx, &args, Kind::Usage)
}

/// One request's call, of `kind`, laid out as EVAL's.
fn single(ctx: &Context, args: &[RedisString], kind: Kind) -> RedisResult {
    let Some(n) = keys_of(ctx, args, args::MAX_LIMITS)? else {
        return Ok(RedisValue::NoReply);
    };
    let argv: Vec<&[u8]> = args[2 + n..].iter().map(RedisString::as_slice).collect();
    let reply = member(ctx, &args[2..2 + n], &argv, clock(), kind)?;
    Ok(RedisValue::StringBuffer(reply))
}

/// `TURNSTILE.BATCH`: batch.lua's decisions and quota questions, on one clock reading, in
/// arrival order; a member that cannot run answers "E <message>" alone and writes nothing.
/// Charges, refunds and releases stay Lua's: such a member answers "M" (not run here), and
/// the gateway sends it alone, as its own script.
pub fn batch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let most = args::MAX_LIMITS * args::MAX_MEMBERS;
    let Some(n) = keys_of(ctx, &args, most)? else {
        return Ok(RedisValue::NoReply);
    };
    let argv: Vec<&[u8]> = args[2 + n..].iter().map(RedisString::as_slice).collect();
    let members = args::batch(n, &argv).map_err(error)?;
    let (keys, clock) = (&args[2..2 + n], clock());
    let replies = members
        .iter()
        .map(|m| {
            let run = match m.kind {
                // "M": not run here, nothing written — the gateway sends it alone, as its
                // own script (as it does a Cluster member whose slot moved).
                Kind::Other(kind) => {
                    let lua = format!(
                        "M turnstile module: a member of kind {} is Lua's",
                        char::from(kind)
                    );
                    return RedisValue::StringBuffer(lua.into_bytes());
                }
                kind => member(
                    ctx,
                    &keys[m.keys.clone()],
                    &argv[m.args.clone()],
                    clock,
                    kind,
                ),
            };
            RedisValue::StringBuffer(run.unwrap_or_else(|e| {
                let message = e.to_string();
                let message = message.strip_prefix("ERR ").unwrap_or(&message);
                format!("E {message}").into_bytes()
            }))
        })
        .collect();
    Ok(RedisValue::Array(replies))
}

/// One request's decision (or quota question: every limit asked at cost 0, nothing written).
fn member(
    ctx: &Context,
    keys: &[RedisString],
    argv: &[&[u8]],
    clock: i64,
    kind: Kind,
) -> Result<Vec<u8>, RedisError> {
    let usage = kind == Kind::Usage;
    if usage && argv.len() != 3 + args::PER * keys.len() {
        return Err(error(format!(
            "expected 3 + 6 arguments per key, got {} for {} keys",
            argv.len(),
            keys.len()
        )));
    }
    let decision = args::decision(keys.len(), argv).map_err(error)?;
    let now = match decision.time {
        Time::Clock => clock,
        Time::ClockPlus(ms) => clock + ms,
        Time::At(ms) => ms,
    };
    // Each bucket's and window's key opened once, read and then written through its handle
    // — unless a key repeats in the call: a write through one handle would leave the other's
    // view stale, so such a call's writes reopen their keys (as Lua reads, then writes, each).
    let mut limits: Vec<Decided> = Vec::with_capacity(keys.len());
    let mut rejected: Option<&[u8]> = None;
    for (limit, key) in decision.limits.iter().zip(keys) {
        let handle = store::Handle::open(ctx, key, limit, !usage);
        let state = store::read(ctx, key, handle.as_ref(), limit, now)?;
        let cost = if usage { 0 } else { limit.cost };
        let (report, write) = algorithm::decide(limit, &state, now, cost);
        if report[0] == 0 && rejected.is_none() && !limit.shadow && !usage {
            rejected = Some(limit.name);
        }
        limits.push(Decided {
            handle,
            state,
            report,
            write,
        });
    }
    match rejected {
        None if usage => {}
        None => {
            let repeats = keys
                .iter()
                .enumerate()
                .any(|(i, a)| keys[..i].iter().any(|b| a.as_slice() == b.as_slice()));
            for (key, decided) in keys.iter().zip(&mut limits) {
                let handle = decided.handle.take().filter(|_| !repeats);
                if let Some(write) = decided.write.take() {
                    store::apply(ctx, key, handle, write, (clock, decision.slot_id))?;
                }
            }
        }
        Some(_) => {
            // Nothing is written: limits that would have admitted report their state as it stays.
            for (limit, decided) in decision.limits.iter().zip(&mut limits) {
                if decided.report[0] == 1 {
                    decided.report = algorithm::decide(limit, &decided.state, now, 0).0;
                }
            }
        }
    }
    Ok(reply(now, limits.iter().map(|d| &d.report), rejected))
}

/// One limit of a request's decision: its key's handle, its state, what it reports and what
/// it writes when the request is admitted.
struct Decided {
    handle: Option<store::Handle>,
    state: algorithm::State,
    report: Report,
    write: Option<algorithm::Write>,
}

/// check.lua's reply: "<admitted> <now>", four integers per limit, then the rejecting limit's
/// name (after one more space; empty when admitted).
pub fn reply<'a>(
    now: i64,
    reports: impl ExactSizeIterator<Item = &'a Report>,
    rejected: Option<&[u8]>,
) -> Vec<u8> {
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
