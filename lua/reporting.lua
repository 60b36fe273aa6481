--[[ reporting.lua — what a client has left of each limit asked about, read without writing:
the body of usage.lua, and of each usage member of batch.lua.

Function  usage_request(kb, n, ab, argc, clock) -> reply (a string), or nil and an error message
  KEYS[kb + 1 .. kb + n]    one key per limit asked about
  ARGV[ab + 1 .. ab + argc] usage.lua's arguments (see there): the time spec, a cost and a slot
                            id (both ignored), six per limit
  clock                     the time spec -> the time in milliseconds (now_ms, or batch.lua's)
Reply     usage.lua's (see there).
Writes    nothing.
]]
local function usage_request(kb, n, ab, argc, clock)
  if argc ~= 3 + 6 * n then
    return nil, 'expected 3 + 6 arguments per key, got ' .. argc .. ' for ' .. n .. ' keys'
  end
  local now, now_text = clock(ARGV[ab + 1])
  local decisions = {}
  for i = 1, n do
    decisions[i] = decide_limit(KEYS[kb + i], ab + 3 + 6 * (i - 1), now, 0, '')
  end
  return reply_of('1', now, now_text, decisions, '')
end
