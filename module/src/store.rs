//! A limit's key, read and written in Redis's keyspace in the Lua scripts' stored form — and
//! every write replicated as its effect (`SET … PXAT`, `HSET`, `PEXPIREAT`): a replica or an
//! AOF replay applies what the primary wrote and never decides again on its own clock.

use crate::algorithm::{State, Write};
use crate::args::{Algorithm, Limit};
use redis_module::{raw, Context, KeyType, RedisError, RedisString, RedisValue};

/// How an algorithm stores its state.
#[derive(PartialEq)]
enum Form {
    Bucket,
    Window,
}

/// `limit`'s state in the key `name` at `now`, as its algorithm keeps it.
pub fn read(
    ctx: &Context,
    name: &RedisString,
    limit: &Limit,
    now: i64,
) -> Result<State, RedisError> {
    let form = match limit.algorithm {
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => Form::Bucket,
        Algorithm::SlidingLog => return live(ctx, name, now - limit.window),
        Algorithm::Concurrency => return live(ctx, name, now),
        _ => Form::Window,
    };
    let key = ctx.open_key_writable(name);
    match (key.key_type(), form) {
        (KeyType::Empty, _) => Ok(State::Missing),
        (KeyType::String, Form::Bucket) => {
            let dma = key.as_string_dma()?;
            bucket_of(&dma).ok_or(RedisError::Str(
                "ERR turnstile module: a key holds no bucket",
            ))
        }
        (KeyType::Hash, Form::Window) => {
            // One HashGet for the three fields (`s`, `c`, `p`), each a decimal integer.
            let mut fields = [None; 3];
            for (name, value) in key.hash_get_multi::<_, RedisString>(&["s", "c", "p"])? {
                let at = ["s", "c", "p"].iter().position(|f| *f == name).unwrap_or(0);
                fields[at] = Some(
                    crate::args::number(value.as_slice(), "a window's field").map_err(|_| {
                        RedisError::Str("ERR turnstile module: a key holds no window")
                    })?,
                );
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

/// A writable key by Redis's own handle: the module API's absolute expiry needs it.
struct Handle(*mut raw::RedisModuleKey);

impl Handle {
    fn open(ctx: &Context, name: &RedisString) -> Handle {
        Handle(raw::open_key(
            ctx.get_raw(),
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        ))
    }

    /// A window's fields `s`, `c` (and `p`) in one `RedisModule_HashSet` call (its answer
    /// counts fields replaced: nothing to fail on, the key a HASH or missing, open to write).
    fn set_window(&self, s: &RedisString, c: &RedisString, p: Option<&RedisString>) {
        let flags = raw::REDISMODULE_HASH_CFIELDS as i32;
        let end = std::ptr::null::<std::ffi::c_char>();
        // SAFETY: a function Redis fills in before any command runs; C-string field names
        // (REDISMODULE_HASH_CFIELDS), each followed by its value, the list ended by NULL.
        unsafe {
            let set = raw::RedisModule_HashSet.unwrap();
            match p {
                Some(p) => set(
                    self.0,
                    flags,
                    c"s".as_ptr(),
                    s.inner,
                    c"c".as_ptr(),
                    c.inner,
                    c"p".as_ptr(),
                    p.inner,
                    end,
                ),
                None => set(
                    self.0,
                    flags,
                    c"s".as_ptr(),
                    s.inner,
                    c"c".as_ptr(),
                    c.inner,
                    end,
                ),
            };
        }
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

/// RedisModule_HashSet answers how many fields it replaced, not a status: the key was checked
/// to be a HASH (or missing) and opened for writing before, so there is nothing to fail on.
fn hash_set(_replaced: raw::Status) {}

fn ok(status: raw::Status) -> Result<(), RedisError> {
    match status {
        raw::Status::Ok => Ok(()),
        raw::Status::Err => Err(RedisError::Str("ERR turnstile module: a write failed")),
    }
}

/// Applies `write` to the key `name` (`clock`: Redis's clock now, ms, which TTLs count from),
/// and replicates it as its effect.
pub fn apply(
    ctx: &Context,
    name: &RedisString,
    write: Write,
    (clock, slot_id): (i64, &[u8]),
) -> Result<(), RedisError> {
    let key = Handle::open(ctx, name);
    let mut buf = itoa::Buffer::new();
    match write {
        Write::Bucket {
            level,
            time,
            turns,
            ttl,
        } => {
            let mut text = itoa::Buffer::new().format(level).to_owned();
            for n in std::iter::once(time).chain(turns) {
                text.push(' ');
                text.push_str(buf.format(n));
            }
            let value = ctx.create_string(text.as_bytes());
            ok(raw::string_set(key.0, value.inner))?;
            let at = clock + ttl;
            key.expire_at(at)?;
            let at = buf.format(at);
            let args: [&[u8]; 4] = [name.as_slice(), text.as_bytes(), b"PXAT", at.as_bytes()];
            ctx.replicate("SET", &args[..]);
        }
        Write::Count { count } => {
            let count = buf.format(count);
            hash_set(raw::hash_set(key.0, "c", ctx.create_string(count).inner));
            let args: [&[u8]; 3] = [name.as_slice(), b"c", count.as_bytes()];
            ctx.replicate("HSET", &args[..]);
        }
        Write::Window {
            start,
            count,
            previous,
            ttl,
        } => {
            let (mut b2, mut b3, mut b4) = (
                itoa::Buffer::new(),
                itoa::Buffer::new(),
                itoa::Buffer::new(),
            );
            let (start, count) = (b2.format(start), b3.format(count));
            let previous = previous.map(|p| b4.format(p));
            let (s, c) = (ctx.create_string(start), ctx.create_string(count));
            let p = previous.map(|p| ctx.create_string(p));
            key.set_window(&s, &c, p.as_ref());
            let mut args: Vec<&[u8]> = vec![
                name.as_slice(),
                b"s",
                start.as_bytes(),
                b"c",
                count.as_bytes(),
            ];
            if let Some(previous) = previous {
                args.extend([b"p".as_slice(), previous.as_bytes()]);
            }
            ctx.replicate("HSET", &args[..]);
            let at = clock + ttl;
            key.expire_at(at)?;
            let at = buf.format(at);
            let args: [&[u8]; 2] = [name.as_slice(), at.as_bytes()];
            ctx.replicate("PEXPIREAT", &args[..]);
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
    let key = Handle::open(ctx, name);
    key.expire_at(at)?;
    let at = itoa::Buffer::new().format(at).to_owned();
    let args: [&[u8]; 2] = [name.as_slice(), at.as_bytes()];
    ctx.replicate("PEXPIREAT", &args[..]);
    Ok(())
}
