--[[ charge.lua — charge what requests turned out to cost, once their responses told.

A limit with `cost_from_response` counted a request's estimate when it was admitted; the
response says what it really cost (tokens an LLM used). This script counts the difference.

KEYS[i]   the keys of the charged limits (fixed or sliding window counters, one slot), then
          the charge's marker: sent again (a retry after a timeout), it is applied once
ARGV[1]   "" for the server's clock; tests only: an explicit time or "+<ms>" (lib.lua's now_ms)
ARGV[2]   the time the request was admitted at (check.lua's now_ms)
ARGV[3..] four per key: algorithm (fw | cw | sw), limit, window_ms (cw: the calendar bounds
          "previous:start:end:next" around now), delta (the units to add; negative: to give
          back)
Reply     the number of keys changed (0 for a charge applied before)
Effect    more: counted in the window current now (a fixed window that ended starts afresh;
          a sliding window rolls as check.lua rolls it), never beyond twice the limit (a
          budget goes below zero by at most one budget; beyond, the rest is not counted).
          Less: given back to the window the request was counted in (return_units.lua), if
          that is still the current one (or, sliding, the previous one).
TTL       as check.lua would set it for the window written.
Mirrors   State::charge in src/limit/algorithm/mod.rs.

The script sent to Redis is lib.lua, return_units.lua, charging.lua (the charge itself, shared
with batch.lua) and this file (src/limit/store/redis/sources.rs).
]]
local changed, err = charge_request(0, #KEYS, 0, #ARGV, now_ms)
if not changed then
  return redis.error_reply('turnstile charge.lua: ' .. err)
end
return changed
