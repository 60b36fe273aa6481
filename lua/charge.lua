--[[ charge.lua — charge what requests turned out to cost, once their responses told.

A limit with `cost_from_response` counted a request's estimate when it was admitted; the
response says what it really cost (tokens an LLM used). This script counts the difference.

KEYS[i]   the keys of the charged limits (fixed or sliding window counters, one slot)
ARGV[1]   "" for the server's clock; tests only: an explicit time or "+<ms>" (lib.lua's now_ms)
ARGV[2]   the time the request was admitted at (check.lua's now_ms)
ARGV[3..] four per key: algorithm (fw | cw | sw), limit, window_ms (cw: the calendar bounds
          "previous:start:end:next" around now), delta (the units to add; negative: to give
          back)
Reply     the number of keys changed
Effect    more: counted in the window current now (a fixed window that ended starts afresh;
          a sliding window rolls as check.lua rolls it), never beyond twice the limit (a
          budget goes below zero by at most one budget; beyond, the rest is not counted).
          Less: given back to the window the request was counted in (return_units.lua), if
          that is still the current one (or, sliding, the previous one).
TTL       as check.lua would set it for the window written.
Mirrors   State::charge in src/limit/algorithm/mod.rs.
]]
local PER = 4
if #ARGV ~= 2 + PER * #KEYS then
  return redis.error_reply('turnstile charge.lua: expected 2 + 4 arguments per key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
local now, at = now_ms(ARGV[1]), tonumber(ARGV[2])
local changed = 0

-- The [start, stop) of the calendar window `t` is in, from the bounds around now.
local function calendar_at(bounds, t)
  local p, s, e, n = string.match(bounds, '^(%d+):(%d+):(%d+):(%d+)$')
  p, s, e, n = tonumber(p), tonumber(s), tonumber(e), tonumber(n)
  if t < s then return p, s end
  if t >= e then return e, n end
  return s, e
end

for i = 1, #KEYS do
  local o = 2 + PER * (i - 1)
  local key, algorithm = KEYS[i], ARGV[o + 1]
  local limit, raw_window, delta = tonumber(ARGV[o + 2]), ARGV[o + 3], tonumber(ARGV[o + 4])
  local most = 2 * limit
  if delta < 0 then
    local start, window
    if algorithm == 'cw' then
      start = calendar_at(raw_window, at)
      window = 0
    else
      window = tonumber(raw_window)
      start = at - at % window
    end
    local kind = algorithm == 'sw' and 'sw' or 'fw'
    if return_units(key, kind, start, window, -delta) > 0 then changed = changed + 1 end
  elseif delta > 0 then
    if algorithm == 'fw' or algorithm == 'cw' then
      local start, stop
      if algorithm == 'cw' then
        start, stop = calendar_at(raw_window, now)
      else
        local window = tonumber(raw_window)
        start = now - now % window
        stop = start + window
      end
      local s = redis.call('HMGET', key, 's', 'c')
      local count = 0
      if s[1] and tonumber(s[1]) == start then count = tonumber(s[2]) end
      redis.call('HSET', key, 's', start, 'c', math.min(count + delta, most))
      expire(key, stop - now)
      changed = changed + 1
    elseif algorithm == 'sw' then
      local window = tonumber(raw_window)
      local start = now - now % window
      local s = redis.call('HMGET', key, 's', 'c', 'p')
      local cur, prev = 0, 0
      if s[1] then
        local stored = tonumber(s[1])
        if stored == start then
          cur, prev = tonumber(s[2]) or 0, tonumber(s[3]) or 0
        elseif stored + window == start then
          prev = tonumber(s[2]) or 0
        end
      end
      redis.call('HSET', key, 's', start, 'c', math.min(cur + delta, most), 'p', prev)
      expire(key, start + 2 * window - now)
      changed = changed + 1
    else
      return redis.error_reply('turnstile charge.lua: cannot charge ' .. tostring(algorithm))
    end
  end
end
return changed
