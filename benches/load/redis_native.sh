#!/usr/bin/env bash
# What a decision costs Redis in native code, next to Lua: Redis's instructions per batched
# decision with lua/batch.lua (one key per limit, token buckets) and with the native probe
# (benches/native_probe: a Redis module command, NOT the product — the same decisions, the
# same keys, state read and written in place, as 16 bytes or as Lua's own text). A private redis-server under callgrind, as
# benches/load/redis_packed.sh: batches of 64, clients drawn from a pool of $CLIENTS per row
# whose keys exist before counting (a returning client), plans of 1 and 4 token buckets.
#
#   benches/load/redis_native.sh        BATCHES=100 batches of 64 per row and round, ROUNDS=2
# Builds the probe first (cargo, and libclang for the redis-module crate's bindings:
# apt install libclang-dev), into target/native_probe.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/load/lib.sh

BATCHES=${BATCHES:-100}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-2000}
probe=$(benches/load/native_probe.sh)
REDIS_ARGS=(--loadmodule "$probe")
# shellcheck source=benches/load/callgrind_redis.sh
. benches/load/callgrind_redis.sh

batch=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES lua)")

# calls FORM LIMITS SEED PASS: BATCHES calls of 64 members, clients of the row's pool (SEED
# names the pool; PASS the draw). Limits far above the load: every decision admits and writes.
calls() {
  python3 - "$BATCHES" "$CLIENTS" "$1" "$2" "$3" "$4" "$batch" <<'PY'
import random, sys
batches, clients, form, limits, seed, draw, batch = sys.argv[1:8]
batches, clients, limits = int(batches), int(clients), int(limits)
rng = random.Random(f"{seed}-{draw}")
big = 10**9
for b in range(batches):
    members = [rng.randrange(clients) for _ in range(64)]
    if form == "lua":
        keys = [f"t:{{n{seed}-{c}}}:a{i}" for c in members for i in range(limits)]
        member = f'{limits} {3 + 6 * limits} "" 1 "" ' + " ".join(
            f"l{i} tb {big} 1000 {big} 0" for i in range(limits))
        print(f"EVALSHA {batch} {len(keys)} {' '.join(keys)} 64 " + " ".join([member] * 64))
    else:
        command = "TSPROBE.BATCH" if form == "native" else "TSPROBE.BATCHTEXT"
        print(f"{command} 64 " + " ".join(
            f"{limits} " + " ".join(f"t:{{n{seed}-{c}}}:a{i} {big} 1000 {big}" for i in range(limits))
            for c in members))
PY
}

# Both forms decide alike: a bucket of 2 per second, asked three times at once.
for form in lua native text; do
  case $form in
    lua) one="EVALSHA $batch 3 t:{x}:$form t:{x}:$form t:{x}:$form 3 $(printf '1 9 "" 1 "" a tb 2 1000 2 0 %.0s' 1 2 3)" ;;
    native) one="TSPROBE.BATCH 3 $(printf '1 t:{x}:native 2 1000 2 %.0s' 1 2 3)" ;;
    text) one="TSPROBE.BATCHTEXT 3 $(printf '1 t:{x}:text 2 1000 2 %.0s' 1 2 3)" ;;
  esac
  got=$(cli <<<"$one" | awk '{print $1, $3, $4, $5, $6}' | tr '\n' ';')
  [[ $got == "1 1 1 500 0;1 1 0 1000 0;0 0 0 1000 500;" ]] ||
    { echo "$form decided otherwise: $got" >&2; exit 1; }
done
# The text form is Lua's own: what the probe wrote, Lua reads on (the bucket's last token,
# after the two the probe admitted, then a refusal), and what Lua wrote, the probe reads on.
cli DEL t:{x}:text t:{x}:text2 > /dev/null
cli TSPROBE.BATCHTEXT 1 1 t:{x}:text 3 1000 3 > /dev/null
got=$(cli <<<"EVALSHA $batch 2 t:{x}:text t:{x}:text 2 $(printf '1 9 "" 1 "" a tb 3 1000 3 0 %.0s' 1 2)" | awk '{print $1, $4}' | tr '\n' ';')
cli EVALSHA "$batch" 1 t:{x}:text2 1 1 9 "" 1 "" a tb 3 1000 3 0 > /dev/null
got+=$(cli <<<"TSPROBE.BATCHTEXT 3 $(printf '1 t:{x}:text2 3 1000 3 %.0s' 1 2 3)" | awk '{print $1, $4}' | tr '\n' ';')
[[ $got == "1 1;1 0;1 1;1 0;0 0;" ]] || { echo "the text form is not Lua's: $got" >&2; exit 1; }

ROWS=("lua 1" "native 1" "text 1" "lua 4" "native 4" "text 4")
count_pools

echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') under callgrind, $ROUNDS rounds × $BATCHES batches of 64, a pool of $CLIENTS clients per row, $(date -u +%F)"
echo
echo "| decision | limits (token buckets) | instructions per decision (each round) |"
echo "| --- | --- | --- |"
for r in "${ROWS[@]}"; do
  read -r form limits <<<"$r"
  label="Lua (lua/batch.lua)"
  if [[ $form == native ]]; then label="native (benches/native_probe), 16 bytes"; fi
  if [[ $form == text ]]; then label="native (benches/native_probe), Lua's text"; fi
  echo "| $label | $limits |${seen[$r]} |"
done
