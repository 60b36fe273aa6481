--[[ release.lua — a request ended: give back its concurrency slots.

The script sent to Redis is this file alone (src/limit/store/redis/scripts.rs).

KEYS[i]   the concurrency keys the request took a slot in (one client: one hash tag)
ARGV[1]   the request's slot id
Reply     the number of slots removed (0 when they were never taken or already expired)
]]
if #ARGV ~= 1 or #KEYS == 0 then
  return redis.error_reply('turnstile release.lua: expected at least one key and 1 argument, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[1])
end
return removed
