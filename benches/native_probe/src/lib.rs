//! A probe, not the product: what a token-bucket decision costs Redis when it runs as native
//! code in Redis (a module command) instead of Lua (`lua/token_bucket.lua` in
//! `lua/batch.lua`). `benches/load/redis_native.sh` counts both in instructions and
//! `benches/load/redis_core.sh` (`NATIVE_PROBE=<this library>`) in decisions per Redis
//! core-second; BENCHMARKS.md has the results.
//!
//! `TSPROBE.BATCH m member…` decides m requests, each `n` then per limit `key limit window_ms
//! burst`, one unit each, on one clock reading, as `batch.lua` decides its members: the same
//! arithmetic (token·ms levels), the same reply per member (`decide.lua`'s string, without a
//! rejected limit's name), nothing written unless every limit of the member admits, every
//! key's TTL the time until its bucket is full again plus a second. A wrong argument or key
//! fails the whole call (the members before it stay written): unlike `batch.lua`, whose
//! members fail alone.
//!
//! `TSPROBE.FLOOR numkeys key… m member…` takes turnstile's module's `TURNSTILE.BATCH` calls
//! and does per key only the lookup, the write of its algorithm's stored form, the expiry and
//! their replication: the floor under that module's batched rows (`floor` below).
//!
//! What it does differently, because native code can: a bucket is read and rewritten in place
//! (Redis's string DMA), where Lua reads and writes it with `GET` and `SET … PX`; as 16 bytes
//! (`TSPROBE.BATCH`) or as Lua's own text (`TSPROBE.BATCHTEXT`, the same arguments: the form
//! a module sharing keys with the Lua scripts would keep). Not built: windows, logs, concurrency,
//! refunds, charges, leases, a Cluster's key positions — nothing beyond the measured path.
use redis_module::{
    key::RedisKeyWritable, raw, redis_module, Context, KeyType, RedisError, RedisResult,
    RedisString, RedisValue,
};
use std::fmt::Write;
use std::time::Duration;

const TTL_GRACE_MS: i64 = 1000;

fn arg(args: &[RedisString], i: usize) -> Result<i64, RedisError> {
    let v = args.get(i).ok_or(RedisError::WrongArity)?.parse_integer()?;
    if v < 0 {
        return Err(RedisError::Str("ERR negative argument"));
    }
    Ok(v)
}

/// How a bucket is stored: 16 bytes (its level in token·ms and the time of its last update
/// in ms, little-endian), or Lua's own text, `"<level> <updated>"` (`lua/lib.lua`'s
/// `bucket_of` and `bucket_text`) — the form a module sharing keys with the Lua scripts would
/// keep.
#[derive(Clone, Copy)]
enum Form {
    Bytes,
    Text,
}

impl Form {
    fn read(self, b: &[u8]) -> Option<(i64, i64)> {
        match self {
            Form::Bytes => {
                let level = i64::from_le_bytes(b.get(..8)?.try_into().ok()?);
                let updated = i64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
                (b.len() == 16).then_some((level, updated))
            }
            Form::Text => {
                let (level, updated) = std::str::from_utf8(b).ok()?.split_once(' ')?;
                Some((level.parse().ok()?, updated.parse().ok()?))
            }
        }
    }

