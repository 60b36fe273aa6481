#!/usr/bin/env bash
# The request path's cost, counted (`make bench-count`): instructions the gateway process
# executes per request under callgrind — deterministic where wall-clock rounds on a shared
# VM are not — in three modes on one gateway (1 worker thread and h2load --h1 -c1 unless
# THREADS and CONNS say otherwise, $N requests per mode after 300 to warm up, each mode
# dumped apart):
#   pass     a route with nothing configured
#   redis1   an API key and one plan limit on Redis (far above the load: all admitted)
#   four     an API key and four plan limits on Redis (as bench-modes' redis4)
#   keyed    an API key, one plan limit plus one header-keyed limit
# Before them, in the same run: bare pingora-proxy (benches/floor.rs `proxy`: only
# upstream_peer) and the same adding the forwarding headers the gateway's pass-through adds,
# through Pingora's header API (`forwarding`) — the floor the pass column is read against —
# and `forwarding` with one EVALSHA per request through the redis crate's ConnectionManager
# (`redis`): the floor under the limited modes' extra cost (FLOOR=0: skip them).
# BEFORE=/path/to/an/older/turnstile: that binary too, the two alternated over $ROUNDS rounds
# (the way to show a change to the request path costs nothing). THREADS=2 CONNS=4: two
# worker threads and four connections — instructions the second thread adds (callgrind runs
# one thread at a time, so this counts work, not contention). The kernel's share of each
# request is not in these counts.
# ALONE=1: also the same binary with store.batch_max = 1 (every decision its own script
# call), alternated — with CONNS above 1 (requests arriving while a call is in flight), what
# batching changes in the gateway's instructions per request; the table then gives each
# gateway's mean batch in redis1 (turnstile_store_batched_decisions_total / _batches_total).
set -euo pipefail
shopt -s inherit_errexit  # a mode that fails inside $(...) fails the run
cd "$(dirname "$0")/../.."
N=${N:-2000}; ROUNDS=${ROUNDS:-2}; THREADS=${THREADS:-1}; CONNS=${CONNS:-1}
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh
bench_start count nginx h2load curl python3 redis-server valgrind callgrind_control

ORIGIN=$(port); REDIS=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
wait_port "$ORIGIN"; wait_port "$REDIS"
KEY="X-Api-Key: bench-api-key-0123456789"
KEY4="X-Api-Key: bench-four-key-0123456789"
MODES="pass redis1 four keyed"
# key MODE: the API key header MODE's requests carry (the four-limit plan's client on four).
key() { if [ "$1" = four ]; then echo "$KEY4"; else echo "$KEY"; fi; }
# metric ADMIN NAME: the gateway's turnstile_store_NAME_total (0 when absent).
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="turnstile_store_$2_total" '$1 == m {print $2; f=1} END {if (!f) print 0}'; }

# count NAME BINARY [STORE-LINE]: one gateway under callgrind (STORE-LINE added to [store]);
# prints "NAME pass redis1 four keyed batch" (instructions per request; redis1's mean batch).
count() {
  local name=$1 bin=$2 store=${3:-} p admin dir vg mode path batch="" before_d=0 before_b=0
  p=$(port); admin=$(port); dir="$WORK/$name.$RANDOM"; mkdir -p "$dir"
  { redis_conf "$dir" "$p" "$REDIS" "$ORIGIN" "$store"; cat <<TOML
[plans.p4]
limits = [
  { name = "a", algorithm = "sliding_window", limit = 10000000, window = "1m" },
  { name = "b", algorithm = "sliding_window", limit = 10000000, window = "1h" },
  { name = "c", algorithm = "sliding_window", limit = 10000000, window = "1d" },
  { name = "d", algorithm = "sliding_window", limit = 10000000, window = "10m" },
]
[[clients]]
id = "bench4"
plan = "p4"
api_keys = ["bench-four-key-0123456789"]
[admin]
listen = "127.0.0.1:$admin"
[[routes]]
name = "pass"
path_prefix = "/pass"
upstream = "o"
[[routes]]
name = "four"
path_prefix = "/four"
upstream = "o"
auth = "api_key"
[[routes]]
name = "keyed"
path_prefix = "/keyed"
upstream = "o"
auth = "api_key"
[[routes.limits]]
name = "per-tenant"
key = ["header:x-tenant"]
algorithm = "token_bucket"
limit = 1000000
window = "1s"
TOML
  } > "$dir/gw.toml"
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "$bin" --config "$dir/gw.toml" > "$dir/gw.log" 2>&1 &
  vg=$!; pids+=("$vg")
  wait_started "$name" "$vg" "$p" "$dir/gw.log"
  for mode in $MODES; do
    h2load --h1 -c"$CONNS" -n300 -H "$(key "$mode")" -H "X-Tenant: t1" "http://127.0.0.1:$p/$mode" > /dev/null
  done
  printf '%s' "$name"
  for mode in $MODES; do
    if [ "$mode" = redis1 ]; then
      before_d=$(metric "$admin" batched_decisions); before_b=$(metric "$admin" batches)
    fi
    callgrind_control -z "$vg" > /dev/null 2>&1
    h2load --h1 -c"$CONNS" -n"$N" -H "$(key "$mode")" -H "X-Tenant: t1" "http://127.0.0.1:$p/$mode" | grep -q "$N 2xx" \
      || { echo "$name $mode: not all 2xx; the gateway said:" >&2; tail -20 "$dir/gw.log" >&2; exit 1; }
    callgrind_control -d "$mode" "$vg" > /dev/null 2>&1
    path=$(ls -t "$dir"/cg.out.* | head -1)
    printf ' %s' $(( $(awk '/^totals:/ {print $2}' "$path") / N ))
    [ "$mode" != redis1 ] || batch=$(awk -v d=$(($(metric "$admin" batched_decisions) - before_d)) \
      -v b=$(($(metric "$admin" batches) - before_b)) 'BEGIN {if (b > 0) printf "%.1f", d / b; else print "—"}')
  done
  echo " $batch"

  kill "$vg"; wait "$vg" 2>/dev/null || true
}

