--[[ fixed_window.lua — one counter per aligned window, on one HASH key.

Function  fixed_window(key, now, cost, limit, window) -> decision, commit
Function  calendar_window(key, now, cost, limit, bounds) -> decision, commit
  bounds  "previous:start:end:next" (ms): the calendar windows around the gateway's now (a
          day, week or month in a time zone, computed by the gateway); the window `now`
          falls in is used, so Redis's clock decides even when the gateway's disagrees at a
          boundary. Mirrors `Policy::fixed_window_at` with a calendar.
  key     HASH with fields  s = start of the window the count belongs to (ms, a multiple of
                                `window`)
                            c = units admitted in that window
          A missing key, or a count of an earlier window, is an empty window.
Returns   decision = {admitted 0/1, remaining, reset_ms (until the window ends), retry_after_ms}
          commit   = function writing the new state (nil when not admitted).
TTL       until the window ends, plus TTL_GRACE_MS (lib.lua): set by the window's first
          write; a later write in the same window only moves `c` (the TTL is the same).
Note      admits up to twice `limit` around a window edge (by design: it is the cheap one).
Mirrors   src/limit/algorithm/fixed_window.rs.
]]
local function fixed_window_in(key, now, cost, limit, start, stop)
  local s = redis.call('HMGET', key, 's', 'c')
  local count, same = 0, false
  if s[1] and s[1] + 0 == start then count, same = s[2] + 0, true end
  local reset = stop - now
  if count + cost <= limit then
    local after = count + cost
    local commit = function()
      if same then
        redis.call('HSET', key, 'c', after)
      else
        redis.call('HSET', key, 's', start, 'c', after)
        expire(key, reset)
      end
    end
    return {1, limit - after, reset, 0}, commit
  end
  return {0, math.max(0, limit - count), reset, reset}, nil
end

local function fixed_window(key, now, cost, limit, window)
  local start = now - now % window
  return fixed_window_in(key, now, cost, limit, start, start + window)
end

local function calendar_window(key, now, cost, limit, bounds)
  local p, s, e, n = string.match(bounds, '^(%d+):(%d+):(%d+):(%d+)$')
  p, s, e, n = tonumber(p), tonumber(s), tonumber(e), tonumber(n)
  if not n then error('turnstile: calendar bounds ' .. tostring(bounds)) end
  if now < s then return fixed_window_in(key, now, cost, limit, p, s) end
  if now >= e then return fixed_window_in(key, now, cost, limit, e, n) end
  return fixed_window_in(key, now, cost, limit, s, e)
end
