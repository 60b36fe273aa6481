--[[ heartbeat.lua — gateway instances announce themselves; the reply is how many are alive.
Also lists them (the fleet, for the admin API and the console).

KEYS[1]   <prefix>:instances — a ZSET: member = instance id, score = last heartbeat (ms,
          Redis's clock)
KEYS[2]   optional: {<prefix>:instances}:info — a HASH: instance id → what it says of itself
          (version, start time); its hash tag is KEYS[1]'s whole name, so both share one
          Redis Cluster slot. Gateways from before it send only KEYS[1] (and are listed with
          no info).
KEYS[3]   optional, with KEYS[2]: {<prefix>:instances}:limited — a HASH: instance id → who it
          refused most lately (its published summary, JSON; `ops/refusals.rs`), same slot.
ARGV[1]   this instance's id
ARGV[2]   liveness in ms: an instance not heard from for that long is no longer counted
ARGV[3]   "1" to leave (graceful shutdown): remove this instance instead of refreshing it;
          "list": change nothing, reply with the live instances
ARGV[4]   with KEYS[2]: this instance's info
ARGV[5]   with KEYS[3]: this instance's summary ("": nothing to show, the field is removed;
          "=": the same as it last published, left as it is)
Reply     the number of live instances (after this call); for "list", an array of
          {id, ms since its last heartbeat, info or "", summary or ""}
TTL       every key expires `liveness` after the last heartbeat of any instance; an instance
          no longer alive leaves the hashes at the next heartbeat of any other.

The script sent to Redis is this file alone (src/limit/store/redis/sources.rs).
]]
local info, limited = KEYS[2], KEYS[3]
if not (#KEYS >= 1 and #KEYS <= 3 and #ARGV == #KEYS + 2) then
  return redis.error_reply('turnstile heartbeat.lua: expected 1 to 3 keys and two arguments more than keys, got ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local liveness = tonumber(ARGV[2])
if ARGV[3] == 'list' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - liveness, '+inf', 'WITHSCORES')
  local out = {}
  for i = 1, #live, 2 do
    local said = ''
    local summary = ''
    if info then said = redis.call('HGET', info, live[i]) or '' end
    if limited then summary = redis.call('HGET', limited, live[i]) or '' end
    out[#out + 1] = { live[i], math.max(0, now - tonumber(live[i + 1])), said, summary }
  end
  return out
end
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if info then redis.call('HDEL', info, ARGV[1]) end
  if limited then redis.call('HDEL', limited, ARGV[1]) end
else
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  if info then redis.call('HSET', info, ARGV[1], ARGV[4]) end
  if limited then
    if ARGV[5] == '' then
      redis.call('HDEL', limited, ARGV[1])
    elseif ARGV[5] ~= '=' then
      redis.call('HSET', limited, ARGV[1], ARGV[5])
    end
  end
end
if info then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - liveness)
  for _, id in ipairs(gone) do
    redis.call('HDEL', info, id)
    if limited then redis.call('HDEL', limited, id) end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - liveness)
local live = redis.call('ZCARD', KEYS[1])
if live > 0 then
  redis.call('PEXPIRE', KEYS[1], liveness)
  if info then redis.call('PEXPIRE', info, liveness) end
  if limited then redis.call('PEXPIRE', limited, liveness) end
end
return live
