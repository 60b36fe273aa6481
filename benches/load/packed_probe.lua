--[[ packed_probe.lua — NOT the product: a prototype of "packed state" (issue: batched
decisions), for benches/load/redis_packed.sh to count before anyone builds it.

A batch of decisions like batch.lua's, where each member's token buckets (one or several
limits of one client's plan) live in ONE string key, "<level> <updated> <level> <updated> …",
read with one GET and written with one SET … PX, instead of one key per limit (a HASH when
this was written: HMGET, HSET, PEXPIRE each; since, a STRING per bucket: GET, SET … PX each). The arithmetic is token_bucket.lua's, the reply decide.lua's (one string per
member, the same formats), so that what the count shows is the representation alone.

KEYS      one per member
ARGV[1]   the number of members, m
ARGV[2..] per member: n (limits), then per limit: limit, window_ms, burst
Reply     an array of m strings, as batch.lua's decisions'.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

local m, p, replies = tonumber(ARGV[1]), 2, {}
for j = 1, m do
  local key, n = KEYS[j], tonumber(ARGV[p])
  local stored = redis.call('GET', key)
  local state = {}
  if stored then
    for x in string.gmatch(stored, '%d+') do state[#state + 1] = tonumber(x) end
  end
  local admitted, parts, out, ttl = true, {}, {}, 0
  for i = 1, n do
    local o = p + 3 * (i - 1)
    local limit, window, burst = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
    local cap = burst * window
    local level, updated = cap, 0
    if state[2 * i] then level, updated = state[2 * i - 1], state[2 * i] end
    local elapsed = math.max(0, now - updated)
    level = math.min(cap, level + elapsed * limit)
    local need = window
    if level >= need then
      local after = level - need
      local reset = ceil_div(cap - after, limit)
      if reset > ttl then ttl = reset end
      out[2 * i - 1], out[2 * i] = after, now
      parts[i] = string.format('1 %d %d 0', math.floor(after / window), reset)
    else
      admitted = false
      parts[i] = string.format('0 %d %d %d', math.floor(level / window), ceil_div(cap - level, limit), ceil_div(need - level, limit))
    end
  end
  if admitted then
    local fmt = string.rep('%d %d ', n)
    redis.call('SET', key, string.format(fmt, unpack(out)), 'PX', ttl + 1000)
  end
  replies[j] = string.format('%s %d ', admitted and '1' or '0', now) .. table.concat(parts, ' ') .. ' '
  p = p + 1 + 3 * n
end
return replies
