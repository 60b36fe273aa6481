--[[ give_back.lua — return the unspent units of leases (graceful shutdown).

The script sent to Redis is return_units.lua then this file (src/limit/store/redis/sources.rs).

KEYS[i]   the limit keys the leases were taken from (one client: one hash tag)
ARGV      four per key: algorithm (fw | sw), window_ms, the window start the lease
          belongs to (ms), and the unspent units
Reply     the number of units given back
]]
local PER = 4
if #ARGV ~= PER * #KEYS then
  return redis.error_reply('turnstile give_back.lua: expected 4 arguments per key')
end
local back = 0
for i = 1, #KEYS do
  local o = PER * (i - 1)
  back = back + return_units(KEYS[i], ARGV[o + 1], tonumber(ARGV[o + 3]), tonumber(ARGV[o + 2]),
    tonumber(ARGV[o + 4]))
end
return back
