--[[ packed_probe.lua — NOT the product: a prototype of "packed state" (issue: batched
decisions), for benches/load/redis_packed.sh to count before anyone builds it.

A batch of decisions like batch.lua's, where each member's token buckets (one or several
limits of one client's plan) live in ONE string key, "<level> <updated> <level> <updated> …",
read with one GET and written with one SET … PX, instead of one key per limit (a HASH when
this was written: HMGET, HSET, PEXPIRE each; since, a STRING per bucket: GET, SET … PX each). The arithmetic is token_bucket.lua's, the reply decide.lua's (one string per
member, the same formats), so that what the count shows is the representation alone.

KEYS      one per member
ARGV[1]   the number of members, m
ARGV[2..] per member, in one of three forms:
          n (limits), then per limit: limit, window_ms, burst — positional: the key holds
            "<level> <updated> …" in the plan's order (the cheapest; not a product form);
          -n, then per limit: id, limit, window_ms, burst — entries by id: one line per
            limit, "<id> <level> <updated> <expires>\n", found by its id (the limit's name
            and definition, so a plan change keeps the counts of unchanged limits); lines
            of limits the request does not name (exemptions, other plans' limits) kept until
            they expire; the key's TTL the latest line's;
          "s<n>", the plan's signature (its limits' ids joined by ","), then per limit: id,
            limit, window_ms, burst — the signature first: "<signature>\n<level> <updated> …";
            a request naming the stored signature reads and writes by position; any other
            (a plan changed, an exemption) maps the stored values by id, keeps the ones it
            does not name until their bucket would be full (their definition is in their
            id), and writes its own signature first.
Reply     an array of m strings, as batch.lua's decisions'.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

-- A token bucket's step at `now`, one unit asked (token_bucket.lua's arithmetic): admitted,
-- the level after, the time until full, and the member's reply part for this limit.
local function bucket_step(level, updated, limit, window, burst)
  local cap = burst * window
  local elapsed = math.max(0, now - updated)
  level = math.min(cap, level + elapsed * limit)
  if level >= window then
    local after = level - window
    local reset = ceil_div(cap - after, limit)
    return true, after, reset, string.format('1 %d %d 0', math.floor(after / window), reset)
  end
  return false, level, 0, string.format('0 %d %d %d', math.floor(level / window),
    ceil_div(cap - level, limit), ceil_div(window - level, limit))
end

-- n buckets whose stored values are `values` by position ("<level> <updated> …"), their
-- limit, window and burst at ARGV[o + 1 .. o + 3], o = base + stride × (i − 1): admitted, the
-- reply parts, the values to store by position, and the longest time until full.
local function decide_values(values, base, stride, n)
  local admitted, parts, out, ttl = true, {}, {}, 0
  for i = 1, n do
    local o = base + stride * (i - 1)
    local limit, window, burst = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
    local level, updated = burst * window, 0
    if values[2 * i] then level, updated = values[2 * i - 1], values[2 * i] end
    local ok, after, reset, part = bucket_step(level, updated, limit, window, burst)
    parts[i] = part
    if ok then
      if reset > ttl then ttl = reset end
      out[2 * i - 1], out[2 * i] = after, now
    else
      admitted = false
    end
  end
  return admitted, parts, out, ttl
end

-- The form with ids: a member whose n (at ARGV[p]) is negative; its limits from ARGV[p + 1].
local function decide_ids(key, p, n)
  local stored = redis.call('GET', key)
  local state = {}
  if stored then
    for line in string.gmatch(stored, '[^\n]+') do
      local id = string.match(line, '^%S+')
      state[id] = line
    end
  end
  local admitted, parts, out, ttl = true, {}, {}, 0
  for i = 1, n do
    local o = p + 4 * (i - 1)
    local id = ARGV[o + 1]
    local limit, window, burst = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
    local level, updated = burst * window, 0
    local line = state[id]
    if line then
      local l, u, e = string.match(line, ' (%d+) (%d+) (%d+)$')
      if tonumber(e) > now then level, updated = tonumber(l), tonumber(u) end
      state[id] = nil
    end
    local ok, after, reset, part = bucket_step(level, updated, limit, window, burst)
    parts[i] = part
    if ok then
      if reset > ttl then ttl = reset end
      out[i] = string.format('%s %d %d %d\n', id, after, now, now + reset)
    else
      admitted = false
    end
  end
  if admitted then
    -- The entries this request did not name, kept until they expire.
    for _, line in pairs(state) do
      local e = tonumber(string.match(line, ' (%d+)$'))
      if e > now then
        out[#out + 1] = line .. '\n'
        if e - now > ttl then ttl = e - now end
      end
    end
    redis.call('SET', key, table.concat(out), 'PX', ttl + 1000)
  end
  return string.format('%s %d ', admitted and '1' or '0', now) .. table.concat(parts, ' ') .. ' '
end

-- The positional form: a member whose n is positive; its limits from ARGV[p + 1].
local function decide_positional(key, p, n)
  local stored = redis.call('GET', key)
  local state = {}
  if stored then
    for x in string.gmatch(stored, '%d+') do state[#state + 1] = tonumber(x) end
  end
  local admitted, parts, out, ttl = decide_values(state, p, 3, n)
  if admitted then
    local fmt = string.rep('%d %d ', n)
    redis.call('SET', key, string.format(fmt, unpack(out)), 'PX', ttl + 1000)
  end
  return string.format('%s %d ', admitted and '1' or '0', now) .. table.concat(parts, ' ') .. ' '
end

-- The signature form: ARGV[p] is "s<n>", ARGV[p + 1] the signature, the limits after it.
local function decide_signed(key, p, n)
  local signature = ARGV[p + 1]
  local stored = redis.call('GET', key)
  local values, others = {}, nil
  if stored then
    local cut = string.find(stored, '\n', 1, true)
    local head = string.sub(stored, 1, cut - 1)
    local nums = {}
    for x in string.gmatch(string.sub(stored, cut + 1), '%d+') do nums[#nums + 1] = x + 0 end
    if head == signature then
      values = nums
    else
      -- Another plan's or request's layout: by id.
      others = {}
      local i = 0
      for id in string.gmatch(head, '[^,]+') do
        i = i + 1
        others[id] = { nums[2 * i - 1], nums[2 * i] }
      end
      for i = 1, n do
        local v = others[ARGV[p + 2 + 4 * (i - 1)]]
        if v then values[2 * i - 1], values[2 * i] = v[1], v[2] end
        others[ARGV[p + 2 + 4 * (i - 1)]] = nil
      end
    end
  end
  local admitted, parts, out, ttl = decide_values(values, p + 2, 4, n)
  if admitted then
    local head = signature
    if others then
      -- Entries this request does not name, kept until their bucket would be full.
      for id, v in pairs(others) do
        local limit, window, burst = string.match(id, '@tb2:(%d+)/(%d+)/(%d+)$')
        local full = v[2] + ceil_div(burst * window - v[1], limit)
        if full > now then
          head = head .. ',' .. id
          out[#out + 1], out[#out + 2] = v[1], v[2]
          if full - now > ttl then ttl = full - now end
        end
      end
    end
    local fmt = string.rep('%d %d ', #out / 2)
    redis.call('SET', key, head .. '\n' .. string.format(fmt, unpack(out)), 'PX', ttl + 1000)
  end
  return string.format('%s %d ', admitted and '1' or '0', now) .. table.concat(parts, ' ') .. ' '
end

local m, p, replies = tonumber(ARGV[1]), 2, {}
for j = 1, m do
  local key, n = KEYS[j], tonumber(ARGV[p])
  if not n then
    n = tonumber(string.sub(ARGV[p], 2))
    replies[j] = decide_signed(key, p, n)
    p = p + 2 + 4 * n
  elseif n < 0 then
    replies[j] = decide_ids(key, p, -n)
    p = p + 1 - 4 * n
  else
    replies[j] = decide_positional(key, p, n)
    p = p + 1 + 3 * n
  end
end
return replies
