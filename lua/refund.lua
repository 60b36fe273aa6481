--[[ refund.lua — undo what check.lua committed for a request that another call rejected.

On Redis Cluster a request's limits can live in several slots (a plan's keys are tagged by the
client, a keyed limit's by its key), and one script may only touch one slot: the gateway
decides per slot, and when one slot rejects, the slots that admitted give their units back
with this script. Between the two calls another request can see those units taken (and be
refused for them, never admitted beyond a limit); they are back one round trip later.

The script sent to Redis is return_units.lua then this file (src/limit/store/redis/sources.rs).

KEYS[i]   the keys check.lua committed (one slot)
ARGV[1]   the time check.lua decided at (its reply's now_ms)
ARGV[2]   the request's slot id ("" when it took no concurrency slot)
ARGV[3..] five per key: algorithm (tb | lb | fw | cw | sw | sl | cc), the units the request
          counted in it, limit, window_ms (cw: the start of the calendar window the request
          was counted in), burst (lb: how long the request was held, 0 if it passed at once)
Reply     the number of keys given something back
Effect    fixed / sliding window: the units leave the window they were counted in (a sliding
          window that moved on since still weighs them as its previous window); leaky bucket:
          a request that passed at once leaves the backlog (never below empty), a held one
          of cost 1 leaves a hole at its turn for the next request (at most HOLES kept, the
          soonest dropped first), a costlier held one keeps its turns; token bucket:
          the tokens go back, up to its capacity; sliding log: `cost` entries of that
          millisecond are removed; concurrency: the request's slot is removed. TTLs are kept.
]]
local PER = 5
-- Turns given back a leaky bucket remembers (HOLES in src/limit/algorithm/leaky_bucket.rs).
local HOLES = 4
if #ARGV ~= 2 + PER * #KEYS then
  return redis.error_reply('turnstile refund.lua: expected 2 + 5 arguments per key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
local now, slot_id = tonumber(ARGV[1]), ARGV[2]
local changed = 0
for i = 1, #KEYS do
  local o = 2 + PER * (i - 1)
  local key, algorithm, cost = KEYS[i], ARGV[o + 1], tonumber(ARGV[o + 2])
  local window, burst = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
  local back = 0
  if algorithm == 'fw' or algorithm == 'sw' then
    back = return_units(key, algorithm, now - now % window, window, cost)
  elseif algorithm == 'cw' then
    back = return_units(key, 'fw', window, 0, cost)
  elseif algorithm == 'lb' then
    -- The 4th argument is how long the request was held.
    local wait = burst
    local b = redis.call('HMGET', key, 'l', 'h')
    if b[1] and wait == 0 then
      redis.call('HSET', key, 'l', math.max(0, tonumber(b[1]) - cost * window))
      back = 1
    elseif b[1] and cost == 1 then
      -- A hole at its turn; with HOLES already, the soonest makes room.
      local holes, soonest = {}, nil
      for v in string.gmatch(b[2] or '', '%d+') do
        holes[#holes + 1] = tonumber(v)
        if soonest == nil or holes[#holes] < holes[soonest] then soonest = #holes end
      end
      if #holes < HOLES then soonest = #holes + 1 end
      holes[soonest] = now + wait
      redis.call('HSET', key, 'h', table.concat(holes, ' '))
      back = 1
    end
  elseif algorithm == 'tb' then
    local level = redis.call('HGET', key, 'l')
    if level then
      redis.call('HSET', key, 'l', math.min(burst * window, tonumber(level) + cost * window))
      back = 1
    end
  elseif algorithm == 'sl' then
    local entries = redis.call('ZRANGEBYSCORE', key, now, now, 'LIMIT', 0, cost)
    if #entries > 0 then back = redis.call('ZREM', key, unpack(entries)) end
  elseif algorithm == 'cc' then
    back = redis.call('ZREM', key, slot_id)
  else
    return redis.error_reply('turnstile refund.lua: unknown algorithm ' .. tostring(algorithm))
  end
  if back > 0 then changed = changed + 1 end
end
return changed
