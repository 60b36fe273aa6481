--[[ limits.lua — the limits of a call, as check.lua's arguments give them: six per limit from
ARGV[4] (name, algorithm, limit, window_ms, burst, shadow; see check.lua), one key each.

Function  reply_of(admitted, now, now_text, decisions, rejected) -> check.lua's reply (a string)
          for `decisions` taken at `now` (`now_text` its decimal text, or nil): decide.lua's
          for several limits, reporting.lua's for every quota question.

Function  decide_limit(key, o, now, cost, slot_id, now_text) -> decision, commit
          the limit whose six arguments are ARGV[o + 1 .. o + 6], on `key`, asked for `cost`
          units at `now` (whose decimal text is `now_text`, when the caller has it): its
          algorithm's decision and commit (see the algorithm files);
          nothing is written until commit runs. By offset, so that one call can hold many
          requests' arguments (batch.lua).
]]
local algorithms = { tb = token_bucket, lb = leaky_bucket, fw = fixed_window, cw = calendar_window, sw = sliding_window, sl = sliding_log, cc = concurrency }

-- Each number string.format writes costs Redis ~1k instructions, about as much as the rest of
-- a reply: what a reply always holds (an admitted limit's 1, a batch's time) is written as
-- text, not formatted again. One format per limit.
local function reply_of(admitted, now, now_text, decisions, rejected)
  local reply = { admitted, now_text or string.format('%d', now) }
  for i, d in ipairs(decisions) do
    reply[i + 2] = string.format(d[1] == 1 and '1 %d %d %d' or '0 %d %d %d', d[2], d[3], d[4])
  end
  reply[#decisions + 3] = rejected
  return table.concat(reply, ' ')
end

-- Arguments are read by offset, and strings are only turned into numbers where the algorithm
-- wants numbers (this runs on every decision: Redis CPU per call is what sizes a store).
local function decide_limit(key, o, now, c, slot_id, now_text)
  local code = ARGV[o + 2]
  local algorithm = algorithms[code]
  if not algorithm then
    error('turnstile limits.lua: unknown algorithm ' .. tostring(code))
  end
  local window, burst = ARGV[o + 4], ARGV[o + 5]
  if code ~= 'cw' then window = window + 0 end
  if code ~= 'lb' then burst = burst + 0 end
  return algorithm(key, now, c, ARGV[o + 3] + 0, window, burst, slot_id, now_text)
end
