--[[ refund.lua — undo what check.lua committed for a request that another call rejected.

On Redis Cluster a request's limits can live in several slots (a plan's keys are tagged by the
client, a keyed limit's by its key), and one script may only touch one slot: the gateway
decides per slot, and when one slot rejects, the slots that admitted give their units back
with this script. Between the two calls another request can see those units taken (and be
refused for them, never admitted beyond a limit); they are back one round trip later.

The script sent to Redis is return_units.lua then this file (src/limit/store/redis/scripts.rs).

KEYS[i]   the keys check.lua committed (one slot)
ARGV[1]   the time check.lua decided at (its reply's now_ms)
ARGV[2]   the request's cost
ARGV[3]   the request's slot id ("" when it took no concurrency slot)
ARGV[4..] four per key: algorithm (tb | lb | fw | cw | sw | sl | cc), limit, window_ms (cw: the
          start of the calendar window the request was counted in), burst
Reply     the number of keys given something back
Effect    fixed / sliding window: the units leave the window they were counted in (a sliding
          window that moved on since still weighs them as its previous window); leaky bucket:
          its turn goes back (the backlog shrinks by it, never below empty); token bucket:
          the tokens go back, up to its capacity; sliding log: `cost` entries of that
          millisecond are removed; concurrency: the request's slot is removed. TTLs are kept.
]]
local PER = 4
if #ARGV ~= 3 + PER * #KEYS then
  return redis.error_reply('turnstile refund.lua: expected 3 + 4 arguments per key, got ' .. #ARGV .. ' for ' .. #KEYS .. ' keys')
end
local now, cost, slot_id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local changed = 0
for i = 1, #KEYS do
  local o = 3 + PER * (i - 1)
  local key, algorithm = KEYS[i], ARGV[o + 1]
  local window, burst = tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
  local back = 0
  if algorithm == 'fw' or algorithm == 'sw' then
    back = return_units(key, algorithm, now - now % window, window, cost)
  elseif algorithm == 'cw' then
    back = return_units(key, 'fw', window, 0, cost)
  elseif algorithm == 'lb' then
    local level = redis.call('HGET', key, 'l')
    if level then
      redis.call('HSET', key, 'l', math.max(0, tonumber(level) - cost * window))
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
