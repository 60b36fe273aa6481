--[[ fixed_window.lua — one counter per aligned window, on one HASH key.

Function  fixed_window(key, now, cost, limit, window) -> decision, commit
  key     HASH with fields  s = start of the window the count belongs to (ms, a multiple of
                                `window`)
                            c = units admitted in that window
          A missing key, or a count of an earlier window, is an empty window.
Returns   decision = {admitted 0/1, remaining, reset_ms (until the window ends), retry_after_ms}
          commit   = function writing the new state (nil when not admitted).
TTL       until the window ends, plus TTL_GRACE_MS (lib.lua).
Note      admits up to twice `limit` around a window edge (by design: it is the cheap one).
Mirrors   src/limit/algorithm/fixed_window.rs.
]]
local function fixed_window(key, now, cost, limit, window)
  local start = now - now % window
  local s = redis.call('HMGET', key, 's', 'c')
  local count = 0
  if s[1] and tonumber(s[1]) == start then count = tonumber(s[2]) end
  local reset = start + window - now
  if count + cost <= limit then
    local after = count + cost
    local commit = function()
      redis.call('HSET', key, 's', start, 'c', after)
      expire(key, reset)
    end
    return {1, limit - after, reset, 0}, commit
  end
  return {0, math.max(0, limit - count), reset, reset}, nil
end
