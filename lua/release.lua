--[[ release.lua — a request ended: give back its concurrency slots; or, for a request that
lasts (an upgraded WebSocket connection), keep them.

The script sent to Redis is this file alone (src/limit/store/redis/scripts.rs).

KEYS[i]   the concurrency keys the request took a slot in (one client: one hash tag)
ARGV[1]   the request's slot id
ARGV[2]   absent: release. A slot time to live in ms: renew — each slot the request still
          holds lives that long from now (Redis's clock), and its key at least a second longer; a
          slot that already expired is not taken again (the request lost it)
Reply     release: the number of slots removed (0 when they were never taken or already
          expired); renew: the number of slots renewed
]]
if (#ARGV ~= 1 and #ARGV ~= 2) or #KEYS == 0 then
  return redis.error_reply('turnstile release.lua: expected at least one key and 1 or 2 arguments, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local done = 0
if #ARGV == 1 then
  for i = 1, #KEYS do
    done = done + redis.call('ZREM', KEYS[i], ARGV[1])
  end
  return done
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  local until_ms = tonumber(redis.call('ZSCORE', KEYS[i], ARGV[1]))
  if until_ms and until_ms > now then
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[1])
    -- As concurrency.lua's expire(): the slot's life plus lib.lua's TTL_GRACE_MS.
    if redis.call('PTTL', KEYS[i]) < ttl + 1000 then
      redis.call('PEXPIRE', KEYS[i], ttl + 1000)
    end
    done = done + 1
  end
end
return done
