--[[ release.lua — a request ended: give back its concurrency slots; or, for requests that
last past a third of a slot's time to live, keep them — every such slot of an instance in one
call.

The script sent to Redis is releasing.lua (the release itself, shared with batch.lua), then
this file (src/limit/store/redis/sources.rs).

Release   KEYS[i] the concurrency keys the request took a slot in (one client: one hash tag)
          ARGV[1] the request's slot id
          Reply   the number of slots removed (0 when never taken or already expired)
Renew     KEYS[i] a concurrency key (repeated as often as it holds slots to renew; on Redis
                  Cluster every key of one call shares a hash tag)
          ARGV[1] 'renew'
          ARGV[2i], ARGV[2i+1]  the slot id held in KEYS[i], and its time to live in ms
          Reply   the number of slots renewed. Each slot still held lives its time to live
                  from now (Redis's clock), its key at least a second longer; a slot that
                  already expired is not taken again (its request lost it).
]]
if #KEYS == 0 then
  return redis.error_reply('turnstile release.lua: expected at least one key')
end
local done = 0
if ARGV[1] ~= 'renew' then
  local released, err = release_request(0, #KEYS, 0, #ARGV)
  if not released then
    return redis.error_reply('turnstile release.lua: ' .. err)
  end
  return released
end
if #ARGV ~= 1 + 2 * #KEYS then
  return redis.error_reply('turnstile release.lua: expected 1 + 2 arguments per key to renew, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local slot = ARGV[2 * i]
  local ttl = tonumber(ARGV[2 * i + 1])
  local until_ms = tonumber(redis.call('ZSCORE', KEYS[i], slot))
  if until_ms and until_ms > now then
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, slot)
    -- As concurrency.lua's expire(): the slot's life plus lib.lua's TTL_GRACE_MS.
    if redis.call('PTTL', KEYS[i]) < ttl + 1000 then
      redis.call('PEXPIRE', KEYS[i], ttl + 1000)
    end
    done = done + 1
  end
end
return done
