--[[ check.lua — the entry point: several limits of one client, decided atomically.

The script sent to Redis is lib.lua, the six algorithm files (token bucket, leaky bucket, fixed
window, sliding window, sliding log, concurrency), limits.lua (reading a limit's arguments),
decide.lua (the decision itself, shared with batch.lua) and this file, concatenated in that
order (the list is CHECK_FILES in
src/limit/store/redis/sources.rs); it is loaded once per connection and called by SHA
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
local reply, err = decide_request(0, #KEYS, 0, #ARGV, now_ms)
if not reply then
  return redis.error_reply('turnstile check.lua: ' .. err)
end
return reply
