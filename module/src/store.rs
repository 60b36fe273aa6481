//! A limit's key, read and written in Redis's keyspace in the Lua scripts' stored form — and
//! every write replicated as its effect (`SET … PXAT`, `HSET`, `PEXPIREAT`): a replica or an
//! AOF replay applies what the primary wrote and never decides again on its own clock.

use crate::algorithm::{State, Write};
use crate::args::{Algorithm, Limit};
use redis_module::{raw, Context, RedisError, RedisString, RedisValue};
use std::ffi::{c_char, c_longlong};
use std::ptr::null_mut;

/// How an algorithm stores its state.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// A STRING "<level> <updated>[ <turn> …]" (token and leaky buckets).
    Bucket,
    /// A HASH `s`, `c`, `p` (fixed, calendar and sliding windows).
    Window,
    /// A ZSET of entries (sliding log) or slots (concurrency), read and written by commands.
    Zset,
}

fn form(limit: &Limit) -> Form {
    match limit.algorithm {
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => Form::Bucket,
        Algorithm::SlidingLog | Algorithm::Concurrency => Form::Zset,
        _ => Form::Window,
    }
}

/// A window's field names as Redis strings, made once: `RedisModule_HashGet` and `_HashSet`
/// make a new string of every C-string field name on every call, and `RedisModule_Replicate`
/// another; these are passed by reference instead (Redis copies a field name it stores).
struct Fields {
    s: *mut raw::RedisModuleString,
    c: *mut raw::RedisModuleString,
    p: *mut raw::RedisModuleString,
}

// SAFETY: made once and never freed or changed; Redis runs module commands on its main
// thread, the only one that passes them to Redis.
unsafe impl Sync for Fields {}
unsafe impl Send for Fields {}

fn fields() -> &'static Fields {
    static FIELDS: std::sync::OnceLock<Fields> = std::sync::OnceLock::new();
    FIELDS.get_or_init(|| {
        // SAFETY: a function Redis fills in before any command runs; no context: a string
        // of no command's, kept for the module's life.
        let make = |name: &str| unsafe {
            raw::RedisModule_CreateString.unwrap()(null_mut(), name.as_ptr().cast(), name.len())
        };
        Fields {
            s: make("s"),
            c: make("c"),
            p: make("p"),
        }
    })
}

/// A bucket's or a window's key opened for writing: Redis's own handle, opened once for a
/// decision's read and its write (one lookup of the key, its value rewritten in place).
pub struct Handle(*mut raw::RedisModuleKey);

impl Handle {
    /// `limit`'s key opened for its decision (`write`), or for a quota question (read only:
    /// a missing key's handle is NULL, which reads as empty); None for a ZSET algorithm,
    /// whose reads and writes are commands (`RedisModule_Call`) that must not meet an open
    /// handle.
    pub fn open(ctx: &Context, name: &RedisString, limit: &Limit, write: bool) -> Option<Handle> {
        if form(limit) == Form::Zset {
            return None;
        }
        let mode = match write {
            true => raw::KeyMode::READ | raw::KeyMode::WRITE,
            false => raw::KeyMode::READ,
        };
        Some(Handle(raw::open_key(ctx.get_raw(), name.inner, mode)))
    }

    fn writable(ctx: &Context, name: &RedisString) -> Handle {
        Handle(raw::open_key(
            ctx.get_raw(),
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        ))
    }

    fn kind(&self) -> isize {
        // SAFETY: a function Redis fills in before any command runs; an open handle.
        unsafe { raw::RedisModule_KeyType.unwrap()(self.0) as isize }
    }

