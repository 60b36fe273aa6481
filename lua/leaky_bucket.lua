--[[ leaky_bucket.lua — the leaky bucket that delays (nginx's limit_req), on one HASH key.

Function  leaky_bucket(key, now, cost, limit, window, shape, _, now_text) -> decision, commit
  key     HASH with fields  l = the backlog in request·ms (requests × window, drained at
                                `limit` per ms: exact for any rate)
                            t = time of the last update (ms)
                            h = turns given back (refund.lua): up to HOLES times (ms),
                                space-separated
          A missing key is an empty bucket.
  shape   "burst:delay": most requests ahead that may wait, and how many ahead still pass
          at once
  now_text  `now` as decimal text, or nil: written as it is (token_bucket.lua)
Returns   decision = {admitted 0/1, remaining, reset_ms (until empty), retry_after_ms}; an
          admitted request's retry_after_ms is how long the gateway holds it before
          forwarding it (0: at once).
          commit   = function writing the new state (nil when not admitted).
          A request of cost 1 that would wait (or be refused) takes the earliest turn given
          back that is still ahead instead, and leaves the backlog as it is.
TTL       until the bucket is empty, plus TTL_GRACE_MS (lib.lua).
Mirrors   src/limit/algorithm/leaky_bucket.rs.
]]
local function leaky_bucket(key, now, cost, limit, window, shape, _, now_text)
  local b, d = string.match(shape, '^(%d+):(%d+)$')
  local burst, delay = b * window, d * window
  local s = redis.call('HMGET', key, 'l', 't', 'h')
  local level, updated = 0, 0
  if s[1] and s[2] then
    level = s[1] + 0
    updated = s[2] + 0
  end
  local elapsed = now - updated
  if elapsed < 0 then elapsed = 0 end
  level = math.max(0, level - elapsed * limit)
  if now < updated then now, now_text = updated, nil end
  -- Turns given back that are still ahead.
  local holes, first = {}, nil
  if s[3] then
    for v in string.gmatch(s[3], '%d+') do
      local h = v + 0
      if h > now then
        holes[#holes + 1] = h
        if first == nil or h < holes[first] then first = #holes end
      end
    end
  end
  if cost == 1 and level > delay and first then
    local wait = holes[first] - now
    table.remove(holes, first)
    local remaining = 0
    if level < burst then remaining = floor_div(burst - level, window) end
    local reset = ceil_div(level, limit)
    local commit = function()
      redis.call('HSET', key, 'l', level, 't', now_text or now, 'h', table.concat(holes, ' '))
      expire(key, reset)
    end
    return {1, remaining, reset, wait}, commit
  end
  if level <= burst then
    local after = level + cost * window
    local wait = ceil_div(math.max(0, level - delay), limit)
    local remaining = 0
    if after <= burst then remaining = floor_div(burst - after, window) + 1 end
    local reset = ceil_div(after, limit)
    local commit = function()
      redis.call('HSET', key, 'l', after, 't', now_text or now, 'h', table.concat(holes, ' '))
      expire(key, reset)
    end
    return {1, remaining, reset, wait}, commit
  end
  return {0, 0, ceil_div(level, limit), ceil_div(level - burst, limit)}, nil
end
