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
//! `TSPROBE.FLOOR numkeys key… m arg…` takes turnstile's module's `TURNSTILE.BATCH` calls and
//! does per key only the lookup, an in-place write, the expiry and its replication: the floor
//! under that module's batched rows (`floor` below).
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

/// `TSPROBE.FLOOR numkeys key… m arg…`: `TURNSTILE.BATCH`'s call (the same keys and
/// arguments, so Redis reads and parses the same), doing per key only what any native decision
/// keeping Lua's stored form must: the key looked up, its value rewritten in place
/// ("<level> <time>", Lua's bucket text), its absolute expiry set, and the write replicated as
/// its effect (`SET … PXAT`). No arithmetic, no argument read past the keys: the floor under
/// the module's rows of the same plans (`MODULE=1 NATIVE=1 make bench-redis-core`).
fn floor(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let numkeys = arg(&args, 1)? as usize;
    let m = arg(&args, 2 + numkeys)?;
    // SAFETY: functions the module API sets before any command runs.
    let now = unsafe { raw::RedisModule_Milliseconds.ok_or(RedisError::Str("ERR no clock"))?() };
    let at = now + 61_000;
    let text = format!("{} {now}", 1_000_000_000_000i64);
    for name in args.get(2..2 + numkeys).ok_or(RedisError::WrongArity)? {
        let key = raw::open_key(
            ctx.get_raw(),
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        let mut len = 0;
        if raw::string_truncate(key, text.len()) == raw::Status::Err {
            raw::close_key(key);
            return Err(RedisError::Str("WRONGTYPE not a string"));
        }
        let buf = raw::string_dma(key, &mut len, raw::KeyMode::WRITE);
        // SAFETY: Redis's buffer of `len` bytes, just sized to the text.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), len) };
        // SAFETY: as above; the handle is open for writing.
        unsafe {
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
        raw::close_key(key);
    }
    Ok(RedisValue::Array(
        (0..m)
            .map(|_| RedisValue::SimpleStringStatic("1"))
            .collect(),
    ))
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