    /// A STRING key's bytes, read in place.
    fn text(&self) -> &[u8] {
        let mut len = 0;
        let at = raw::string_dma(self.0, &mut len, raw::KeyMode::READ);
        if at.is_null() {
            return &[];
        }
        // SAFETY: Redis's buffer of `len` bytes, unchanged while the handle is only read.
        unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) }
    }

    /// A STRING key's value set in place to `len` bytes that `fill` writes (created when
    /// missing; no delete and re-add of the key, whose expiry is set next): the bytes written.
    fn set_text(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<&[u8], RedisError> {
        ok(raw::string_truncate(self.0, len))?;
        let mut got = 0;
        let at = raw::string_dma(self.0, &mut got, raw::KeyMode::WRITE);
        if at.is_null() || got != len {
            return Err(RedisError::Str("ERR turnstile module: a write failed"));
        }
        // SAFETY: Redis's writable buffer of exactly `len` bytes, just sized, not touched by
        // Redis while this handle is borrowed.
        let text = unsafe { std::slice::from_raw_parts_mut(at.cast::<u8>(), len) };
        fill(text);
        Ok(text)
    }

    /// A window's fields `s`, `c` and `p` in one `RedisModule_HashGet` call, each a decimal
    /// integer (a missing `s`: no window).
    fn window(&self) -> Result<State, RedisError> {
        let mut found: [*mut raw::RedisModuleString; 3] = [null_mut(); 3];
        let [s, c, p] = &mut found;
        let f = fields();
        // SAFETY: field names, each followed by where its value goes (left NULL when the
        // field is missing), the list ended by NULL.
        unsafe {
            raw::RedisModule_HashGet.unwrap()(
                self.0,
                raw::REDISMODULE_HASH_NONE as i32,
                f.s,
                s as *mut _,
                f.c,
                c as *mut _,
                f.p,
                p as *mut _,
                std::ptr::null::<c_char>(),
            )
        };
        let mut fields = [None; 3];
        for (field, value) in fields.iter_mut().zip(found.map(Owned)) {
            if let Some(text) = value.bytes() {
                *field =
                    Some(crate::args::number(text, "a window's field").map_err(|_| {
                        RedisError::Str("ERR turnstile module: a key holds no window")
                    })?);
            }
        }
        Ok(match fields {
            [None, ..] => State::Missing,
            [Some(start), count, previous] => State::Window {
                start,
                count: count.unwrap_or(0),
                previous: previous.unwrap_or(0),
            },
        })
    }

    /// A window's fields `s`, `c` (and `p`) in one `RedisModule_HashSet` call (its answer
    /// counts fields replaced: nothing to fail on, the key a HASH or missing, open to write).
    fn set_window(&self, s: &Owned, c: &Owned, p: Option<&Owned>) {
        let (f, end) = (fields(), std::ptr::null::<c_char>());
        let flags = raw::REDISMODULE_HASH_NONE as i32;
        // SAFETY: a function Redis fills in before any command runs; field names, each
        // followed by its value, the list ended by NULL.
        unsafe {
            let set = raw::RedisModule_HashSet.unwrap();
            match p {
                Some(p) => set(self.0, flags, f.s, s.0, f.c, c.0, f.p, p.0, end),
                None => set(self.0, flags, f.s, s.0, f.c, c.0, end),
            };
        }
    }

    fn set_count(&self, c: &Owned) {
        let flags = raw::REDISMODULE_HASH_NONE as i32;
        let end = std::ptr::null::<c_char>();
        // SAFETY: as set_window's, one field.
        unsafe { raw::RedisModule_HashSet.unwrap()(self.0, flags, fields().c, c.0, end) };
    }

    fn expire_at(&self, at_ms: i64) -> Result<(), RedisError> {
        // SAFETY: checked present at load (lib.rs); the handle is open for writing.
        let status = unsafe { raw::RedisModule_SetAbsExpire.unwrap()(self.0, at_ms) };
        if status != raw::REDISMODULE_OK as i32 {
            return Err(RedisError::Str(
                "ERR turnstile module: could not set a key's expiry",
            ));
        }
        Ok(())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        raw::close_key(self.0);
    }
}

/// A Redis string this module made (or was handed by `RedisModule_HashGet`), freed on drop.
struct Owned(*mut raw::RedisModuleString);

impl Owned {
    fn number(n: i64) -> Owned {
        // SAFETY: a function Redis fills in before any command runs; no context (freed here,
        // not by automatic memory).
        Owned(unsafe { raw::RedisModule_CreateStringFromLongLong.unwrap()(null_mut(), n) })
    }

    fn bytes(&self) -> Option<&[u8]> {
        if self.0.is_null() {
            return None;
        }
        let mut len = 0;
        let at = raw::string_ptr_len(self.0, &mut len);
        // SAFETY: the string's own buffer of `len` bytes, alive while self is.
        Some(unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) })
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a string this value owns one reference to.
            unsafe { raw::RedisModule_FreeString.unwrap()(null_mut(), self.0) };
        }
    }
}