# floor MODE [REDIS-URL]: benches/floor.rs's MODE under callgrind, $N requests after 300;
# prints its instructions per request.
floor() {
  local mode=$1 p vg path
  p=$(port)
  valgrind --tool=callgrind --callgrind-out-file="$WORK/floor-$mode.out" "$FLOOR_BIN" "$mode" "127.0.0.1:$p" "127.0.0.1:$ORIGIN" "$THREADS" "${@:2}" > "$WORK/floor-$mode.log" 2>&1 &
  vg=$!; pids+=("$vg")
  wait_started "floor $mode" "$vg" "$p" "$WORK/floor-$mode.log"
  h2load --h1 -c"$CONNS" -n300 "http://127.0.0.1:$p/pass" > /dev/null
  callgrind_control -z "$vg" > /dev/null 2>&1
  h2load --h1 -c"$CONNS" -n"$N" "http://127.0.0.1:$p/pass" | grep -q "$N 2xx" \
    || { echo "floor $mode: not all 2xx" >&2; exit 1; }
  callgrind_control -d "$mode" "$vg" > /dev/null 2>&1
  path=$(ls -t "$WORK"/floor-"$mode".out.* | head -1)
  echo $(( $(awk '/^totals:/ {print $2}' "$path") / N ))
  kill "$vg"; wait "$vg" 2>/dev/null || true
}

if [ "${FLOOR:-1}" != 0 ]; then
  FLOOR_BIN=$(floor_binary)
  BARE=$(floor proxy); FORWARDING=$(floor forwarding); FLOOR_REDIS=$(floor redis "redis://127.0.0.1:$REDIS")
fi

echo "valgrind --tool=callgrind, $THREADS worker thread(s), h2load --h1 -c$CONNS, $N requests per mode after 300 to warm up;"
echo "instructions of the whole gateway process per request"
echo
echo "| binary | pass | redis1 | four | keyed | redis1's mean batch |"
echo "| --- | --- | --- | --- | --- | --- |"
row() { awk '{printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6}'; }
if [ -n "${BARE:-}" ]; then
  echo "| bare pingora-proxy | $BARE | | | | |"
  echo "| pingora-proxy + forwarding headers | $FORWARDING | | | | |"
  echo "| the same + one EVALSHA through redis-rs | | $FLOOR_REDIS | | | |"
fi
rows=$(for _ in $(seq "$ROUNDS"); do
  [ -z "${BEFORE:-}" ] || count before "$BEFORE" | row
  count turnstile "$BIN" | row
  [ -z "${ALONE:-}" ] || count batch_max=1 "$BIN" "batch_max = 1" | row
done)
echo "$rows"
# The ratios the request path is held to: pass / bare, pass / bare + forwarding, and each
# limited mode / pass (the gateway's rows, mean over the rounds).
echo "$rows" | awk -F'|' -v bare="${BARE:-0}" -v fwd="${FORWARDING:-0}" -v fred="${FLOOR_REDIS:-0}" '
  { name = $2; gsub(/ /, "", name); if (name == "before" || name == "batch_max=1") next
    p += $3; r += $4; f += $5; k += $6; n++ }
  END { if (!n) exit; p /= n; r /= n; f /= n; k /= n
    print ""
    if (bare > 0) printf "pass / bare pingora-proxy: %.2fx; pass / pingora-proxy + forwarding headers: %.2fx\n", p / bare, p / fwd
    printf "redis1 / pass: %.2fx; four / pass: %.2fx; keyed / pass: %.2fx\n", r / p, f / p, k / p
    if (fred > 0) printf "the floor: one redis-rs call adds %d instructions to the forwarding proxy (%.2fx); redis1 adds %d to pass\n", fred - fwd, fred / fwd, r - p }'
