#!/usr/bin/env bash
# Decisions one Redis core sustains, per kind of plan: turnstile's own scripts (lua/, loaded
# in the order src/limit/store/redis/sources.rs lists them) called by redis-benchmark against
# a private redis-server, Redis pinned to CPU 0 and the load to CPU 1, a new client (hash
# tag) per call out of a million, as an API with many low-rate clients sees it. Per row:
# Redis's `usec_per_call` (INFO commandstats) and decisions per second of Redis CPU (user +
# system, from /proc: the script's work plus reading the call and writing the reply).
#
#   benches/load/redis_core.sh            ROUNDS=5 CALLS=200000 to change the defaults
#   BEFORE_LUA=<dir>: also the one-limit rows (b, k) with check.lua and batch.lua made from
#   that directory's files (an older lua/; with its own sources.rs beside them when the file
#   lists differ), alternated with today's in every round — the way to show what a change to
#   the scripts does to Redis's cost. E.g. for commit C:
#     mkdir /tmp/old && git archive C lua | tar -x -C /tmp/old &&
#     git show C:src/limit/store/redis/sources.rs > /tmp/old/lua/sources.rs &&
#     BEFORE_LUA=/tmp/old/lua benches/load/redis_core.sh
#
#   ROWS=<regex>: only the rows whose label matches (e.g. ROWS='^(b|b0|k|k0)\.').
#
#   NATIVE=1: also the native probe's rows (benches/native_probe, a Redis module command: NOT
#   the product, what a decision would cost outside Lua) beside batch.lua's of the same plans.
#
#   MODULE=1 NATIVE=1: also the floor under the module's batched rows (N…: the probe's
#   TSPROBE.FLOOR on the same calls — per key a lookup, its algorithm's stored form written,
#   its expiry, their replication; no decision).
#
#   MODULE=1: also the same plans decided by turnstile's Redis module (module/, built here
#   with `cargo build --release -p turnstile-module`): TURNSTILE.DECIDE, .BATCH and .USAGE
#   rows (labels starting with M) beside the Lua rows of the same plans, in the same rounds
#   (MODULE_SO=<library>: that build instead).
#
# Rows alternate within each round, in the opposite order every other round (a row run just
# after another was seen to read faster: the same script 4-13 % apart as b and b0); the
# medians are printed as a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/load/lib.sh

ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-200000}
work=$(mktemp -d)
rport=$(port)
trap 'redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

module=()
if [[ -n ${NATIVE:-} ]]; then module=(--loadmodule "$(benches/load/native_probe.sh)"); fi
if [[ -n ${MODULE:-} ]]; then
  # MODULE_SO: a library built elsewhere (another commit's, to compare).
  if [[ -z ${MODULE_SO:-} ]]; then
    cargo build --quiet --release --locked -p turnstile-module >&2
    MODULE_SO="$PWD/${CARGO_TARGET_DIR:-target}/release/libturnstile_module.so"
  fi
  module+=(--loadmodule "$MODULE_SO")
fi
taskset -c 0 redis-server --port "$rport" --save "" --appendonly no --logfile "$work/redis.log" \
  --daemonize yes --pidfile "$work/redis.pid" ${module[@]+"${module[@]}"}
wait_port "$rport"
rpid=$(cat "$work/redis.pid")
cli() { redis-cli -p "$rport" "$@"; }

check=$(cli SCRIPT LOAD "$(source_of CHECK_FILES)")
# batch.lua's first line names its flags (sources.rs: BATCH_HEADER).
batch=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES)")
lease=$(cli SCRIPT LOAD "$(source_of LEASE_FILES)")
usage=$(cli SCRIPT LOAD "$(source_of USAGE_FILES)")
time_only=$(cli SCRIPT LOAD "return redis.call('TIME')[1]")
# The least any exact decision on Redis's clock asks of Redis, with no decision in it: the
# clock, one read and one write with a TTL per key (state packed in one string). The ratios
# issue 33 sets are measured against these.
floor1=$(cli SCRIPT LOAD "local t = redis.call('TIME'); redis.call('GET', KEYS[1]); redis.call('SET', KEYS[1], t[1], 'PX', '61000'); return '1'")
floor2=$(cli SCRIPT LOAD "local t = redis.call('TIME'); for i = 1, 2 do redis.call('GET', KEYS[i]); redis.call('SET', KEYS[i], t[1], 'PX', '61000') end; return '1'")

