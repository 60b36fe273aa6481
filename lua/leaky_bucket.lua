--[[ leaky_bucket.lua — the leaky bucket that delays (nginx's limit_req), on one STRING key.

Function  leaky_bucket(key, now, cost, limit, window, shape, _, now_text) -> decision, commit
  key     STRING "<level> <updated>[ <turn> …]" (lib.lua's bucket_of), decimal integers:
          the backlog in request·ms (requests × window, drained at `limit` per ms: exact for
          any rate), the time of the last update (ms), then the turns given back
          (refund.lua): up to HOLES times (ms).
          One GET reads it and one SET … PX writes it with its TTL (a HASH took HMGET, HSET
          and PEXPIRE).
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
-- A leaky bucket's text (lib.lua's bucket_text), its turns given back (`holes`) after it.
local function leaky_text(level, now, now_text, holes)
  local text = bucket_text(level, now, now_text)
  if holes[1] then text = text .. ' ' .. table.concat(holes, ' ') end
  return text
end

local function leaky_bucket(key, now, cost, limit, window, shape, _, now_text)
  local b, d = string.match(shape, '^(%d+):(%d+)$')
  local burst, delay = b * window, d * window
  local stored = redis.call('GET', key)
  local level, updated, turns = 0, 0, nil
  if stored then level, updated, turns = bucket_of(key, stored) end
  local elapsed = now - updated
  if elapsed < 0 then elapsed = 0 end
  level = math.max(0, level - elapsed * limit)
  if now < updated then now, now_text = updated, nil end
  -- Turns given back that are still ahead.
  local holes, first = {}, nil
  if turns then
    for v in string.gmatch(turns, '%d+') do
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
      redis.call('SET', key, leaky_text(level, now, now_text, holes), 'PX', reset + TTL_GRACE_MS)
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
      redis.call('SET', key, leaky_text(after, now, now_text, holes), 'PX', reset + TTL_GRACE_MS)
    end
    return {1, remaining, reset, wait}, commit
  end
  return {0, 0, ceil_div(level, limit), ceil_div(level - burst, limit)}, nil
end
