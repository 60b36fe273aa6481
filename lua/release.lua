--[[ release.lua — a request ended: give back its concurrency slots.

KEYS[i]   the concurrency keys the request took a slot in (same hash tag: one slot)
ARGV[1]   the request's lease id
Reply     the number of leases removed
]]
local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[1])
end
return removed
