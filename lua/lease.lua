--[[ lease.lua — quota leasing: reserve a slice of every limit of a plan for one instance.

The script sent to Redis is lib.lua, fixed_window.lua, sliding_window.lua, return_units.lua
and this file (src/limit/store/redis/sources.rs).

A lease is a reservation: the granted units are counted in Redis now, in the same keys that
check.lua counts per request, so instances spending them later can never admit more than
the limit together (overshoot 0). A lease lives until the end of the window it was taken
in (the shortest window of the plan's limits); units an instance leaves unspent are the
price, and are given back when it renews after that window or shuts down.

KEYS[i]   the limit keys (the same as check.lua's)
ARGV[1]   "" for the server's clock (TIME); tests only: explicit ms, or "+<ms>" (lib.lua)
ARGV[2]   need: units the request asking must get (its cost, less what it already holds)
ARGV[3]   want: units to reserve (>= need); the same number is taken from every limit
ARGV[4..] six per limit: name, algorithm (fw | sw), limit, window_ms, and a lapsed lease to
          give back first: its window start and its unspent units (0 for none)
Reply     { granted units (0 when refused), now_ms, name of the first limit that cannot
            spare `need` or "", then four per limit: remaining after the grant, reset_ms (until
            the window ends: when the lease lapses), retry_after_ms (when refused: until
            `need` would fit), window start }
Writes    the give-backs; then, if every limit can spare `need`, each limit's count grows by
          the grant: min(want, what every limit can spare).
]]
local PER = 6
local n = #KEYS
if #ARGV ~= 3 + PER * n then
  return redis.error_reply('turnstile lease.lua: expected 3 + 6 arguments per key')
end
local now = now_ms(ARGV[1])
local need, want = tonumber(ARGV[2]), tonumber(ARGV[3])
local algorithms = { fw = fixed_window, sw = sliding_window }
local function arg(i, k) return ARGV[3 + PER * (i - 1) + k] end

local spare, grant = {}, want
for i = 1, n do
  local code, window = arg(i, 2), tonumber(arg(i, 4))
  if not algorithms[code] then error('turnstile lease.lua: cannot lease ' .. tostring(code)) end
  return_units(KEYS[i], code, tonumber(arg(i, 5)), window, tonumber(arg(i, 6)))
  spare[i] = algorithms[code](KEYS[i], now, 0, tonumber(arg(i, 3)), window)[2]
  grant = math.min(grant, spare[i])
end

local rejected = ''
if grant < need then grant = 0 end
local reply = { grant, now, '' }
for i = 1, n do
  local algorithm, limit, window = algorithms[arg(i, 2)], tonumber(arg(i, 3)), tonumber(arg(i, 4))
  local retry = 0
  if grant > 0 then
    local _, commit = algorithm(KEYS[i], now, grant, limit, window)
    commit()
  elseif spare[i] < need then
    retry = algorithm(KEYS[i], now, need, limit, window)[4]
    if rejected == '' then rejected = arg(i, 1) end
  end
  local start = now - now % window
  for _, v in ipairs({ spare[i] - grant, start + window - now, retry, start }) do
    reply[#reply + 1] = v
  end
end
reply[3] = rejected
return reply
