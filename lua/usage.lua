--[[ usage.lua — the entry point of a quota question: what a client has left of each limit,
read from the state check.lua decides with, without writing anything.

The script sent to Redis is lib.lua, the six algorithm files, limits.lua and this file
(USAGE_FILES in src/limit/store/redis/sources.rs).

KEYS[i]   one key per limit asked about (one client's: one hash tag, one Redis Cluster slot)
ARGV      as check.lua's: the time spec, a cost (ignored: every limit is asked at cost 0, which
          only reports), a slot id (ignored), six per limit
Reply     as check.lua's: 1, now_ms, four per limit (admitted, remaining, reset_ms,
          retry_after_ms), and an empty name
Writes    nothing: one TIME and one read per key, which costs Redis less than the decision of a
          request asking the same limits (which also writes each and sets its TTL).
]]
local n = #KEYS
if #ARGV ~= 3 + 6 * n then
  return redis.error_reply('turnstile usage.lua: expected 3 + 6 arguments per key, got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local now = now_ms(ARGV[1])
local reply = { '1', string.format('%d', now) }
for i = 1, n do
  local d = decide_limit(KEYS[i], 3 + 6 * (i - 1), now, 0, '')
  reply[i + 2] = string.format('%d %d %d %d', d[1], d[2], d[3], d[4])
end
reply[n + 3] = ''
return table.concat(reply, ' ')
