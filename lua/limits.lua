--[[ limits.lua — the limits of a call, as check.lua's arguments give them: six per limit from
ARGV[4] (name, algorithm, limit, window_ms, burst, shadow; see check.lua), one key each.

Function  decide_limit(key, o, now, cost, slot_id, now_text) -> decision, commit
          the limit whose six arguments are ARGV[o + 1 .. o + 6], on `key`, asked for `cost`
          units at `now` (whose decimal text is `now_text`, when the caller has it): its
          algorithm's decision and commit (see the algorithm files);
          nothing is written until commit runs. By offset, so that one call can hold many
          requests' arguments (batch.lua).
]]
local algorithms = { tb = token_bucket, lb = leaky_bucket, fw = fixed_window, cw = calendar_window, sw = sliding_window, sl = sliding_log, cc = concurrency }

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
