--[[ batch.lua — the entry point of a batch: many calls in one, run in arrival order,
atomically, on one TIME: requests' decisions (check.lua's), and the charges (charge.lua's),
refunds (refund.lua's), releases of concurrency slots (release.lua's) and quota questions
(usage.lua's) that arrived with them. The gateway sends one while another call is in flight on
the same connection, with every call that arrived meanwhile (src/limit/store/redis/batch.rs);
Redis's cost per call (dispatch, argument conversion, TIME, script setup) is then paid once
for many.

The script sent to Redis is this shebang line, then batch_keys.lua, the files of check.lua, then
return_units.lua, charging.lua, refunding.lua, releasing.lua and reporting.lua, with this file
last (BATCH_FILES in src/limit/store/redis/sources.rs). `allow-cross-slot-keys`: on a Redis
Cluster a batch holds the keys of many clients, so of many slots — every one served by the
node it is sent to (else Redis refuses the whole call with MOVED or ASK, and the gateway sends
its members one by one).

KEYS      every member's keys, member after member — or, on a Redis Cluster, none: Redis
          refuses (CROSSSLOT) a call whose declared keys span slots, even with the flag
          above, so there the keys follow the arguments (see "keys as arguments")
ARGV[1]   the number of members, m
ARGV[2..] per member: a decision's key count n, its argument count a, then its a arguments
          exactly as check.lua's ARGV; any other member opens with its kind (c: a charge,
          r: a refund, l: a release — "let go", u: a quota question), then n, a and its
          arguments as charge.lua's, refund.lua's, release.lua's or usage.lua's ARGV.
          (Decisions, the commonest members, carry no kind: one argument less per decision
          for Redis to read.)
Reply     an array of m strings, in member order: a decision's check.lua reply, a charge's,
          refund's or release's count of keys changed (as a string), a quota question's
          usage.lua reply, or "E <message>" for a
          member whose arguments or keys were wrong (that member wrote nothing — a release
          may have freed its slot in the keys before a wrong one: releasing.lua; the others
          run as if it were not there)
Writes    as m calls of those scripts, in order.

Keys as arguments (a Cluster): no key declared, ARGV[1] is "a<m>", and after the members'
arguments come every member's keys, member after member, then their number K; batch_keys.lua
(the script's first file) reads them as KEYS before anything runs. Each member's keys (one
slot) are then looked up first (EXISTS): a slot this node does not serve — the gateway's slot
map behind a move, or a slot migrating — answers "M <message>" for that member, which wrote
nothing; the gateway sends it alone, following the redirect.
]]
local clock_ms, clock_text
-- One TIME for the whole batch, and its decimal text, formatted once for the decisions'
-- replies and the times their buckets store; a test's explicit or shifted time is the
-- member's own (and has no text).
local function batch_clock(spec)
  if spec ~= '' then return now_ms(spec) end
  if not clock_ms then
    clock_ms = now_ms('')
    clock_text = string.format('%d', clock_ms)
  end
  return clock_ms, clock_text
end

if batch_layout_error then
  return redis.error_reply('turnstile batch.lua: ' .. batch_layout_error)
end

local m = tonumber(ARGV[1])
if not m then
  return redis.error_reply('turnstile batch.lua: ARGV[1] must be the number of members')
end
-- Every other member's script, by its kind (refund_request and release_request take no
-- clock: the extra argument is ignored).
local RUN = { c = charge_request, r = refund_request, l = release_request, u = usage_request }

local replies, kb, p = {}, 0, 2
for j = 1, m do
  -- A decision opens with its key count; any other member with its kind.
  local kind, h, n = nil, p, tonumber(ARGV[p])
  if not n then kind, h = ARGV[p], p + 1; n = tonumber(ARGV[h]) end
  local a = tonumber(ARGV[h + 1])
  if not n or not a or kb + n > #KEYS or h + 1 + a > #ARGV then
    -- The layout itself is broken: nothing after this point can be read.
    return redis.error_reply('turnstile batch.lua: member ' .. j .. ' runs past the keys or arguments')
  end
  local run = decide_request
  if kind then run = RUN[kind] end
  local here = true
  if keys_in_args and n > 0 then
    -- A slot this node does not serve (or one migrating): not run here, nothing written.
    local found = redis.pcall('EXISTS', unpack(KEYS, kb + 1, kb + n))
    if type(found) == 'table' and found.err then
      here = false
      replies[j] = 'M ' .. found.err
    end
  end
  if not here then
    -- Sent alone by the gateway, which follows the redirect.
  elseif not run then
    replies[j] = 'E unknown member kind ' .. kind
  else
    local ok, reply, err = pcall(run, kb, n, h + 1, a, batch_clock)
    if not ok then
      replies[j] = 'E ' .. tostring(reply)
    elseif not reply then
      replies[j] = 'E ' .. err
    elseif kind then
      -- A count (or a quota question's string), as a string: every reply of the array is one.
      replies[j] = tostring(reply)
    else
      replies[j] = reply
    end
  end
  kb, p = kb + n, h + 2 + a
end
if kb ~= #KEYS or p ~= #ARGV + 1 then
  return redis.error_reply('turnstile batch.lua: ' .. (#KEYS - kb) .. ' keys and ' .. (#ARGV + 1 - p) .. ' arguments left over')
end
return replies
