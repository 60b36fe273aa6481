//! The module's commands and its registration with Redis (see the crate's documentation).

use crate::{decide, VERSION};

use redis_module::{
    redis_module, Context, RedisError, RedisResult, RedisString, RedisValue, Status,
};

/// Redis's oldest version with what the module uses (absolute key expiry, effects replication
/// wrapped in MULTI/EXEC, `PEXPIRETIME` for the tests).
const MIN_REDIS: (i32, i32) = (7, 0);

fn guarded(
    ctx: &Context,
    args: Vec<RedisString>,
    run: fn(&Context, Vec<RedisString>) -> RedisResult,
) -> RedisResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(ctx, args))).unwrap_or(Err(
        RedisError::Str(
            "ERR turnstile module: internal error (a panic, caught): nothing was written",
        ),
    ))
}

fn decide_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, decide::decide)
}

fn usage_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, decide::usage)
}

fn batch_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, decide::batch)
}

fn version_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guarded(ctx, args, |_, args| {
        if args.len() != 1 {
            return Err(RedisError::WrongArity);
        }
        Ok(RedisValue::SimpleString(format!(
            "turnstile-module {} {} decide tb lb fw cw sw sl cc",
            VERSION,
            env!("CARGO_PKG_VERSION")
        )))
    })
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let supported = ctx
        .get_redis_version()
        .map(|v| (v.major, v.minor) >= MIN_REDIS)
        .unwrap_or(false);
    // SAFETY: reading whether Redis filled in an API function pointer.
    let abs_expire = unsafe { redis_module::raw::RedisModule_SetAbsExpire }.is_some();
    if !supported || !abs_expire {
        ctx.log_warning(&format!(
            "turnstile module: needs Redis {}.{} or later (absolute key expiry); not loaded",
            MIN_REDIS.0, MIN_REDIS.1
        ));
        return Status::Err;
    }
    Status::Ok
}

// Registered only in what Redis loads: the unit tests and the fuzz target (feature off) call
// the pure parts with the system allocator, which a binary outside Redis must keep.
#[cfg(not(test))]
redis_module! {
    name: "turnstile",
    version: VERSION,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [
        ["turnstile.decide", decide_command, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ["turnstile.usage", usage_command, "readonly getkeys-api", 0, 0, 0, ""],
        ["turnstile.batch", batch_command, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ["turnstile.version", version_command, "readonly fast", 0, 0, 0, ""],
    ],
}
