--[[ releasing.lua — a finished request's concurrency slots, freed: the body of release.lua's
release, and of each release member of batch.lua.

Function  release_request(kb, n, ab, argc) -> the number of slots removed (0 when never taken
          or already expired), or nil and an error message
  KEYS[kb + 1 .. kb + n]    the concurrency keys the request took a slot in (one client)
  ARGV[ab + 1]              the request's slot id (argc must be 1)
Effect    the slot leaves every key; TTLs are kept. A key that is not a set of slots fails the
          call (Redis's WRONGTYPE) after the keys before it were freed: freeing a request's
          own slot early never lets a client past its limit.
]]
local function release_request(kb, n, ab, argc)
  if argc ~= 1 then
    return nil, 'expected 1 argument to release, got ' .. argc
  end
  local slot_id, done = ARGV[ab + 1], 0
  for i = kb + 1, kb + n do
    done = done + redis.call('ZREM', KEYS[i], slot_id)
  end
  return done
end
