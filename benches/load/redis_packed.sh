#!/usr/bin/env bash
# What "packed state" would buy Redis, counted before it is built: Redis's instructions per
# batched decision with today's scripts (lua/batch.lua: one key per limit — a token bucket's
# STRING, one GET and one SET … PX each; a HASH before, HMGET, HSET and PEXPIRE) next to benches/load/packed_probe.lua (a prototype, not the product: a
# client's limits in one string — one GET, one SET … PX), for plans of 1 and 4 token buckets,
# in three forms: positional ("<level> <updated> …" in the plan's order: the ceiling), entries
# found by id and each with its own expiry, and the plan's signature first (by position when it
# matches, by id otherwise) — the last two keep what a product must: counts across a plan
# change, an exempted limit's state, expiry of state no request names.
# A private redis-server under callgrind, as benches/load/redis_count.sh; clients drawn from a
# pool of $CLIENTS per row, the pool's keys written once before counting, so decisions read
# state that exists (a returning client, the common case).
#
#   benches/load/redis_packed.sh        BATCHES=200 batches of 64 per row and round, ROUNDS=2
#   BEFORE_LUA=<dir>: the hash rows again with that directory's scripts (as redis_count.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/load/lib.sh

BATCHES=${BATCHES:-200}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-2000}
# shellcheck source=benches/load/callgrind_redis.sh
. benches/load/callgrind_redis.sh

batch=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES lua)")
before_sha=""
if [[ -n ${BEFORE_LUA:-} ]]; then
  before_sha=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES "$BEFORE_LUA")")
fi
probe=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; cat benches/load/packed_probe.lua)")

# calls FORM LIMITS SEED PASS: BATCHES calls of 64 members, clients of the row's pool (SEED
# names the pool; PASS the draw). Limits far above the load: every decision admits and writes.
calls() {
  python3 - "$BATCHES" "$CLIENTS" "$1" "$2" "$3" "$4" "$batch" "$probe" "$before_sha" <<'PY'
import random, sys
batches, clients, form, limits, seed, draw, batch, probe, before = sys.argv[1:10]
if form == "before":
    form, batch = "hash", before
batches, clients, limits = int(batches), int(clients), int(limits)
rng = random.Random(f"{seed}-{draw}")
big = 10**9
for b in range(batches):
    members = [rng.randrange(clients) for _ in range(64)]
    if form == "hash":
        keys = [f"t:{{p{seed}-{c}}}:a{i}" for c in members for i in range(limits)]
        member = f'{limits} {3 + 6 * limits} "" 1 "" ' + " ".join(
            f"l{i} tb {big} 1000 {big} 0" for i in range(limits))
        print(f"EVALSHA {batch} {len(keys)} {' '.join(keys)} 64 " + " ".join([member] * 64))
    else:
        keys = [f"t:{{p{seed}-{c}}}:plan" for c in members]
        ids = [f"per-second-{i}@tb2:{big}/1000/{big}" for i in range(limits)]
        if form == "signed":
            member = f"s{limits} {','.join(ids)} " + " ".join(
                f"{ids[i]} {big} 1000 {big}" for i in range(limits))
        elif form == "ids":
            # Each limit's id as the product names a limit: its name and definition.
            member = f"-{limits} " + " ".join(
                f"per-second-{i}@tb2:{big}/1000/{big} {big} 1000 {big}" for i in range(limits))
        else:
            member = f"{limits} " + " ".join(f"{big} 1000 {big}" for _ in range(limits))
        print(f"EVALSHA {probe} 64 {' '.join(keys)} 64 " + " ".join([member] * 64))
PY
}

ROWS=("hash 1" "packed 1" "ids 1" "signed 1" "hash 4" "packed 4" "ids 4" "signed 4")
if [[ -n $before_sha ]]; then ROWS+=("before 1" "before 4"); fi
count_pools

echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') under callgrind, $ROUNDS rounds × $BATCHES batches of 64, a pool of $CLIENTS clients per row, $(date -u +%F)"
echo
echo "| state | limits (token buckets) | instructions per decision (each round) |"
# hash: lua/'s batch.lua, a key per limit (the row's name from when a bucket was a HASH).
echo "| --- | --- | --- |"
for r in "${ROWS[@]}"; do
  read -r form limits <<<"$r"
  label="a key per limit (lua/)"
  if [[ $form == packed ]]; then label="packed (prototype), positional"; fi
  if [[ $form == ids ]]; then label="packed (prototype), entries by id"; fi
  if [[ $form == signed ]]; then label="packed (prototype), the plan's signature first"; fi
  if [[ $form == before ]]; then label="a key per limit, $BEFORE_LUA's scripts"; fi
  echo "| $label | $limits |${seen[$r]} |"
done
