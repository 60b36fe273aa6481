--[[ decide.lua — one request's limits, decided atomically: the body of check.lua, and of each
decision member of batch.lua.

Function  decide_request(kb, n, ab, argc, clock) -> reply (a string), or nil and an error message
  KEYS[kb + 1 .. kb + n]   one key per limit: <prefix>:{<client id>}:<route>:<limit name>@<definition>
  ARGV[ab + 1 .. ab + argc] check.lua's arguments for this request (see check.lua): the time
                           spec, cost, slot id, six per limit, then optionally one cost per limit
  clock                    the time spec -> the decision's time in milliseconds, and maybe its
                           decimal text (now_ms: no text; batch.lua's: one TIME for the whole
                           batch, formatted once)
Reply     check.lua's reply (see there).
Writes    nothing unless every enforced limit admits; then the new state of every limit that
          admits (a shadow limit that would have rejected is left as it is).
]]
local PER = 6

local function decide_request(kb, n, ab, argc, clock)
  local costs = argc == 3 + (PER + 1) * n
  if argc ~= 3 + PER * n and not costs then
    return nil, 'expected 3 + 6 arguments per key (and a cost per key), got ' .. argc .. ' for ' .. n .. ' keys'
  end
  local now, now_text = clock(ARGV[ab + 1])
  local cost = ARGV[ab + 2] + 0
  local slot_id = ARGV[ab + 3]
  if n == 1 then
    -- One limit (the commonest plan), the same decision without the tables and closures
    -- several limits need: Redis CPU per decision is what sizes a store.
    local o = ab + 3
    local c = costs and ARGV[o + PER + 1] + 0 or cost
    local d, commit = decide_limit(KEYS[kb + 1], o, now, c, slot_id, now_text)
    local admitted, rejected = '1', ''
    if d[1] == 1 then
      commit()
      -- The commonest reply.
      if now_text then return string.format('1 %s 1 %d %d %d ', now_text, d[2], d[3], d[4]) end
      return string.format('1 %d 1 %d %d %d ', now, d[2], d[3], d[4])
    elseif ARGV[o + 6] ~= '1' then
      admitted, rejected = '0', ARGV[o + 1]
    end
    return string.format('%s %d %d %d %d %d %s', admitted, now, d[1], d[2], d[3], d[4], rejected)
  end
  local function decide(i, c)
    return decide_limit(KEYS[kb + i], ab + 3 + PER * (i - 1), now, c, slot_id, now_text)
  end

  local decisions, commits, rejected = {}, {}, ''
  for i = 1, n do
    local d, commit = decide(i, costs and ARGV[ab + 3 + PER * n + i] + 0 or cost)
    decisions[i], commits[i] = d, commit
    local o = ab + 3 + PER * (i - 1)
    if d[1] == 0 and rejected == '' and ARGV[o + 6] ~= '1' then
      rejected = ARGV[o + 1]
    end
  end

  if rejected == '' then
    for i = 1, n do
      if commits[i] then commits[i]() end
    end
  else
    -- Nothing is written: limits that would have admitted report their state as it stays.
    for i = 1, n do
      if decisions[i][1] == 1 then decisions[i] = decide(i, 0) end
    end
  end

  return reply_of(rejected == '' and '1' or '0', now, now_text, decisions, rejected)
end
