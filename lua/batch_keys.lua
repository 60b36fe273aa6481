--[[ batch_keys.lua — the first file of batch.lua's script: where the batch's keys are.

On a single node (or Sentinel's primary) a batch declares its keys (KEYS). On a Redis Cluster
it cannot: Redis refuses (CROSSSLOT) a call whose declared keys span slots, even with the
script's allow-cross-slot-keys flag, and a batch holds many clients' slots of one node. There
the batch declares none, ARGV[1] is "a<m>" (m members), and after the members' arguments come
every member's keys, member after member, then their number. This file reads them into the
chunk's own KEYS and ARGV (locals that every function after it sees; Redis's tables are left
as they are), ARGV without the keys, so batch.lua reads either layout alike.
]]
local KEYS, ARGV = KEYS, ARGV
local keys_in_args, batch_layout_error = false, nil
if string.sub(ARGV[1] or '', 1, 1) == 'a' then
  keys_in_args = true
  local total = #ARGV
  local k = tonumber(ARGV[total])
  if not k or k < 0 or k > total - 2 then
    batch_layout_error = 'the key count after the arguments is wrong'
  else
    local base = total - 1 - k
    local keys, args = {}, { string.sub(ARGV[1], 2) }
    for i = 2, base do args[i] = ARGV[i] end
    for i = 1, k do keys[i] = ARGV[base + i] end
    KEYS, ARGV = keys, args
  end
end