/// `limit`'s state in the key `name` at `now`, as its algorithm keeps it (read through
/// `key`, the handle Handle::open gave — or one opened here when the decision has none).
pub fn read(
    ctx: &Context,
    name: &RedisString,
    key: Option<&Handle>,
    limit: &Limit,
    now: i64,
) -> Result<State, RedisError> {
    let form = form(limit);
    if form == Form::Zset {
        let after = match limit.algorithm {
            Algorithm::SlidingLog => now - limit.window,
            _ => now,
        };
        return live(ctx, name, after);
    }
    let opened;
    let key = match key {
        Some(key) => key,
        None => {
            opened = Handle::writable(ctx, name);
            &opened
        }
    };
    match (key.kind(), form) {
        (raw::REDISMODULE_KEYTYPE_EMPTY, _) => Ok(State::Missing),
        (raw::REDISMODULE_KEYTYPE_STRING, Form::Bucket) => bucket_of(key.text()).ok_or(
            RedisError::Str("ERR turnstile module: a key holds no bucket"),
        ),
        (raw::REDISMODULE_KEYTYPE_HASH, Form::Window) => key.window(),
        _ => Err(RedisError::Str(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        )),
    }
}

/// The scores of a ZSET's members scored after `after`, ascending (a WRONGTYPE key: the
/// command's own error, as the script's ZCOUNT gives).
fn live(ctx: &Context, name: &RedisString, after: i64) -> Result<State, RedisError> {
    let from = format!("({after}");
    let args: [&[u8]; 4] = [name.as_slice(), from.as_bytes(), b"+inf", b"WITHSCORES"];
    let RedisValue::Array(items) = ctx.call("ZRANGEBYSCORE", &args[..])? else {
        return Err(RedisError::Str(
            "ERR turnstile module: ZRANGEBYSCORE answered no array",
        ));
    };
    let mut scores = Vec::with_capacity(items.len() / 2);
    for score in items.iter().skip(1).step_by(2) {
        let text = match score {
            RedisValue::BulkString(s) => s.as_bytes(),
            RedisValue::StringBuffer(s) => s.as_slice(),
            RedisValue::SimpleString(s) => s.as_bytes(),
            _ => &[],
        };
        let score = crate::args::number(text, "a score")
            .map_err(|_| RedisError::Str("ERR turnstile module: a member's score is no time"))?;
        scores.push(score);
    }
    Ok(State::Live(scores))
}

/// `lua/lib.lua`'s bucket_of: "<level> <updated>", then a leaky bucket's turns given back
/// (every run of digits after them, as the script's `gmatch('%d+')`).
fn bucket_of(text: &[u8]) -> Option<State> {
    let digits = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_digit()).count();
    let l = digits(text);
    let rest = text.get(l + 1..)?;
    let t = digits(rest);
    if l == 0 || t == 0 || text[l] != b' ' || l > 15 || t > 15 {
        return None;
    }
    let number = |b: &[u8]| crate::args::number(b, "").ok();
    let turns = rest[t..]
        .split(|c| !c.is_ascii_digit())
        .filter(|run| !run.is_empty())
        .map(number)
        .collect::<Option<Vec<i64>>>()?;
    Some(State::Bucket {
        level: number(&text[..l])?,
        updated: number(&rest[..t])?,
        turns,
    })
}

fn ok(status: raw::Status) -> Result<(), RedisError> {
    match status {
        raw::Status::Ok => Ok(()),
        raw::Status::Err => Err(RedisError::Str("ERR turnstile module: a write failed")),
    }
}

/// `RedisModule_Replicate` of `command` with `format`'s arguments (`s` a Redis string, `b` a
/// buffer and its length, `c` a C string, `l` an integer): the write's effect, for replicas
/// and the AOF, built from what the write itself used — no copy of a value.
macro_rules! replicate {
    ($ctx:expr, $command:expr, $format:expr, $($arg:expr),+) => {
        // SAFETY: a function Redis fills in before any command runs; each argument of the
        // kind its format letter names, alive for the call.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                $ctx.get_raw(),
                $command.as_ptr(),
                $format.as_ptr(),
                $($arg),+
            )
        }
    };
}

