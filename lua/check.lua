--[[ check.lua — the entry point: several limits of one client, decided atomically.

The script sent to Redis is lib.lua, the six algorithm files (token bucket, leaky bucket, fixed
window, sliding window, sliding log, concurrency), limits.lua (reading a limit's arguments) and
this file, concatenated in that order (the list is CHECK_FILES in
src/limit/store/redis/scripts.rs); it is loaded once per connection and called by SHA
(EVALSHA).

KEYS[i]   one key per limit: <prefix>:{<client id>}:<route>:<limit name>@<definition>. The
          client id is the hash tag, so all keys of a call share one Redis Cluster slot.
ARGV[1]   "" to use the server's clock (TIME); tests only: an explicit time in milliseconds
          (window-edge scenarios replayed exactly) or "+<ms>", the server's clock plus an offset
          (see now_ms in lib.lua)
ARGV[2]   cost: units the request asks of every limit (an integer >= 1)
ARGV[3]   the request's slot id (names its concurrency slots; "" when it has none)
ARGV[4..] six per limit, in KEYS order: name, algorithm (tb | lb | fw | cw | sw | sl | cc), limit,
          window_ms (for cc: how long a slot lives unreleased; for cw, a calendar window, the
          bounds "previous:start:end:next"), burst (the token bucket's capacity; the leaky
          bucket's "burst:delay"), and
          shadow ("1": decided and counted, but never blocks the request)
          then, optionally, one cost per limit in KEYS order, replacing ARGV[2] for each (a
          limit charged from the response reserves its own units)
Reply     one string of integers separated by spaces: admitted 0/1, now_ms, then four per
          limit: admitted 0/1, remaining, reset_ms, retry_after_ms; then, after one more
          space, the name of the first enforced limit that rejected (empty when admitted).
          One string rather than an array: the gateway reads a single value per decision.
Writes    nothing unless every enforced limit admits; then the new state of every limit that
          admits (a shadow limit that would have rejected is left as it is, as if the request
          had been refused by it), each key with a TTL after which it reads exactly like a
          missing key (plus lib.lua's TTL_GRACE_MS).
]]
local PER = 6
local n = #KEYS
local costs = #ARGV == 3 + (PER + 1) * n
if #ARGV ~= 3 + PER * n and not costs then
  return redis.error_reply('turnstile check.lua: expected 3 + 6 arguments per key (and a cost per key), got ' .. #ARGV .. ' for ' .. n .. ' keys')
end
local now = now_ms(ARGV[1])
local cost = tonumber(ARGV[2])
local slot_id = ARGV[3]
local function decide(i, c)
  return decide_limit(i, now, c, slot_id)
end

local decisions, commits, rejected = {}, {}, ''
for i = 1, n do
  local d, commit = decide(i, costs and tonumber(ARGV[3 + PER * n + i]) or cost)
  decisions[i], commits[i] = d, commit
  local o = 3 + PER * (i - 1)
  if d[1] == 0 and rejected == '' and ARGV[o + 6] ~= '1' then
    rejected = ARGV[o + 1]
  end
end

if rejected == '' then
  for i = 1, n do
    if commits[i] then commits[i]() end
  end
else
  -- Nothing is written: limits that would have admitted report their state as it stays.
  for i = 1, n do
    if decisions[i][1] == 1 then decisions[i] = decide(i, 0) end
  end
end

-- One format per limit: string.format is the costly part of building the reply.
local reply = { rejected == '' and '1' or '0', string.format('%d', now) }
for i = 1, n do
  local d = decisions[i]
  reply[i + 2] = string.format('%d %d %d %d', d[1], d[2], d[3], d[4])
end
reply[n + 3] = rejected
return table.concat(reply, ' ')
