--[[ lib.lua — integer helpers shared by the algorithm files.

Lua numbers are doubles; every value the algorithms form stays below 2^52 (the config
loader checks limit × window), where doubles are exact integers and floor(a / b) is the
exact integer quotient.
]]
local function floor_div(a, b) return math.floor(a / b) end
local function ceil_div(a, b) return math.floor((a + b - 1) / b) end
