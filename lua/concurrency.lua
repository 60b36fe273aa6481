--[[ concurrency.lua — requests of a client in flight, on one ZSET key.

Function  concurrency(key, now, cost, limit, slot_ttl, _, slot_id) -> decision, commit
  key       ZSET: member = a request's slot id, score = when the slot expires (ms). A slot
            past its expiry no longer counts, so a gateway that crashed holding slots gives
            them back after at most `slot_ttl`.
  cost      a request takes one slot whatever its cost; 0 = only report.
  limit     most requests in flight.
Returns   decision = {admitted 0/1, slots left, reset_ms (0: unknown), retry_after_ms (1000)}
          commit   = function dropping expired slots and adding this request's (nil when not
                     admitted). The slot is removed by release.lua when the request ends.
TTL       `slot_ttl` after the newest slot, plus TTL_GRACE_MS (lib.lua).
]]
local function concurrency(key, now, cost, limit, slot_ttl, _, slot_id)
  local live = redis.call('ZCOUNT', key, string.format('(%d', now), '+inf')
  local take = 0
  if cost > 0 then take = 1 end
  if live + take <= limit then
    local commit = function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      if take > 0 then
        redis.call('ZADD', key, now + slot_ttl, slot_id)
        expire(key, slot_ttl)
      end
    end
    return {1, limit - live - take, 0, 0}, commit
  end
  return {0, 0, 0, 1000}, nil
end
