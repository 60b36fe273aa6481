#!/usr/bin/env bash
# System calls the gateway makes per limited request, batched and not: the same binary twice
# (one plan limit on Redis; then store.batch_max = 1, every decision its own script call),
# 1 worker thread, h2load --h1 -c$CONNS, strace -c attached to every thread for $N requests
# after 2 000 to warm up. Prints each call made more than once per 100 requests, per request.
# What bench-count's instructions leave out: the kernel's side of a request (socket reads and
# writes to the client, the upstream and Redis).
#   benches/load/syscalls.sh      N=20000 CONNS=16; BIN=<a turnstile binary> to skip the build
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-20000}; CONNS=${CONNS:-16}
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh
bench_start syscalls nginx h2load strace redis-server

ORIGIN=$(port); REDIS=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
wait_port "$ORIGIN"; wait_port "$REDIS"
KEY="X-Api-Key: bench-api-key-0123456789"

# calls NAME STORE-LINE: one gateway (STORE-LINE added to [store]); prints its calls per request.
calls() {
  local p dir gw st
  p=$(port); dir="$WORK/$1"; mkdir -p "$dir"
  redis_conf "$dir" "$p" "$REDIS" "$ORIGIN" "$2" > "$dir/gw.toml"
  RUST_LOG=warn "$BIN" --config "$dir/gw.toml" > "$dir/gw.log" 2>&1 & gw=$!; pids+=("$gw")
  wait_port "$p"
  h2load --h1 -c"$CONNS" -n2000 -H "$KEY" "http://127.0.0.1:$p/redis1" > /dev/null
  # shellcheck disable=SC2046 # one -p per thread
  strace -c -f -o "$dir/strace" $(ls "/proc/$gw/task" | sed 's/^/-p /') 2>/dev/null & st=$!
  sleep 1
  h2load --h1 -c"$CONNS" -n"$N" -H "$KEY" "http://127.0.0.1:$p/redis1" | grep -q "$N 2xx" \
    || { echo "$1: not all 2xx; the gateway said:" >&2; tail -20 "$dir/gw.log" >&2; exit 1; }
  kill -INT "$st"; wait "$st" 2>/dev/null || true
  kill "$gw"
  # strace -c's table: % time, seconds, usecs/call, calls, [errors,] syscall.
  awk -v name="$1" -v n="$N" '$NF == "total" {printf "| %s | **all** | %.2f |\n", name, $4 / n; next}
    $1 ~ /^[0-9.]+$/ && NF >= 5 && $4 > n / 100 {printf "| %s | %s | %.2f |\n", name, $NF, $4 / n}' "$dir/strace"
}

echo "strace -c, 1 worker thread, h2load --h1 -c$CONNS, $N requests to one Redis-limited route"
echo
echo "| gateway | system call | per request |"
echo "| --- | --- | --- |"
calls batched ""
calls batch_max=1 "batch_max = 1"
