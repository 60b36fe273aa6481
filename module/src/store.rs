//! A limit's key, read and written in Redis's keyspace in the Lua scripts' stored form — and
//! every write replicated as its effect (`SET … PXAT`, `HSET`, `PEXPIREAT`): a replica or an
//! AOF replay applies what the primary wrote and never decides again on its own clock.

use crate::algorithm::{State, Write};
use redis_module::{raw, Context, KeyType, RedisError, RedisString};

/// A key's state, read as the algorithm of `bucket` (a STRING) or a window (a HASH) keeps it.
pub fn read(ctx: &Context, name: &RedisString, bucket: bool) -> Result<State, RedisError> {
    let key = ctx.open_key_writable(name);
    match (key.key_type(), bucket) {
        (KeyType::Empty, _) => Ok(State::Missing),
        (KeyType::String, true) => {
            let dma = key.as_string_dma()?;
            bucket_of(&dma).ok_or(RedisError::Str(
                "ERR turnstile module: a key holds no bucket",
            ))
        }
        (KeyType::Hash, false) => {
            let field = |f: &str| -> Result<Option<i64>, RedisError> {
                match key.hash_get(f)? {
                    None => Ok(None),
                    Some(v) => crate::args::number(v.as_slice(), "a window's field")
                        .map(Some)
                        .map_err(|_| {
                            RedisError::Str("ERR turnstile module: a key holds no window")
                        }),
                }
            };
            Ok(match field("s")? {
                None => State::Missing,
                Some(start) => State::Window {
                    start,
                    count: field("c")?.unwrap_or(0),
                    previous: field("p")?.unwrap_or(0),
                },
            })
        }
        _ => Err(RedisError::Str(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        )),
    }
}

/// `lua/lib.lua`'s bucket_of: "<level> <updated>" then anything (a leaky bucket's turns).
fn bucket_of(text: &[u8]) -> Option<State> {
    let digits = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_digit()).count();
    let l = digits(text);
    let rest = text.get(l + 1..)?;
    let t = digits(rest);
    if l == 0 || t == 0 || text[l] != b' ' || l > 15 || t > 15 {
        return None;
    }
    let number = |b: &[u8]| crate::args::number(b, "").ok();
    Some(State::Bucket {
        level: number(&text[..l])?,
        updated: number(&rest[..t])?,
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
    clock: i64,
) -> Result<(), RedisError> {
    let key = Handle::open(ctx, name);
    let mut buf = itoa::Buffer::new();
    match write {
        Write::Bucket { level, time, ttl } => {
            let mut text = itoa::Buffer::new().format(level).to_owned();
            text.push(' ');
            text.push_str(buf.format(time));
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
            hash_set(raw::hash_set(key.0, "s", ctx.create_string(start).inner));
            hash_set(raw::hash_set(key.0, "c", ctx.create_string(count).inner));
            let mut args: Vec<&[u8]> = vec![
                name.as_slice(),
                b"s",
                start.as_bytes(),
                b"c",
                count.as_bytes(),
            ];
            if let Some(previous) = previous {
                let previous = b4.format(previous);
                hash_set(raw::hash_set(key.0, "p", ctx.create_string(previous).inner));
                args.extend([b"p".as_slice(), previous.as_bytes()]);
            }
            ctx.replicate("HSET", &args[..]);
            let at = clock + ttl;
            key.expire_at(at)?;
            let at = buf.format(at);
            let args: [&[u8]; 2] = [name.as_slice(), at.as_bytes()];
            ctx.replicate("PEXPIREAT", &args[..]);
        }
    }
    Ok(())
}
