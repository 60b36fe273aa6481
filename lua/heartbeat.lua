--[[ heartbeat.lua — gateway instances announce themselves; the reply is how many are alive.

KEYS[1]   <prefix>:instances — a ZSET: member = instance id, score = last heartbeat (ms,
          Redis's clock)
ARGV[1]   this instance's id
ARGV[2]   liveness in ms: an instance not heard from for that long is no longer counted
ARGV[3]   "1" to leave (graceful shutdown): remove this instance instead of refreshing it
Reply     the number of live instances (after this call)
TTL       the whole set expires `liveness` after the last heartbeat of any instance.

The script sent to Redis is this file alone (src/limit/store/redis/sources.rs).
]]
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply('turnstile heartbeat.lua: expected 1 key and 3 arguments, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local liveness = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - liveness)
local live = redis.call('ZCARD', KEYS[1])
if live > 0 then redis.call('PEXPIRE', KEYS[1], liveness) end
return live
