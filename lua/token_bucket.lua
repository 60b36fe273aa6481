--[[ token_bucket.lua — the token bucket, on one STRING key.

Function  token_bucket(key, now, cost, limit, window, burst, _, now_text) -> decision, commit
  key     STRING "<level> <updated>" (lib.lua's bucket_of, bucket_text): the level in
          token·ms (tokens × window, so refill is exact) and the time of the last update
          (ms), both decimal integers. One GET reads it and one SET … PX writes it with its
          TTL (a HASH took HMGET, HSET and PEXPIRE).
          A missing key is a full bucket.
  now     milliseconds; cost: units asked for (0 = only report)
  limit   tokens refilled per `window` ms; burst: capacity in tokens
  now_text  `now` as decimal text, or nil: written as it is, so that it is not formatted
          again for every bucket
Returns   decision = {admitted 0/1, remaining tokens, reset_ms (until full), retry_after_ms}
          commit   = function writing the new state (nil when not admitted); the caller runs it
                     only if every limit of the call admits the request.
TTL       the time until the bucket is full again (an expired key reads as full, so the TTL
          never changes a decision), plus TTL_GRACE_MS (lib.lua).
Mirrors   src/limit/algorithm/token_bucket.rs; tests/lua_agrees.rs compares the two.
]]
local function token_bucket(key, now, cost, limit, window, burst, _, now_text)
  local cap = burst * window
  local level, updated = cap, 0
  local stored = redis.call('GET', key)
  if stored then level, updated = bucket_of(key, stored) end
  local elapsed = now - updated
  if elapsed < 0 then elapsed = 0 end
  level = math.min(cap, level + elapsed * limit)
  if now < updated then now, now_text = updated, nil end
  local need = cost * window
  if level >= need then
    local after = level - need
    local reset = ceil_div(cap - after, limit)
    local commit = function()
      redis.call('SET', key, bucket_text(after, now, now_text), 'PX', reset + TTL_GRACE_MS)
    end
    return {1, floor_div(after, window), reset, 0}, commit
  end
  local retry
  if need > cap then retry = window else retry = ceil_div(need - level, limit) end
  return {0, floor_div(level, window), ceil_div(cap - level, limit), retry}, nil
end
