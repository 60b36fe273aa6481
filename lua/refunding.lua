--[[ refunding.lua — what check.lua committed for a request, given back: the body of refund.lua,
and of each refund member of batch.lua.

Function  refund_request(kb, n, ab, argc) -> the number of keys given something back, or nil
          and an error message
  KEYS[kb + 1 .. kb + n - 1] the keys check.lua committed (one slot)
  KEYS[kb + n]              the refund's marker (lib.lua's applied_before): a refund sent
                            again gives back once
  ARGV[ab + 1 .. ab + argc] refund.lua's arguments (see there): the time the request was
                            decided at, its slot id, then five per key
Effect    as refund.lua's (see there). Every algorithm is known before anything is written: a
          refund is all or nothing.
]]
-- Turns given back a leaky bucket remembers (HOLES in src/limit/algorithm/leaky_bucket.rs).
local HOLES = 4
local REFUND_PER = 5
local REFUNDABLE = { fw = true, sw = true, cw = true, lb = true, tb = true, sl = true, cc = true }

-- A leaky bucket's units back: a request that passed at once leaves the backlog, a held one
-- of cost 1 leaves a hole at its turn.
local function refund_leaky(key, cost, window, wait, now)
  local stored = redis.call('GET', key)
  if not stored then return 0 end
  local level, updated, turns = bucket_of(key, stored)
  local holes = {}
  if wait == 0 then
    level = math.max(0, level - cost * window)
    for v in string.gmatch(turns, '%d+') do holes[#holes + 1] = v end
  elseif cost == 1 then
    -- A hole at its turn; with HOLES already, the soonest makes room.
    local soonest = nil
    for v in string.gmatch(turns, '%d+') do
      holes[#holes + 1] = v + 0
      if soonest == nil or holes[#holes] < holes[soonest] then soonest = #holes end
    end
    if #holes < HOLES then soonest = #holes + 1 end
    holes[soonest] = now + wait
  else
    return 0
  end
  -- The key keeps its TTL (until the bucket is empty: a smaller backlog empties sooner, and
  -- a turn given back lies within the backlog's time).
  redis.call('SET', key, leaky_text(level, updated, nil, holes), 'KEEPTTL')
  return 1
end

local function refund_request(kb, n, ab, argc)
  local marker = KEYS[kb + n]
  n = n - 1
  if n < 1 or argc ~= 2 + REFUND_PER * n then
    return nil, 'expected keys and a marker, and 2 + 5 arguments per key, got ' .. argc .. ' for ' .. n .. ' keys'
  end
  for i = 1, n do
    local algorithm = ARGV[ab + 2 + REFUND_PER * (i - 1) + 1]
    if not REFUNDABLE[algorithm] then
      return nil, 'unknown algorithm ' .. tostring(algorithm)
    end
  end
  if applied_before(marker) then return 0 end
  local now, slot_id = tonumber(ARGV[ab + 1]), ARGV[ab + 2]
  local changed = 0
  for i = 1, n do
    local o = ab + 2 + REFUND_PER * (i - 1)
    local key, algorithm, cost = KEYS[kb + i], ARGV[o + 1], tonumber(ARGV[o + 2])
    local window, burst = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
    local back = 0
    if algorithm == 'fw' or algorithm == 'sw' then
      back = return_units(key, algorithm, now - now % window, window, cost)
    elseif algorithm == 'cw' then
      back = return_units(key, 'fw', window, 0, cost)
    elseif algorithm == 'lb' then
      -- The 5th argument is how long the request was held.
      back = refund_leaky(key, cost, window, burst, now)
    elseif algorithm == 'tb' then
      -- The tokens back, at the bucket's stored time; the key keeps its TTL (a fuller bucket
      -- is full sooner, so the TTL still outlasts it).
      local stored = redis.call('GET', key)
      if stored then
        local level, updated = bucket_of(key, stored)
        level = math.min(burst * window, level + cost * window)
        redis.call('SET', key, bucket_text(level, updated), 'KEEPTTL')
        back = 1
      end
    elseif algorithm == 'sl' then
      local entries = redis.call('ZRANGEBYSCORE', key, now, now, 'LIMIT', 0, cost)
      if #entries > 0 then back = redis.call('ZREM', key, unpack(entries)) end
    else
      back = redis.call('ZREM', key, slot_id)
    end
    if back > 0 then changed = changed + 1 end
  end
  mark_applied(marker)
  return changed
end