    /// Rewrites the key's value in place (string DMA: no delete and re-add of the key).
    fn write(self, key: &RedisKeyWritable, level: i64, time: i64) -> Result<(), RedisError> {
        let mut dma = key.as_string_dma()?;
        match self {
            Form::Bytes => {
                let mut value = [0u8; 16];
                value[..8].copy_from_slice(&level.to_le_bytes());
                value[8..].copy_from_slice(&time.to_le_bytes());
                dma.write(&value)?;
            }
            Form::Text => {
                dma.write(format!("{level} {time}").as_bytes())?;
            }
        }
        Ok(())
    }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn batch(ctx: &Context, args: Vec<RedisString>, form: Form) -> RedisResult {
    // SAFETY: a function the module API sets before any command runs.
    let now = unsafe { raw::RedisModule_Milliseconds.ok_or(RedisError::Str("ERR no clock"))?() };
    let m = arg(&args, 1)? as usize;
    let (mut p, mut replies) = (2, Vec::with_capacity(m.min(1024)));
    for _ in 0..m {
        let n = arg(&args, p)? as usize;
        p += 1;
        let mut reply = format!("1 {now}");
        let mut writes = Vec::with_capacity(n.min(64));
        let mut admitted = true;
        for i in 0..n {
            let o = p + 4 * i;
            let key_name = args.get(o).ok_or(RedisError::WrongArity)?;
            let (limit, window, burst) =
                (arg(&args, o + 1)?, arg(&args, o + 2)?, arg(&args, o + 3)?);
            if limit == 0 || window == 0 || burst == 0 {
                return Err(RedisError::Str("ERR a limit, window or burst of 0"));
            }
            let key = ctx.open_key_writable(key_name);
            let cap = burst
                .checked_mul(window)
                .ok_or(RedisError::Str("ERR burst × window overflows"))?;
            let (mut level, mut updated) = (cap, 0);
            match key.key_type() {
                KeyType::Empty => {}
                KeyType::String => {
                    (level, updated) = form
                        .read(&key.as_string_dma()?)
                        .ok_or(RedisError::Str("ERR a key holds no bucket"))?;
                }
                _ => return Err(RedisError::Str("WRONGTYPE a key holds no bucket")),
            }
            level = cap.min(level.saturating_add((now - updated).max(0).saturating_mul(limit)));
            let need = window;
            if level >= need {
                let after = level - need;
                let reset = ceil_div(cap - after, limit);
                let _ = write!(reply, " 1 {} {reset} 0", after / window);
                writes.push((key, after, now.max(updated), reset));
            } else {
                admitted = false;
                let (reset, retry) = (ceil_div(cap - level, limit), ceil_div(need - level, limit));
                let _ = write!(reply, " 0 {} {reset} {retry}", level / window);
            }
        }
        if admitted {
            for (key, level, time, reset) in writes {
                form.write(&key, level, time)?;
                key.set_expire(Duration::from_millis((reset + TTL_GRACE_MS) as u64))?;
            }
        } else {
            reply.replace_range(..1, "0");
        }
        reply.push(' ');
        replies.push(RedisValue::BulkString(reply));
        p += 4 * n;
    }
    if p != args.len() {
        return Err(RedisError::WrongArity);
    }
    Ok(RedisValue::Array(replies))
}

fn batch_bytes(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    batch(ctx, args, Form::Bytes)
}

fn batch_text(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    batch(ctx, args, Form::Text)
}

/// A window's field names as Redis strings, made once (as turnstile's module makes them).
struct Fields([usize; 3]);

fn fields() -> [*mut raw::RedisModuleString; 3] {
    static FIELDS: std::sync::OnceLock<Fields> = std::sync::OnceLock::new();
    let made = FIELDS.get_or_init(|| {
        // SAFETY: a function the module API sets before any command runs; no context: kept.
        Fields(["s", "c", "p"].map(|f| unsafe {
            raw::RedisModule_CreateString.unwrap()(std::ptr::null_mut(), f.as_ptr().cast(), 1)
                as usize
        }))
    });
    made.0.map(|f| f as *mut raw::RedisModuleString)
}

/// `TSPROBE.FLOOR numkeys key… m member…`: `TURNSTILE.BATCH`'s call (the same keys and
/// arguments, so Redis reads and parses the same), doing per key only what any native decision
/// keeping Lua's stored form must, as turnstile's module does it: the key looked up, then a
/// bucket's text ("<level> <time>") rewritten in place with its absolute expiry and the write
/// replicated as `SET … PXAT`, or a window's HASH fields `s`, `c`, `p` set with its expiry,
/// replicated as `HSET` and `PEXPIREAT`. No arithmetic, no argument read but each limit's
/// algorithm: the floor under the module's rows of the same plans
/// (`MODULE=1 NATIVE=1 make bench-redis-core`).
fn floor(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let numkeys = arg(&args, 1)? as usize;
    let m = arg(&args, 2 + numkeys)?;
    // SAFETY: functions the module API sets before any command runs.
    let now = unsafe { raw::RedisModule_Milliseconds.ok_or(RedisError::Str("ERR no clock"))?() };
    let at = now + 61_000;
    let text = format!("{} {now}", 1_000_000_000_000i64);
    let keys = args.get(2..2 + numkeys).ok_or(RedisError::WrongArity)?;
    let (mut key_at, mut p) = (0, 3 + numkeys);
    for _ in 0..m {
        // A decision member: n, a, then "time cost slot" and six arguments per limit.
        let (n, a) = (arg(&args, p)? as usize, arg(&args, p + 1)? as usize);
        for i in 0..n {
            let algorithm = args
                .get(p + 2 + 3 + 6 * i + 1)
                .ok_or(RedisError::WrongArity)?;
            let name = keys.get(key_at).ok_or(RedisError::WrongArity)?;
            key_at += 1;
            let key = raw::open_key(
                ctx.get_raw(),
                name.inner,
                raw::KeyMode::READ | raw::KeyMode::WRITE,
            );
            let wrote = match algorithm.as_slice() {
                b"tb" | b"lb" => bucket_floor(ctx, key, name, &text, at),
                _ => window_floor(ctx, key, name, now, at),
            };
            raw::close_key(key);
            wrote?;
        }
        p += 2 + a;
    }
    Ok(RedisValue::Array(
        (0..m)
            .map(|_| RedisValue::SimpleStringStatic("1"))
            .collect(),
    ))
}

fn bucket_floor(
    ctx: &Context,
    key: *mut raw::RedisModuleKey,
    name: &RedisString,
    text: &str,
    at: i64,
) -> Result<(), RedisError> {
    let mut len = 0;
    if raw::string_truncate(key, text.len()) == raw::Status::Err {
        return Err(RedisError::Str("WRONGTYPE not a string"));
    }
    let buf = raw::string_dma(key, &mut len, raw::KeyMode::WRITE);
    // SAFETY: Redis's buffer of `len` bytes, just sized to the text; the handle is open for
    // writing; each replicated argument of its format letter's kind.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), len);
        raw::RedisModule_SetAbsExpire.unwrap()(key, at);
        raw::RedisModule_Replicate.unwrap()(
            ctx.get_raw(),
            c"SET".as_ptr(),
            c"sbcl".as_ptr(),
            name.inner,
            text.as_ptr(),
            text.len(),
            c"PXAT".as_ptr(),
            at as std::ffi::c_longlong,
        );
    }
    Ok(())
}

