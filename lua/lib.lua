--[[ lib.lua — helpers shared by the algorithm files and the entry points.

Lua numbers are doubles; every value the algorithms form stays below 2^52 (the config
loader checks limit × window), where doubles are exact integers and floor(a / b) is the
exact integer quotient.

On the decision path a string becomes a number by arithmetic (`s + 0`), not `tonumber(s)`:
Lua 5.1's `tonumber` converts its string twice, ~1.9k Redis instructions for a 13-digit
number against ~0.8k (counted on Redis 7.0; a one-limit decision converts six or seven,
and five more for each further limit). Both accept the
same strings; where one that is not a number must read as nil (batch.lua telling a member's
kind from its key count), `tonumber` stays.
]]
local function floor_div(a, b) return math.floor(a / b) end
local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

-- The script's time in milliseconds. `arg` is "" in production: Redis's clock (TIME). Tests
-- pass an explicit time ("<ms>": window edges replayed exactly), or an offset from Redis's
-- clock ("+<ms>": jumps ahead in time while staying in step with the clock Redis expires
-- keys by, however late the call reaches Redis).
local function now_ms(arg)
  local offset = 0
  if arg ~= '' then
    if string.sub(arg, 1, 1) ~= '+' then return tonumber(arg) end
    offset = tonumber(string.sub(arg, 2))
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + offset
end

-- Every key's TTL is the time after which its state reads exactly like a missing key, plus
-- this grace. A TTL only frees memory: a key that lives a little longer never changes a
-- decision, but a key gone a little early would (a half-full window read as empty). The
-- grace absorbs millisecond rounding between TIME and Redis's own expiry clock, clock
-- differences between a primary and the replica that takes over from it, and tests whose
-- explicit times run slightly behind Redis's clock.
local TTL_GRACE_MS = 1000

-- A call after a decision (a charge, a refund) is applied once however often it is sent: a
-- retry after a timeout may follow a first attempt that did run. Each carries a marker key of
-- its own (its last key, in its keys' slot), written with what it applied and kept
-- ONCE_TTL_MS — longer than the gateway tries a call again (ONCE_HORIZON in
-- src/limit/store/redis/settlements.rs).
local ONCE_TTL_MS = 300000
local function applied_before(marker) return redis.call('EXISTS', marker) == 1 end
local function mark_applied(marker) redis.call('SET', marker, '1', 'PX', ONCE_TTL_MS) end

local function expire(key, ttl_ms)
  redis.call('PEXPIRE', key, ttl_ms + TTL_GRACE_MS)
end

-- A bucket's STRING (token_bucket.lua, leaky_bucket.lua): "<level> <updated>", decimal
-- integers, a leaky bucket's followed by its turns given back. Read: the level, the time and
-- the rest of the text; an error names the key when it holds anything else.
local function bucket_of(key, stored)
  local l, t, rest = string.match(stored, '^(%d+) (%d+)(.*)$')
  if not t then error('turnstile: ' .. key .. ' holds no bucket') end
  return l + 0, t + 0, rest
end

-- A bucket's text at `now` (`now_text`, its decimal text, when the caller has it).
local function bucket_text(level, now, now_text)
  if now_text then return string.format('%d %s', level, now_text) end
  return string.format('%d %d', level, now)
end
