--[[ lib.lua — helpers shared by the algorithm files and the entry points.

Lua numbers are doubles; every value the algorithms form stays below 2^52 (the config
loader checks limit × window), where doubles are exact integers and floor(a / b) is the
exact integer quotient.
]]
local function floor_div(a, b) return math.floor(a / b) end
local function ceil_div(a, b) return math.floor((a + b - 1) / b) end

-- The script's time in milliseconds: `arg` when given (deterministic tests), else Redis's
-- clock (TIME).
local function now_ms(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
