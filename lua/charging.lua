--[[ charging.lua — what requests turned out to cost, counted: the body of charge.lua, and of
each charge member of batch.lua.

Function  charge_request(kb, n, ab, argc, clock) -> the number of keys changed, or nil and an
          error message
  KEYS[kb + 1 .. kb + n - 1] the keys of the charged limits (fixed or sliding window
                            counters, one slot)
  KEYS[kb + n]              the charge's marker (lib.lua's applied_before): a charge sent
                            again is applied once
  ARGV[ab + 1 .. ab + argc] charge.lua's arguments (see there): the time spec, the time the
                            request was admitted at, then four per key
  clock                     the time spec -> now in milliseconds (now_ms, or batch.lua's: one
                            TIME for the whole batch)
Effect    as charge.lua's (see there).
Mirrors   State::charge in src/limit/algorithm/mod.rs.
]]
local CHARGE_PER = 4

-- The [start, stop) of the calendar window `t` is in, from the bounds around now.
local function calendar_at(bounds, t)
  local p, s, e, n = string.match(bounds, '^(%d+):(%d+):(%d+):(%d+)$')
  p, s, e, n = tonumber(p), tonumber(s), tonumber(e), tonumber(n)
  if t < s then return p, s end
  if t >= e then return e, n end
  return s, e
end

-- More than counted: added to the window current now, never beyond twice the limit.
local function charge_more(key, algorithm, raw_window, delta, most, now)
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
    return true
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
    return true
  end
  return false
end

local function charge_request(kb, n, ab, argc, clock)
  local marker = KEYS[kb + n]
  n = n - 1
  if n < 1 or argc ~= 2 + CHARGE_PER * n then
    return nil, 'expected keys and a marker, and 2 + 4 arguments per key, got ' .. argc .. ' for ' .. n .. ' keys'
  end
  -- Every algorithm is known before anything is written: a charge is all or nothing.
  for i = 1, n do
    local algorithm = ARGV[ab + 2 + CHARGE_PER * (i - 1) + 1]
    if algorithm ~= 'fw' and algorithm ~= 'cw' and algorithm ~= 'sw' then
      return nil, 'cannot charge ' .. tostring(algorithm)
    end
  end
  if applied_before(marker) then return 0 end
  local now, at = clock(ARGV[ab + 1]), tonumber(ARGV[ab + 2])
  local changed = 0
  for i = 1, n do
    local o = ab + 2 + CHARGE_PER * (i - 1)
    local key, algorithm = KEYS[kb + i], ARGV[o + 1]
    local limit, raw_window, delta = tonumber(ARGV[o + 2]), ARGV[o + 3], tonumber(ARGV[o + 4])
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
    elseif delta > 0 and charge_more(key, algorithm, raw_window, delta, 2 * limit, now) then
      changed = changed + 1
    end
  end
  mark_applied(marker)
  return changed
end
