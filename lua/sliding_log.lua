--[[ sliding_log.lua — the exact sliding window log, on one ZSET key.

Function  sliding_log(key, now, cost, limit, window) -> decision, commit
  key     ZSET with one member per admitted unit: score = admission time (ms), member =
          "<time>:<ordinal>" (unique). An entry counts while time > now - window.
Returns   decision = {admitted 0/1, remaining, reset_ms (until the oldest entry expires),
          retry_after_ms (until enough entries expire to fit `cost`)}
          commit   = function trimming expired entries and adding the new ones (nil when not
          admitted). A rejection writes nothing.
TTL       `window` after the newest entry (then every entry has expired), plus TTL_GRACE_MS.
Memory    one member per admitted unit, so `limit` is capped by the config loader.
Mirrors   src/limit/algorithm/sliding_log.rs.
]]
local function sliding_log(key, now, cost, limit, window)
  local live = string.format('(%d', now - window)
  local count = redis.call('ZCOUNT', key, live, '+inf')
  local function time_of(offset)
    local e = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', offset, 1)
    if e[2] then return tonumber(e[2]) end
    return now
  end
  if count + cost <= limit then
    local oldest = now
    if count > 0 then oldest = time_of(0) end
    local commit = function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
      -- A member name not taken yet: after a refund removed one of this millisecond's
      -- entries, count + i can name one that is still there (and ZADD would only move it).
      local ordinal = count
      for _ = 1, cost do
        repeat
          ordinal = ordinal + 1
        until redis.call('ZADD', key, 'NX', now, string.format('%d:%d', now, ordinal)) == 1
      end
      expire(key, window)
    end
    return {1, limit - count - cost, oldest + window - now, 0}, commit
  end
  local retry
  if cost > limit then
    retry = window
  else
    retry = time_of(count + cost - limit - 1) + window - now
  end
  return {0, math.max(0, limit - count), time_of(0) + window - now, retry}, nil
end
