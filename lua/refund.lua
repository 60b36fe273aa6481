--[[ refund.lua — undo what check.lua committed for a request that another call rejected.

On Redis Cluster a request's limits can live in several slots (a plan's keys are tagged by the
client, a keyed limit's by its key), and one script may only touch one slot: the gateway
decides per slot, and when one slot rejects, the slots that admitted give their units back
with this script. Between the two calls another request can see those units taken (and be
refused for them, never admitted beyond a limit); they are back one round trip later.

The script sent to Redis is lib.lua (how a bucket's string reads and is written),
leaky_bucket.lua (a leaky bucket's turns after it), return_units.lua, refunding.lua (the refund itself, shared with
batch.lua) and this file (src/limit/store/redis/sources.rs).

KEYS[i]   the keys check.lua committed (one slot), then the refund's marker: sent again (a
          retry after a timeout), it gives back once
ARGV[1]   the time check.lua decided at (its reply's now_ms)
ARGV[2]   the request's slot id ("" when it took no concurrency slot)
ARGV[3..] five per key: algorithm (tb | lb | fw | cw | sw | sl | cc), the units the request
          counted in it, limit, window_ms (cw: the start of the calendar window the request
          was counted in), burst (lb: how long the request was held, 0 if it passed at once)
Reply     the number of keys given something back
Effect    fixed / sliding window: the units leave the window they were counted in (a sliding
          window that moved on since still weighs them as its previous window); leaky bucket:
          a request that passed at once leaves the backlog (never below empty), a held one
          of cost 1 leaves a hole at its turn for the next request (at most HOLES kept, the
          soonest dropped first), a costlier held one keeps its turns; token bucket:
          the tokens go back, up to its capacity; sliding log: `cost` entries of that
          millisecond are removed; concurrency: the request's slot is removed. TTLs are kept.
]]
local changed, err = refund_request(0, #KEYS, 0, #ARGV)
if not changed then
  return redis.error_reply('turnstile refund.lua: ' .. err)
end
return changed