# Limits no request reaches: every call admits and writes, the costly path.
BIG=1000000000
# Keys name their row (ROW), so rows of other algorithms never meet.
k() { echo "t:{c__rand_int__}:ROW:$1"; }
declare -A rows=(
  ["a. TIME only (calibration)"]="EVALSHA $time_only 0"
  ["a2. floor, 1 key: TIME + GET + SET PX, no decision"]="EVALSHA $floor1 1 $(k a)"
  ["a3. floor, 2 keys: TIME + 2 × (GET + SET PX), no decision"]="EVALSHA $floor2 2 $(k a) t:{c__rand_int__}:ROW:k:b"
  ["b. 1 limit: token bucket"]="EVALSHA $check 1 $(k a) @ 1 @ a tb $BIG 1000 $BIG 0"
  ["c. 1 limit: fixed window"]="EVALSHA $check 1 $(k a) @ 1 @ a fw $BIG 60000 0 0"
  ["d. 1 limit: sliding window"]="EVALSHA $check 1 $(k a) @ 1 @ a sw $BIG 60000 0 0"
  ["e. 1 limit: sliding log"]="EVALSHA $check 1 $(k a) @ 1 @ a sl 1000 60000 0 0"
  ["f. 1 limit: leaky bucket"]="EVALSHA $check 1 $(k a) @ 1 @ a lb $BIG 1000 $BIG:$BIG 0"
  ["g. 4 limits (tb, sw, sw, fw)"]="EVALSHA $check 4 $(k a) $(k b) $(k c) $(k d) @ 1 @ a tb $BIG 1000 $BIG 0 b sw $BIG 60000 0 0 c sw $BIG 3600000 0 0 d fw $BIG 86400000 0 0"
  ["h. plan + keyed (sw + sw)"]="EVALSHA $check 2 $(k a) t:{c__rand_int__}:ROW:k:b @ 1 @ a sw $BIG 60000 0 0 b sw $BIG 900000 0 0"
  ["i. leased: one lease.lua call per 100 decisions (fw)"]="EVALSHA $lease 1 $(k a) @ 100 100 a fw $BIG 60000 0 0"
)
# A quota question (GET /quota: usage.lua, reads only) about one client whose limits hold
# state: the row's decision for that client is made once first (prefill), then every call
# reads the same keys. Compare with the decision rows of the same limits (b, g).
q1="t:{q1}:ROW:a"; q4="$q1 t:{q1}:ROW:b t:{q1}:ROW:c t:{q1}:ROW:d"
a1="@ 1 @ a tb $BIG 1000 $BIG 0"
a4="$a1 b sw $BIG 60000 0 0 c sw $BIG 3600000 0 0 d fw $BIG 86400000 0 0"
declare -A prefill
rows["n. quota question, 1 limit (tb): usage.lua"]="EVALSHA $usage 1 $q1 $a1"
prefill["n. quota question, 1 limit (tb): usage.lua"]="EVALSHA $check 1 $q1 $a1"
rows["o. quota question, 4 limits (tb, sw, sw, fw): usage.lua"]="EVALSHA $usage 4 $q4 $a4"
prefill["o. quota question, 4 limits (tb, sw, sw, fw): usage.lua"]="EVALSHA $check 4 $q4 $a4"
# Batched (batch.lua): B members per call, each a different client, as a loaded gateway sends
# them (src/limit/store/redis/batch.rs). Decisions per row = calls × B. A charge member opens
# with its kind, c; a decision names none ("-").
declare -A per_call
batch_row() { # label B keys-per-member kind member-arguments...
  local label=$1 b=$2 n=$3 kind=$4 keys="" args="" j
  shift 4
  if [[ $kind == - ]]; then kind=""; else kind+=" "; fi
  for j in $(seq "$b"); do
    for i in $(seq "$n"); do keys+=" t:{c__rand_int__}:ROW:$j:$i"; done
    args+=" $kind$n $# $*"
  done
  rows[$label]="${BATCH_CMD:-EVALSHA ${BATCH_SHA:-$batch}} $((b * n))$keys $b$args"
  per_call[$label]=$b
}
# The floor of any batched decision in Lua: per key one read and one write with a TTL.
floor_batch=$(cli SCRIPT LOAD "#!lua flags=allow-cross-slot-keys
local t = redis.call('TIME'); for i = 1, #KEYS do redis.call('GET', KEYS[i]); redis.call('SET', KEYS[i], t[1], 'PX', '61000') end; return '1'")
fk=""; for j in $(seq 64); do fk+=" t:{c__rand_int__}:ROW:$j"; done
rows["a4. floor in batches of 64: TIME + 64 × (GET + SET PX), no decision"]="EVALSHA $floor_batch 64$fk"
per_call["a4. floor in batches of 64: TIME + 64 × (GET + SET PX), no decision"]=64
batch_row "j. 1 limit: token bucket, batches of 16" 16 1 - @ 1 @ a tb $BIG 1000 $BIG 0
batch_row "k. 1 limit: token bucket, batches of 64" 64 1 - @ 1 @ a tb $BIG 1000 $BIG 0
batch_row "l. 4 limits (tb, sw, sw, fw), batches of 16" 16 4 - @ 1 @ a tb $BIG 1000 $BIG 0 b sw $BIG 60000 0 0 c sw $BIG 3600000 0 0 d fw $BIG 86400000 0 0
batch_row "m. plan + keyed (sw + sw), batches of 32" 32 2 - @ 1 @ a sw $BIG 60000 0 0 b sw $BIG 900000 0 0
# A response's cost charged (charge.lua: one more unit on a fixed window; the time admitted
# is not read for a charge of more), one call each and in batches (as charges arriving with
# decisions ride in theirs). Each charge names its marker last (applied once: lib.lua's
# applied_before), a key of its own. Charges per row = calls × B.
charge=$(cli SCRIPT LOAD "$(source_of CHARGE_FILES)")
rows["p. charge, 1 limit (fw) and its marker: charge.lua"]="EVALSHA $charge 2 $(k a) $(k once) @ 0 fw $BIG 60000 1"
batch_row "q. charges, 1 limit (fw) and its marker, batches of 64" 64 2 c @ 0 fw $BIG 60000 1
if [[ -n ${NATIVE:-} ]]; then
  # The same decisions as k and t, by the probe: per member n, then key limit window burst.
  native_row() { # label B limits [command]
    local member="" j i
    for j in $(seq "$2"); do
      member+=" $3"
      for i in $(seq "$3"); do member+=" t:{c__rand_int__}:ROW:$j:$i $BIG 1000 $BIG"; done
    done
    rows[$1]="${4:-TSPROBE.BATCH} $2$member"
    per_call[$1]=$2
  }
  batch_row "t. 4 limits (4 × tb), batches of 16" 16 4 - @ 1 @ a tb $BIG 1000 $BIG 0 b tb $BIG 1000 $BIG 0 c tb $BIG 1000 $BIG 0 d tb $BIG 1000 $BIG 0
  native_row "u. native probe: 1 limit: token bucket, batches of 64" 64 1
  native_row "v. native probe: 4 limits (4 × tb), batches of 16" 16 4
  native_row "w. native probe, Lua's text form: 1 limit: token bucket, batches of 64" 64 1 TSPROBE.BATCHTEXT
fi
if [[ -n ${MODULE:-} ]]; then
  # The rows b, g, h, k, l, m, n and o, decided by the module (the same arguments).
  for row in b g h n o; do
    for label in "${!rows[@]}"; do
      [[ $label == "$row. "* ]] || continue
      command=${rows[$label]#EVALSHA * }
      case $row in n|o) verb=TURNSTILE.USAGE ;; *) verb=TURNSTILE.DECIDE ;; esac
      name="M$row. module: ${label#*. }"
      name=${name/: usage.lua/: TURNSTILE.USAGE}
      rows[$name]="$verb $command"
      if [[ -n ${prefill[$label]:-} ]]; then prefill[$name]=${prefill[$label]}; fi
    done
  done
  BATCH_CMD=TURNSTILE.BATCH batch_row "Mk. module: 1 limit: token bucket, batches of 64" 64 1 - @ 1 @ a tb $BIG 1000 $BIG 0
  BATCH_CMD=TURNSTILE.BATCH batch_row "Ml. module: 4 limits (tb, sw, sw, fw), batches of 16" 16 4 - @ 1 @ a tb $BIG 1000 $BIG 0 b sw $BIG 60000 0 0 c sw $BIG 3600000 0 0 d fw $BIG 86400000 0 0
  BATCH_CMD=TURNSTILE.BATCH batch_row "Mm. module: plan + keyed (sw + sw), batches of 32" 32 2 - @ 1 @ a sw $BIG 60000 0 0 b sw $BIG 900000 0 0
