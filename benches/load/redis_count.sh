#!/usr/bin/env bash
# Redis's instructions per decision, counted: a private redis-server under callgrind, the
# scripts of lua/ called with a new client (hash tag) per decision, as `make bench-redis-core`
# calls them — deterministic where that bench's wall clock on a shared VM is not (it cannot
# resolve a few percent: rows run one after another drift more than that). Instructions of
# the whole Redis process per decision (or charge), reading the calls and writing the
# replies included.
#
#   benches/load/redis_count.sh        CALLS=500 calls per row and round, ROUNDS=2
#   BEFORE_LUA=<dir>: the same rows with that directory's scripts (an older lua/, with its
#   sources.rs beside them when the file lists differ: see redis_core.sh), alternated in
#   every round — the way to show what a change to the scripts costs Redis.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/load/lib.sh

CALLS=${CALLS:-500}
ROUNDS=${ROUNDS:-2}
# shellcheck source=benches/load/callgrind_redis.sh
. benches/load/callgrind_redis.sh

# One row's calls, one per line for redis-cli: SHA, members per call (0: a script's own call),
# member kind ("" for a decision, c a charge, l a release, u a quota question), its arguments; a
# new client per member, the seed choosing them (and naming them: no two rows share a key,
# which one row's script could not read — a set of slots is not a hash).
calls() { # sha members kind seed args...
  python3 - "$CALLS" "$@" <<'PY'
import random, sys
calls, sha, members, kind, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
args = " ".join('""' if a == "@" else a for a in sys.argv[6:])
rng = random.Random(seed)
for _ in range(calls):
    if members == 0:
        print(f"EVALSHA {sha} 1 t:{{c{seed}-{rng.randrange(10**12)}}}:a {args}")
        continue
    keys = " ".join(f"t:{{c{seed}-{rng.randrange(10**12)}}}:a" for _ in range(members))
    member = (kind + " " if kind else "") + f"1 {len(sys.argv) - 6} {args}"
    print(f"EVALSHA {sha} {members} {keys} {members} " + " ".join([member] * members))
PY
}

BIG=1000000000
TB="@ 1 @ a tb $BIG 1000 $BIG 0"
# A leaky bucket whose backlog never holds a request (shape "burst:delay").
LB="@ 1 @ a lb $BIG 1000 $BIG:$BIG 0"
FW_CHARGE="@ 0 fw $BIG 60000 1"
# A concurrency check taking slot s1 (time, cost, slot id, then the limit); its release.
CC="@ 1 s1 a cc $BIG 60000 $BIG 0"
RELEASE="s1"
# A quota question about one limit (usage.lua: cost and slot id ignored).
USAGE="@ 0 @ a tb $BIG 1000 $BIG 0"
declare -A row per
add_row() { # label members-per-call script-and-arguments
  row[$1]=$3
  per[$1]=$2
}
add_rows() { # label-suffix label-prefix lua-dir
  local check batch charge release usage
  check=$(cli SCRIPT LOAD "$(source_of CHECK_FILES "$3")")
  batch=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES "$3")")
  charge=$(cli SCRIPT LOAD "$(source_of CHARGE_FILES "$3")")
  release=$(cli SCRIPT LOAD "$(source_of RELEASE_FILES "$3")")
  usage=$(cli SCRIPT LOAD "$(source_of USAGE_FILES "$3")")
  add_row "b$1. $2""1 limit: token bucket, one call each" 1 "$check 0 - $TB"
  add_row "k$1. $2""1 limit: token bucket, batches of 64" 64 "$batch 64 - $TB"
  add_row "l$1. $2""1 limit: leaky bucket, batches of 64" 64 "$batch 64 - $LB"
  add_row "p$1. $2""charge, 1 limit (fw), one call each" 1 "$charge 0 - $FW_CHARGE"
  # A batch.lua older than member kinds cannot carry charges.
  if grep -q charge_request "$3/batch.lua"; then
    add_row "q$1. $2""charges, 1 limit (fw), batches of 64" 64 "$batch 64 c $FW_CHARGE"
  fi
  add_row "s$1. $2""concurrency check (1 limit), one call each" 1 "$check 0 - $CC"
  add_row "t$1. $2""concurrency checks (1 limit), batches of 64" 64 "$batch 64 - $CC"
  # A release of a slot its (new) key does not hold: the call's own cost, ZREM of nothing.
  add_row "u$1. $2""release (1 key), one call each" 1 "$release 0 - $RELEASE"
  if grep -q release_request "$3/batch.lua"; then
    add_row "v$1. $2""releases (1 key), batches of 64" 64 "$batch 64 l $RELEASE"
  fi
  # A quota question about a (new) key with no state: the read of nothing, and the call.
  add_row "w$1. $2""quota question (1 limit), one call each" 1 "$usage 0 - $USAGE"
  if grep -q usage_request "$3/batch.lua"; then
    add_row "x$1. $2""quota questions (1 limit), batches of 64" 64 "$batch 64 u $USAGE"
  fi
}
add_rows "" "" lua
if [[ -n ${BEFORE_LUA:-} ]]; then add_rows 0 "before: " "$BEFORE_LUA"; fi

labels=$(printf '%s\n' "${!row[@]}" | sort | tr ' ' '\001')
declare -A seen
seed=1
for label in $labels; do # warm-up: scripts compiled, Redis's tables grown
  label=${label//$'\001'/ }
  read -r -a a <<<"${row[$label]}"
  CALLS=50 calls "${a[0]}" "${a[1]}" "${a[2]/-/}" $((seed++)) "${a[@]:3}" > "$work/warm"
  count "$work/warm" >/dev/null
  seen[$label]=""
done
for round in $(seq "$ROUNDS"); do
  order=sort
  if (( round % 2 == 0 )); then order="sort -r"; fi
  for label in $(printf '%s\n' "${!row[@]}" | $order | tr ' ' '\001'); do
    label=${label//$'\001'/ }
    read -r -a a <<<"${row[$label]}"
    calls "${a[0]}" "${a[1]}" "${a[2]/-/}" $((seed++)) "${a[@]:3}" > "$work/calls"
    total=$(count "$work/calls")
    seen[$label]+=" $((total / (CALLS * ${per[$label]})))"
  done
done

echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') under callgrind, $ROUNDS rounds × $CALLS calls, $(date -u +%F)"
echo
echo "| row | instructions per decision (each round) |"
echo "| --- | --- |"
for label in $labels; do
  label=${label//$'\001'/ }
  echo "| ${label#*. } |${seen[$label]} |"
done
