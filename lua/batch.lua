--[[ batch.lua — the entry point of a batch: many requests' check.lua calls in one, decided in
arrival order, atomically, on one TIME. The gateway sends one while another call is in flight
on the same connection, with every decision that arrived meanwhile (src/limit/store/redis/batch.rs);
Redis's cost per call (dispatch, argument conversion, TIME, script setup) is then paid once
for many decisions.

The script sent to Redis is this shebang line, then the files of check.lua with this file in
its place (BATCH_FILES in src/limit/store/redis/sources.rs). `allow-cross-slot-keys`: on a
Redis Cluster a batch holds the keys of many clients, so of many slots — every one served by
the node it is sent to (else Redis refuses the whole call with MOVED or ASK, and the gateway
sends its members one by one).

KEYS      every member's keys, member after member
ARGV[1]   the number of members, m
ARGV[2..] per member: its key count n, its argument count a, then its a arguments exactly as
          check.lua's ARGV (time spec, cost, slot id, six per limit, optional costs)
Reply     an array of m strings, in member order: check.lua's reply for each, or "E <message>"
          for a member whose arguments or keys were wrong (that member decided nothing; the
          others are decided as if it were not there)
Writes    as m check.lua calls, in order.
]]
local clock_ms
-- One TIME for the whole batch; a test's explicit or shifted time is the member's own.
local function batch_clock(spec)
  if spec ~= '' then return now_ms(spec) end
  if not clock_ms then clock_ms = now_ms('') end
  return clock_ms
end

local m = tonumber(ARGV[1])
if not m then
  return redis.error_reply('turnstile batch.lua: ARGV[1] must be the number of members')
end
local replies, kb, p = {}, 0, 2
for j = 1, m do
  local n, a = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
  if not n or not a or kb + n > #KEYS or p + 1 + a > #ARGV then
    -- The layout itself is broken: nothing after this point can be read.
    return redis.error_reply('turnstile batch.lua: member ' .. j .. ' runs past the keys or arguments')
  end
  local ok, reply, err = pcall(decide_request, kb, n, p + 1, a, batch_clock)
  if not ok then
    replies[j] = 'E ' .. tostring(reply)
  elseif not reply then
    replies[j] = 'E ' .. err
  else
    replies[j] = reply
  end
  kb, p = kb + n, p + 2 + a
end
if kb ~= #KEYS or p ~= #ARGV + 1 then
  return redis.error_reply('turnstile batch.lua: ' .. (#KEYS - kb) .. ' keys and ' .. (#ARGV + 1 - p) .. ' arguments left over')
end
return replies
