#!/usr/bin/env bash
# What retries, outlier ejection and least-request balancing cost a request that succeeds
# (`make bench-resilience`): one gateway (1 worker thread) in front of two nginx origins,
# three routes over the same two servers:
#   plain       a round-robin pool, no retries
#   resilient   a pool with outlier_detection and a retry_budget; the route retries
#               timeouts, resets and 502/503/504 (attempts 3, per_try_timeout 5s)
#   least       a least_request pool with outlier_detection, the same retries
# Load: wrk -t1 -c$CONNS for $DURATION s per route, routes alternated over $ROUNDS rounds;
# the gateway pinned to one CPU, nginx and wrk to the others.
# Reported, medians: requests/s and the gateway's CPU (user + system) per request, and each
# route's ratio to plain.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
CONNS=${CONNS:-50}
for tool in nginx wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt install nginx wrk curl)" >&2; exit 1; }
done
cargo build --release --bins --quiet
WORK=$(mktemp -d /tmp/turnstile-resilience.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

O1=$(port); O2=$(port)
cat > "$WORK/origin.conf" <<NGX
worker_processes 1; daemon off; pid $WORK/origin.pid; error_log $WORK/origin.err;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$O1; listen 127.0.0.1:$O2; keepalive_requests 1000000;
    location / { return 200 "ok\n"; } } }
NGX
# Pinned (on a machine with 2 CPUs or more): the gateway on the last CPU, the origin and
# the load generator on the others, so the routes' numbers do not move with the scheduler.
LAST=$(($(nproc) - 1))
pin_gw=(); pin_load=()
if [ "$LAST" -ge 1 ]; then pin_gw=(taskset -c "$LAST"); pin_load=(taskset -c "0-$((LAST - 1))"); fi
"${pin_load[@]}" nginx -c "$WORK/origin.conf" & pids+=($!)
wait_port "$O1"; wait_port "$O2"

P=$(port); A=$(port)
cat > "$WORK/gw.toml" <<TOML
[server]
listen = "127.0.0.1:$P"
threads = 1
pid_file = "$WORK/gw.pid"
upgrade_sock = "$WORK/gw.sock"
[admin]
listen = "127.0.0.1:$A"
[upstreams.plain]
servers = ["127.0.0.1:$O1", "127.0.0.1:$O2"]
[upstreams.resilient]
servers = ["127.0.0.1:$O1", "127.0.0.1:$O2"]
retry_budget = { percent = 20, min_retries = 3 }
[upstreams.resilient.outlier_detection]
consecutive_failures = 5
[upstreams.least]
servers = ["127.0.0.1:$O1", "127.0.0.1:$O2"]
balance = "least_request"
[upstreams.least.outlier_detection]
consecutive_failures = 5
[[routes]]
name = "plain"
path_prefix = "/plain"
upstream = "plain"
ip_limit = "off"
[[routes]]
name = "resilient"
path_prefix = "/resilient"
upstream = "resilient"
ip_limit = "off"
retry = { attempts = 3, on = ["timeout", "reset", "gateway"], per_try_timeout = "5s" }
[[routes]]
name = "least"
path_prefix = "/least"
upstream = "least"
ip_limit = "off"
retry = { attempts = 3, on = ["timeout", "reset", "gateway"], per_try_timeout = "5s" }
TOML
RUST_LOG=warn "${pin_gw[@]}" target/release/turnstile --config "$WORK/gw.toml" > "$WORK/gw.log" 2>&1 & pids+=($!)
GW=$!
(wait_port "$P") || { cat "$WORK/gw.log" >&2; exit 1; }
targets=(plain resilient least)
for t in "${targets[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/$t")
  [ "$code" = 200 ] || { echo "$t answers $code" >&2; cat "$WORK/gw.log" >&2; exit 1; }
done

HZ=$(getconf CLK_TCK)
declare -A CPU RPS
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    before=$(cpu_ticks "$GW")
    out=$("${pin_load[@]}" wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$P/$t")
    after=$(cpu_ticks "$GW")
    done_=$(echo "$out" | awk '/requests in/ {print $1}')
    if echo "$out" | grep -q "Non-2xx"; then echo "$t: non-2xx answers" >&2; echo "$out" >&2; exit 1; fi
    rps=$(awk -v n="$done_" -v d="$DURATION" 'BEGIN {printf "%.0f", n / d}')
    us=$(awk -v t=$((after - before)) -v n="$done_" -v hz="$HZ" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
    CPU[$t]="${CPU[$t]:-} $us"; RPS[$t]="${RPS[$t]:-} $rps"
    echo "round $round $t: $rps req/s, $us µs gateway CPU/request" >&2
  done
done
base_cpu=$(echo "${CPU[plain]}" | median)
base_rps=$(echo "${RPS[plain]}" | median)
echo "| route | req/s | gateway CPU µs / request | CPU ratio to plain | req/s ratio to plain | rounds (µs) |"
echo "| --- | --- | --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  cpu=$(echo "${CPU[$t]}" | median); rps=$(echo "${RPS[$t]}" | median)
  echo "| $t | $rps | $cpu | $(awk -v a="$cpu" -v b="$base_cpu" 'BEGIN {printf "%.3f", a / b}') | $(awk -v a="$rps" -v b="$base_rps" 'BEGIN {printf "%.3f", a / b}') | ${CPU[$t]} |"
done
