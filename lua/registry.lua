--[[ registry.lua — the client registry: clients, their plan and their API key digests,
shared by every gateway instance (the admin API writes, every instance reads).

KEYS[1]   {<prefix>:registry}:clients — a HASH: field = client id, value = the client as JSON
          (written and read by the gateway; this script compares and copies strings only)
KEYS[2]   {<prefix>:registry}:version — a counter, bumped by every change
ARGV[1]   the operation:
  "version"                      reply: the version (0: the registry is empty or was lost)
  "read"                         reply: { version, id1, json1, id2, json2, ... }
  "get", id                      reply: { version, json } ("" when absent)
  "cas", id, expected, new, max  compare and set one client: when its JSON is `expected`
                                 ("" = absent), it becomes `new` ("" = deleted) and the version
                                 is bumped; a new client beyond `max` clients is refused.
                                 reply: { 1, version } done, { 0, version } not (the caller
                                 reads again and retries), { 2, version } full
  "restore", version, id1, json1, ...
                                 writes a whole registry, only when Redis holds none (its version
                                 key is gone): an operator's recovery after Redis lost its data.
                                 reply: { 1, version } restored, { 0, version } refused
TTL       none: the registry is data, not a count. It needs Redis persistence (docs/registry.md).
Both keys share a hash tag, so one Cluster slot holds them and one script updates both.

The script sent to Redis is this file alone (src/limit/store/redis/sources.rs).
]]
if #KEYS ~= 2 or #ARGV < 1 then
  return redis.error_reply('turnstile registry.lua: expected 2 keys and an operation')
end
local op = ARGV[1]
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
if op == 'version' then
  return version
elseif op == 'read' then
  local out = { version }
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all do out[#out + 1] = all[i] end
  return out
elseif op == 'get' then
  if #ARGV ~= 2 then return redis.error_reply('turnstile registry.lua: get takes 1 argument') end
  return { version, redis.call('HGET', KEYS[1], ARGV[2]) or '' }
elseif op == 'cas' then
  if #ARGV ~= 5 then return redis.error_reply('turnstile registry.lua: cas takes 4 arguments') end
  local id, expected, new, max = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  local current = redis.call('HGET', KEYS[1], id) or ''
  if current ~= expected then return { 0, version } end
  if current == new then return { 1, version } end
  if current == '' and redis.call('HLEN', KEYS[1]) >= max then return { 2, version } end
  if new == '' then
    redis.call('HDEL', KEYS[1], id)
  else
    redis.call('HSET', KEYS[1], id, new)
  end
  return { 1, redis.call('INCR', KEYS[2]) }
elseif op == 'restore' then
  if version > 0 or redis.call('EXISTS', KEYS[1]) == 1 then return { 0, version } end
  local restored = tonumber(ARGV[2])
  for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('SET', KEYS[2], restored)
  return { 1, restored }
end
return redis.error_reply('turnstile registry.lua: unknown operation ' .. op)