/// Applies `write` to the key `name` — through `key`, the handle its read used, or one
/// opened here — (`clock`: Redis's clock now, ms, which TTLs count from), and replicates it
/// as its effect.
pub fn apply(
    ctx: &Context,
    name: &RedisString,
    key: Option<Handle>,
    write: Write,
    (clock, slot_id): (i64, &[u8]),
) -> Result<(), RedisError> {
    let open = |key: Option<Handle>| key.unwrap_or_else(|| Handle::writable(ctx, name));
    match write {
        Write::Bucket {
            level,
            time,
            turns,
            ttl,
        } => {
            let key = open(key);
            // "<level> <time>[ <turn> …]", written straight into the key's value.
            let numbers = || [level, time].into_iter().chain(turns.iter().copied());
            let mut buf = itoa::Buffer::new();
            let len = numbers().map(|n| buf.format(n).len() + 1).sum::<usize>() - 1;
            let text = key.set_text(len, |out| {
                let mut at = 0;
                for n in numbers() {
                    if at > 0 {
                        out[at] = b' ';
                        at += 1;
                    }
                    let digits = buf.format(n).as_bytes();
                    out[at..at + digits.len()].copy_from_slice(digits);
                    at += digits.len();
                }
            })?;
            let at = clock + ttl;
            key.expire_at(at)?;
            let (value, len) = (text.as_ptr().cast::<c_char>(), text.len());
            replicate!(
                ctx,
                c"SET",
                c"sbcl",
                name.inner,
                value,
                len,
                c"PXAT".as_ptr(),
                at as c_longlong
            );
        }
        Write::Count { count } => {
            let key = open(key);
            let c = Owned::number(count);
            key.set_count(&c);
            replicate!(ctx, c"HSET", c"sss", name.inner, fields().c, c.0);
        }
        Write::Window {
            start,
            count,
            previous,
            ttl,
        } => {
            let key = open(key);
            let (s, c) = (Owned::number(start), Owned::number(count));
            let p = previous.map(Owned::number);
            key.set_window(&s, &c, p.as_ref());
            let f = fields();
            match &p {
                Some(p) => {
                    replicate!(ctx, c"HSET", c"sssssss", name.inner, f.s, s.0, f.c, c.0, f.p, p.0)
                }
                None => replicate!(ctx, c"HSET", c"sssss", name.inner, f.s, s.0, f.c, c.0),
            };
            let at = clock + ttl;
            key.expire_at(at)?;
            replicate!(ctx, c"PEXPIREAT", c"sl", name.inner, at as c_longlong);
        }
        Write::Log {
            trim,
            at,
            units,
            mut ordinal,
            ttl,
        } => {
            drop(key);
            trim_to(ctx, name, trim)?;
            let score = itoa::Buffer::new().format(at).to_owned();
            for _ in 0..units {
                // The first ordinal free at this time (the script's `ZADD NX` loop).
                loop {
                    ordinal += 1;
                    let member = format!("{at}:{ordinal}");
                    let args: [&[u8]; 4] =
                        [name.as_slice(), b"NX", score.as_bytes(), member.as_bytes()];
                    if ctx.call("ZADD", &args[..])? == RedisValue::Integer(1) {
                        let args: [&[u8]; 3] =
                            [name.as_slice(), score.as_bytes(), member.as_bytes()];
                        ctx.replicate("ZADD", &args[..]);
                        break;
                    }
                }
            }
            expire_at(ctx, name, clock + ttl)?;
        }
        Write::Slot {
            trim,
            take,
            expires,
            ttl,
        } => {
            drop(key);
            trim_to(ctx, name, trim)?;
            if take {
                let expires = itoa::Buffer::new().format(expires).to_owned();
                effect(ctx, "ZADD", &[name.as_slice(), expires.as_bytes(), slot_id])?;
                expire_at(ctx, name, clock + ttl)?;
            }
        }
    }
    Ok(())
}

/// A ZSET's members scored up to `trim` removed (expired entries, lapsed slots).
fn trim_to(ctx: &Context, name: &RedisString, trim: i64) -> Result<(), RedisError> {
    let trim = itoa::Buffer::new().format(trim).to_owned();
    effect(
        ctx,
        "ZREMRANGEBYSCORE",
        &[name.as_slice(), b"-inf", trim.as_bytes()],
    )
}

/// A write command run here and replicated as it is (deterministic: no clock of its own).
fn effect(ctx: &Context, command: &str, args: &[&[u8]]) -> Result<(), RedisError> {
    ctx.call(command, args)?;
    ctx.replicate(command, args);
    Ok(())
}

/// The key's expiry at `at` (Unix ms), here and on replicas.
fn expire_at(ctx: &Context, name: &RedisString, at: i64) -> Result<(), RedisError> {
    Handle::writable(ctx, name).expire_at(at)?;
    replicate!(ctx, c"PEXPIREAT", c"sl", name.inner, at as c_longlong);
    Ok(())
}
