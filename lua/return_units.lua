--[[ return_units.lua — give unspent leased units back to a window counter.

Function  return_units(key, algorithm, start, window, units) -> units given back
  key        a fixed_window or sliding_window HASH (fields s, c and, for sliding_window, p)
  algorithm  "fw" or "sw"
  start      the start (ms) of the window the units were leased in
  units      how many were leased and never spent
Effect    while that window is still the key's current one, its count `c` drops by the units;
          a sliding window that has moved on by one window still weighs them as its previous
          window `p`, which drops instead. Anything older lapsed with its window: nothing
          changes. A count never goes below zero; the key's TTL is kept.
]]
local function return_units(key, algorithm, start, window, units)
  if units <= 0 then return 0 end
  local s = redis.call('HMGET', key, 's', 'c', 'p')
  if not s[1] then return 0 end
  local stored = tonumber(s[1])
  local field, have
  if stored == start then
    field, have = 'c', tonumber(s[2]) or 0
  elseif algorithm == 'sw' and stored == start + window then
    field, have = 'p', tonumber(s[3]) or 0
  else
    return 0
  end
  local give = math.min(units, have)
  if give > 0 then redis.call('HINCRBY', key, field, -give) end
  return give
end
