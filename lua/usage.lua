--[[ usage.lua — the entry point of a quota question: what a client has left of each limit,
read from the state check.lua decides with, without writing anything.

The script sent to Redis is lib.lua, the six algorithm files, limits.lua, reporting.lua (the
read itself, shared with batch.lua) and this file (USAGE_FILES in
src/limit/store/redis/sources.rs).

KEYS[i]   one key per limit asked about (one client's: one hash tag, one Redis Cluster slot)
ARGV      as check.lua's: the time spec, a cost (ignored: every limit is asked at cost 0, which
          only reports), a slot id (ignored), six per limit
Reply     as check.lua's: 1, now_ms, four per limit (admitted, remaining, reset_ms,
          retry_after_ms), and an empty name
Writes    nothing: one TIME and one read per key, which costs Redis less than the decision of a
          request asking the same limits (which also writes each and sets its TTL).
]]
local reply, err = usage_request(0, #KEYS, 0, #ARGV, now_ms)
if not reply then
  return redis.error_reply('turnstile usage.lua: ' .. err)
end
return reply