fi
if [[ -n ${MODULE:-} && -n ${NATIVE:-} ]]; then
  # The floor under the module's batched rows: the probe's TSPROBE.FLOOR takes the same call
  # and does per key only the lookup, the write of its algorithm's stored form (a bucket's
  # text in place, a window's HASH), its expiry and their replication (no decision) — what
  # any native decision keeping Lua's stored form costs.
  for row in k l m; do
    label=$(printf '%s\n' "${!rows[@]}" | grep "^M$row\. ")
    name="N$row. floor under M$row: ${label#*: }"
    rows[$name]="TSPROBE.FLOOR ${rows[$label]#TURNSTILE.BATCH }"
    per_call[$name]=${per_call[$label]}
  done
fi
if [[ -n ${BEFORE_LUA:-} ]]; then
  old_check=$(cli SCRIPT LOAD "$(source_of CHECK_FILES "$BEFORE_LUA")")
  rows["b0. before: 1 limit: token bucket"]="EVALSHA $old_check 1 $(k a) @ 1 @ a tb $BIG 1000 $BIG 0"
  BATCH_SHA=$(cli SCRIPT LOAD "$(printf '#!lua flags=allow-cross-slot-keys\n'; source_of BATCH_FILES "$BEFORE_LUA")") \
    batch_row "k0. before: 1 limit: token bucket, batches of 64" 64 1 - @ 1 @ a tb $BIG 1000 $BIG 0
