--[[ token_bucket.lua — the token bucket, on one HASH key.

Function  token_bucket(key, now, cost, limit, window, burst, _, now_text) -> decision, commit
  key     HASH with fields  l = level in token·ms (tokens × window, so refill is exact)
                            t = time of the last update (ms)
          A missing key is a full bucket.
  now     milliseconds; cost: units asked for (0 = only report)
  limit   tokens refilled per `window` ms; burst: capacity in tokens
  now_text  `now` as decimal text, or nil: written as it is, since Redis turns a number
          argument into text itself (~3.6k instructions on Redis 7.0) and a string not at all
Returns   decision = {admitted 0/1, remaining tokens, reset_ms (until full), retry_after_ms}
          commit   = function writing the new state (nil when not admitted); the caller runs it
                     only if every limit of the call admits the request.
TTL       the time until the bucket is full again (an expired key reads as full, so the TTL
          never changes a decision), plus TTL_GRACE_MS (lib.lua).
Mirrors   src/limit/algorithm/token_bucket.rs; tests/lua_agrees.rs compares the two.
]]
local function token_bucket(key, now, cost, limit, window, burst, _, now_text)
  local cap = burst * window
  local s = redis.call('HMGET', key, 'l', 't')
  local level, updated = cap, 0
  if s[1] and s[2] then
    level = s[1] + 0
    updated = s[2] + 0
  end
  local elapsed = now - updated
  if elapsed < 0 then elapsed = 0 end
  level = math.min(cap, level + elapsed * limit)
  if now < updated then now, now_text = updated, nil end
  local need = cost * window
  if level >= need then
    local after = level - need
    local reset = ceil_div(cap - after, limit)
    local commit = function()
      redis.call('HSET', key, 'l', after, 't', now_text or now)
      expire(key, reset)
    end
    return {1, floor_div(after, window), reset, 0}, commit
  end
  local retry
  if need > cap then retry = window else retry = ceil_div(need - level, limit) end
  return {0, floor_div(level, window), ceil_div(cap - level, limit), retry}, nil
end
