#!/usr/bin/env bash
# Batching on a Redis Cluster (`make bench-cluster-batching`): one gateway ($THREADS worker
# threads) on a private 3-master Cluster, $CLIENTS clients (API keys, each its own hash tag, so
# its own slot: a batch holds many slots of one node) picked at random per request by wrk
# (-t1 -c$CONNS, $DURATION s) to an nginx origin; the same gateway configuration with
# store.batch_max = 64 (the default) and = 1 (every decision its own call), alternated over
# $ROUNDS rounds in opposite orders. Per target: median req/s, the gateway's CPU µs per
# request, the three masters' CPU µs per request, and the share of its decisions decided in
# batches Redis ran ((batched - sent again alone) / decisions, over the whole run).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/load/lib.sh
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-64}
THREADS=${THREADS:-1}
CLIENTS=${CLIENTS:-200}
bench_start cluster-batching wrk nginx redis-server redis-cli

ORIGIN=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
NODES=() RPIDS=()
for i in 1 2 3; do
  # A node's cluster bus listens at its port + 10000.
  p=$(port); while (( p > 55000 )); do p=$(port); done
  mkdir -p "$WORK/r$i"
  (cd "$WORK/r$i" && exec redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file nodes.conf --save "" --appendonly no > log 2>&1) & pids+=($!)
  RPIDS+=($!)
  NODES+=("127.0.0.1:$p")
done
wait_port "$ORIGIN"
for n in "${NODES[@]}"; do wait_port "${n##*:}"; done
redis-cli --cluster create "${NODES[@]}" --cluster-yes > "$WORK/create.log"
for _ in $(seq 100); do
  [ "$(redis-cli -p "${NODES[0]##*:}" cluster info | tr -d '\r' | awk -F: '/cluster_state/ {print $2}')" = ok ] && break
  sleep 0.1
done

declare -A PORTS PIDS ADMINS
start() { # name store-extra
  local p a nodes
  p=$(port); a=$(port)
  nodes=$(printf '"redis://%s", ' "${NODES[@]}")
  {
    cat <<TOML
[server]
listen = "127.0.0.1:$p"
threads = $THREADS
pid_file = "$WORK/$1.pid"
upgrade_sock = "$WORK/$1.sock"
key_hash_secret = "bench-key-hash-secret-0123456789"
[admin]
listen = "127.0.0.1:$a"
[store]
kind = "redis_cluster"
nodes = [${nodes%, }]
timeout = "2s"
$2
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[plans.p]
limits = [{ name = "l", algorithm = "sliding_window", limit = 100000000, window = "1h" }]
[[routes]]
name = "r"
path_prefix = "/"
upstream = "o"
auth = "api_key"
TOML
    for c in $(seq "$CLIENTS"); do
      printf '[[clients]]\nid = "c%s"\nplan = "p"\napi_keys = ["bench-cluster-key-%06d"]\n' "$c" "$c"
    done
  } > "$WORK/$1.toml"
  RUST_LOG=warn "$BIN" --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  PIDS[$1]=$!
  (wait_port "$p") || { cat "$WORK/$1.log" >&2; exit 1; }
  PORTS[$1]=$p ADMINS[$1]=$a
}
start batched ""
start alone "batch_max = 1"
cat > "$WORK/keys.lua" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", { ["X-Api-Key"] = string.format("bench-cluster-key-%06d", math.random(1, $CLIENTS)) })
end
LUA
for t in batched alone; do
  wrk -t1 -c"$CONNS" -d2s -s "$WORK/keys.lua" "http://127.0.0.1:${PORTS[$t]}/" > /dev/null
done
counter() { curl -s "http://127.0.0.1:${ADMINS[$1]}/metrics" | awk -v m="$2" '$1 == m {print $2; f=1} END {if (!f) print 0}'; }
decisions() { curl -s "http://127.0.0.1:${ADMINS[$1]}/metrics" | awk '/^turnstile_limiter_decisions_total/ {s += $2} END {print s + 0}'; }
declare -A RPS CPU RCPU B0 A0 D0
for t in batched alone; do
  B0[$t]=$(counter "$t" turnstile_store_batched_decisions_total)
  A0[$t]=$(counter "$t" turnstile_store_batch_fallbacks_total)
  D0[$t]=$(decisions "$t")
done
for round in $(seq "$ROUNDS"); do
  order="batched alone"; (( round % 2 == 0 )) && order="alone batched"
  for t in $order; do
    before=$(cpu_ticks "${PIDS[$t]}"); rbefore=$(cpu_ticks "${RPIDS[*]}")
    out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/keys.lua" "http://127.0.0.1:${PORTS[$t]}/")
    after=$(cpu_ticks "${PIDS[$t]}"); rafter=$(cpu_ticks "${RPIDS[*]}")
    ! echo "$out" | grep -q Non-2xx || { echo "$t: answers that were not 2xx" >&2; exit 1; }
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    total=$(echo "$out" | awk '/requests in/ {print $1}')
    us=$(awk -v t=$((after - before)) -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    rus=$(awk -v t=$((rafter - rbefore)) -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    RPS[$t]="${RPS[$t]:-} $rps"; CPU[$t]="${CPU[$t]:-} $us"; RCPU[$t]="${RCPU[$t]:-} $rus"
    echo "round $round $t: $rps req/s, gateway $us µs/request, Redis $rus µs/request" >&2
  done
done
echo "3-master Cluster, $CLIENTS clients at random, $THREADS worker thread(s), wrk -t1 -c$CONNS, $ROUNDS rounds x ${DURATION}s"
echo
echo "| target | req/s (median) | rounds | gateway CPU µs / request | Redis CPU µs / request (3 masters) | decided in batches |"
echo "| --- | --- | --- | --- | --- | --- |"
for t in batched alone; do
  share=$(awk -v b="$(counter "$t" turnstile_store_batched_decisions_total)" -v a="$(counter "$t" turnstile_store_batch_fallbacks_total)" \
    -v d="$(decisions "$t")" -v b0="${B0[$t]}" -v a0="${A0[$t]}" -v d0="${D0[$t]}" \
    'BEGIN {n = d - d0; if (n > 0) printf "%.1f %%", 100 * ((b - b0) - (a - a0)) / n; else print "—"}')
  echo "| $t | $(echo "${RPS[$t]}" | median) | ${RPS[$t]} | $(echo "${CPU[$t]}" | median) | $(echo "${RCPU[$t]}" | median) | $share |"
done