fi

# A row's command as the array ARGS: ROW becomes the row's letter (its keys meet no other
# row's), "@" an empty argument (the server's clock; no slot id).
row_args() { # label command
  local i
  read -r -a ARGS <<<"${2//ROW/${1%%.*}}"
  for i in "${!ARGS[@]}"; do
    if [[ ${ARGS[$i]} == @ ]]; then ARGS[$i]=""; fi
  done
}

if [[ -n ${ROWS:-} ]]; then
  for label in "${!rows[@]}"; do
    if ! [[ $label =~ $ROWS ]]; then unset -v 'rows[$label]'; fi
  done
fi
declare -A usec per_core
for label in "${!rows[@]}"; do usec[$label]=""; per_core[$label]=""; done
for round in $(seq "$ROUNDS"); do
  order=sort
  if (( round % 2 == 0 )); then order="sort -r"; fi
  for label in $(printf '%s\n' "${!rows[@]}" | $order | tr ' ' '\001'); do
    label=${label//$'\001'/ }
    row_args "$label" "${rows[$label]}"
    args=("${ARGS[@]}")
    cli FLUSHALL >/dev/null
    if [[ -n ${prefill[$label]:-} ]]; then
      row_args "$label" "${prefill[$label]}"
      cli "${ARGS[@]}" >/dev/null
    fi
    cli CONFIG RESETSTAT >/dev/null
    before=$(cpu_ticks "$rpid")
    calls=$((CALLS / ${per_call[$label]:-1}))
    taskset -c 1 redis-benchmark -p "$rport" -n "$calls" -c 32 -P 8 -r 1000000 -q "${args[@]}" \
      >/dev/null 2>&1
    ticks=$(($(cpu_ticks "$rpid") - before))
    sent=$calls
    command=${args[0],,}
    stat=$(cli INFO commandstats | grep "^cmdstat_$command:")
    calls=$(sed 's/^cmdstat_[a-z.]*:calls=\([0-9]*\),.*/\1/' <<<"$stat")
    failed=$(sed 's/.*failed_calls=\([0-9]*\).*/\1/' <<<"$stat")
    # redis-benchmark may send up to a pipeline more than asked.
    (( calls >= sent && failed == 0 )) || { echo "$label: $stat" >&2; exit 1; }
    per_call=$(sed 's/.*usec_per_call=\([0-9.]*\),.*/\1/' <<<"$stat")
    decisions=$((calls * ${per_call[$label]:-1}))
    [[ $label == i.* ]] && decisions=$((CALLS * 100))
    hz=$(getconf CLK_TCK)
    usec[$label]+=" $per_call"
    per_core[$label]+=" $(awk -v d="$decisions" -v t="$ticks" -v hz="$hz" 'BEGIN {printf "%d", d * hz / t}')"
  done
done

echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) CPUs, $ROUNDS rounds × $CALLS calls, $(date -u +%F)"
echo
echo "| plan | Redis µs per call (usec_per_call) | decisions per Redis core-second |"
echo "| --- | --- | --- |"
for label in $(printf '%s\n' "${!rows[@]}" | sort | tr ' ' '\001'); do
  label=${label//$'\001'/ }
  echo "| ${label#*. } | $(median <<<"${usec[$label]}") | $(median <<<"${per_core[$label]}") |"
done