fn window_floor(
    ctx: &Context,
    key: *mut raw::RedisModuleKey,
    name: &RedisString,
    now: i64,
    at: i64,
) -> Result<(), RedisError> {
    let [s, c, p] = fields();
    // SAFETY: functions the module API sets before any command runs; field names each
    // followed by its value, the list ended by NULL; each replicated argument of its format
    // letter's kind; the values freed once used.
    unsafe {
        let number = raw::RedisModule_CreateStringFromLongLong.unwrap();
        let (vs, vc, vp) = (
            number(std::ptr::null_mut(), now),
            number(std::ptr::null_mut(), 1),
            number(std::ptr::null_mut(), 0),
        );
        let end = std::ptr::null::<std::ffi::c_char>();
        raw::RedisModule_HashSet.unwrap()(key, 0, s, vs, c, vc, p, vp, end);
        let status = raw::RedisModule_SetAbsExpire.unwrap()(key, at);
        let r = raw::RedisModule_Replicate.unwrap();
        r(
            ctx.get_raw(),
            c"HSET".as_ptr(),
            c"sssssss".as_ptr(),
            name.inner,
            s,
            vs,
            c,
            vc,
            p,
            vp,
        );
        r(
            ctx.get_raw(),
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            name.inner,
            at,
        );
        for v in [vs, vc, vp] {
            raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), v);
        }
        if status != raw::REDISMODULE_OK as i32 {
            return Err(RedisError::Str("WRONGTYPE not a hash"));
        }
    }
    Ok(())
}

redis_module! {
    name: "tsprobe",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["tsprobe.batch", batch_bytes, "write deny-oom", 0, 0, 0, ""],
        ["tsprobe.batchtext", batch_text, "write deny-oom", 0, 0, 0, ""],
        ["tsprobe.floor", floor, "write deny-oom", 0, 0, 0, ""],
    ],
}
