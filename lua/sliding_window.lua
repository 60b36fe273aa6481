--[[ sliding_window.lua — the sliding window counter, on one HASH key.

Function  sliding_window(key, now, cost, limit, window) -> decision, commit
  key     HASH with fields  s = start of the current aligned window (ms)
                            c = units admitted in it
                            p = units admitted in the window before it
          The previous window weighs (window - elapsed) / window; everything is compared
          multiplied by `window`, so the arithmetic stays in exact integers.
Returns   decision = {admitted 0/1, remaining, reset_ms, retry_after_ms}; reset_ms is the end
          of the current window, or when rejected the time until the request would fit.
          commit   = function writing the new state (nil when not admitted).
TTL       until the end of the next window (when both counts stop mattering), plus
          TTL_GRACE_MS (lib.lua). Every script that writes `s` sets it, and it depends on
          `s` alone, so a write within the window the key already holds only moves `c`:
          one field, no PEXPIRE (the key keeps the TTL its window's first write gave it).
Mirrors   src/limit/algorithm/sliding_window.rs.
]]
local function sliding_window(key, now, cost, limit, window)
  local start = now - now % window
  local s = redis.call('HMGET', key, 's', 'c', 'p')
  local cur, prev, same = 0, 0, false
  if s[1] then
    local stored = s[1] + 0
    if stored == start then
      cur = s[2] and s[2] + 0 or 0
      prev = s[3] and s[3] + 0 or 0
      same = true
    elseif stored + window == start then
      prev = s[2] and s[2] + 0 or 0
    end
  end
  local until_next = window - (now - start)
  local used = prev * until_next + cur * window
  local capacity = limit * window
  if used + cost * window <= capacity then
    local after = used + cost * window
    local count = cur + cost
    local ttl = start + 2 * window - now
    local commit = function()
      if same then
        redis.call('HSET', key, 'c', count)
      else
        redis.call('HSET', key, 's', start, 'c', count, 'p', prev)
        expire(key, ttl)
      end
    end
    return {1, floor_div(capacity - after, window), until_next, 0}, commit
  end
  local retry
  if cost > limit then
    retry = window
  elseif cur + cost <= limit then
    -- fits once the previous window has decayed enough, within this window
    retry = until_next - floor_div((limit - cur - cost) * window, prev)
  else
    -- only after this window ends, when `cur` becomes the previous window
    retry = until_next + (window - floor_div((limit - cost) * window, cur))
  end
  return {0, floor_div(math.max(0, capacity - used), window), retry, retry}, nil
end
