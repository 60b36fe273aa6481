#!/usr/bin/env bash
# What the leaky bucket's holding and cost_from_response's charge cost (`make bench-shaping`):
# three gateways (1 worker thread each) on one real Redis, in front of an nginx origin that
# answers every request with `x-tokens-used: 7`, each route keyed by one API key:
#   plain     a sliding window far from its limit: one check.lua per request
#   delayed   a leaky bucket at $RATE/s (burst $RATE): requests beyond the rate are held
#             until their turn, none refused
#   charged   a sliding window with cost_from_response = "header:x-tokens-used": the check
#             and, after the response, one charge.lua per request
# Load: h2load over HTTP/1, $CLIENTS clients each sending $((RATE / CLIENTS)) requests/s (in
# step, so they arrive in bursts of $CLIENTS that the leaky bucket spreads out), $DURATION s
# per target, targets alternated over $ROUNDS rounds. Reported, medians: the gateway's CPU
# (user + system) per request, Redis's script time per request (INFO commandstats), the
# share of requests held and how long.
#
# Then the shape itself: $BURST requests sent at once to a leaky bucket of 10/s (burst
# $BURST) in front of the Orders API, which records when each arrived: how many reached it
# in each 100 ms. SHAPE_ONLY=1 skips the load rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
RATE=${RATE:-1000}
CLIENTS=${CLIENTS:-20}
BURST=${BURST:-30}
for tool in nginx h2load redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt install nginx nghttp2-client redis-server curl)" >&2; exit 1; }
done
cargo build --release --bins --quiet
WORK=$(mktemp -d /tmp/turnstile-shaping.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

ORIGIN=$(port)
cat > "$WORK/origin.conf" <<NGX
worker_processes 1; daemon off; pid $WORK/origin.pid; error_log $WORK/origin.err;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$ORIGIN; keepalive_requests 1000000;
    location / { add_header x-tokens-used 7 always; return 200 "ok\n"; } } }
NGX
nginx -c "$WORK/origin.conf" & pids+=($!)
REDIS=$(port)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no > "$WORK/redis.log" 2>&1 & pids+=($!)
wait_port "$ORIGIN"; wait_port "$REDIS"

declare -A PORTS PIDS ADMINS
start() { # name limit [origin port]
  local p a; p=$(port); a=$(port)
  cat > "$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
threads = 1
pid_file = "$WORK/$1.pid"
upgrade_sock = "$WORK/$1.sock"
[admin]
listen = "127.0.0.1:$a"
[store]
kind = "redis"
url = "redis://127.0.0.1:$REDIS"
prefix = "$1"
timeout = "1s"
[upstreams.o]
servers = ["127.0.0.1:${3:-$ORIGIN}"]
[plans.p]
limits = [$2]
[[clients]]
id = "bench"
plan = "p"
api_keys = ["bench-api-key-0123456789"]
[[routes]]
name = "r"
path_prefix = "/"
upstream = "o"
auth = "api_key"
TOML
  RUST_LOG=warn target/release/turnstile --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  PIDS[$1]=$!
  (wait_port "$p") || { cat "$WORK/$1.log" >&2; exit 1; }
  PORTS[$1]=$p; ADMINS[$1]=$a
}
start plain '{ name = "l", algorithm = "sliding_window", limit = 100000000, window = "1h" }'
start delayed "{ name = \"l\", algorithm = \"leaky_bucket\", limit = $RATE, window = \"1s\", burst = $RATE }"
start charged '{ name = "l", algorithm = "sliding_window", limit = 100000000, window = "1h", cost_from_response = "header:x-tokens-used" }'
# The shape's origin is the demo Orders API: it records when each request arrived.
ORDERS=$(port)
target/release/orders-api --port "$ORDERS" --name shape > "$WORK/orders.log" 2>&1 & pids+=($!)
wait_port "$ORDERS"
start shape "{ name = \"l\", algorithm = \"leaky_bucket\", limit = 10, window = \"1s\", burst = $BURST }" "$ORDERS"
KEY="x-api-key: bench-api-key-0123456789"
targets=(plain delayed charged)
for t in "${targets[@]}" shape; do
  path=/; [ "$t" = shape ] && path=/orders
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "$KEY" "http://127.0.0.1:${PORTS[$t]}$path")
  [ "$code" = 200 ] || { echo "$t answers $code" >&2; cat "$WORK/$t.log" >&2; exit 1; }
done

# A metric's value (summed over its series) from an admin listener.
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%.6f", s}'; }
# Microseconds Redis spent in scripts (EVALSHA) since the last CONFIG RESETSTAT.
script_usec() { redis-cli -p "$REDIS" INFO commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $4}'; }

HZ=$(getconf CLK_TCK)
declare -A CPU RED HELD WAIT RPS
[ "${SHAPE_ONLY:-0}" = 1 ] && ROUNDS=0
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    redis-cli -p "$REDIS" CONFIG RESETSTAT > /dev/null
    held0=$(metric "${ADMINS[$t]}" turnstile_delay_seconds_count)
    wait0=$(metric "${ADMINS[$t]}" turnstile_delay_seconds_sum)
    before=$(cpu_ticks "${PIDS[$t]}")
    out=$(h2load --h1 -c"$CLIENTS" --rps=$((RATE / CLIENTS)) -D "$DURATION" -H "$KEY" "http://127.0.0.1:${PORTS[$t]}/")
    after=$(cpu_ticks "${PIDS[$t]}")
    # The charges are sent after the responses: let the last ones land.
    sleep 0.5
    usec=$(script_usec)
    held1=$(metric "${ADMINS[$t]}" turnstile_delay_seconds_count)
    wait1=$(metric "${ADMINS[$t]}" turnstile_delay_seconds_sum)
    done_=$(echo "$out" | awk '/^requests:/ {print $6}')
    ok=$(echo "$out" | awk '/^status codes:/ {print $3}')
    [ "$ok" = "$done_" ] || { echo "$t: $ok of $done_ answers were 2xx" >&2; echo "$out" >&2; exit 1; }
    rps=$(awk -v n="$done_" -v d="$DURATION" 'BEGIN {printf "%.0f", n / d}')
    us=$(awk -v t=$((after - before)) -v n="$done_" -v hz="$HZ" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
    red=$(awk -v u="${usec:-0}" -v n="$done_" 'BEGIN {printf "%.1f", u / n}')
    held=$(awk -v a="$held0" -v b="$held1" -v n="$done_" 'BEGIN {printf "%.0f", (b - a) / n * 100}')
    wait=$(awk -v a="$wait0" -v b="$wait1" -v h0="$held0" -v h1="$held1" 'BEGIN {printf "%.2f", (h1 > h0) ? (b - a) / (h1 - h0) * 1000 : 0}')
    CPU[$t]="${CPU[$t]:-} $us"; RED[$t]="${RED[$t]:-} $red"; RPS[$t]="${RPS[$t]:-} $rps"
    HELD[$t]="${HELD[$t]:-} $held"; WAIT[$t]="${WAIT[$t]:-} $wait"
    echo "round $round $t: $rps req/s, $us µs gateway CPU/request, $red µs Redis scripts/request, $held% held ($wait ms mean)" >&2
  done
done
[ "$ROUNDS" = 0 ] || {
echo "| route | req/s | gateway CPU µs / request | Redis script µs / request | held | mean hold (ms) | rounds (gateway µs) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  echo "| $t | $(echo "${RPS[$t]}" | median) | $(echo "${CPU[$t]}" | median) | $(echo "${RED[$t]}" | median) | $(echo "${HELD[$t]}" | median) % | $(echo "${WAIT[$t]}" | median) | ${CPU[$t]} |"
done
}

# The shape: BURST requests at once, forwarded at 10/s.
echo
echo "$BURST requests sent at once to a leaky bucket of 10/s, burst $BURST: how many reached the upstream in each 100 ms"
python3 - "${PORTS[shape]}" "$ORDERS" "$BURST" <<'PY'
import json, sys, threading, urllib.request
gw, orders, burst = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def arrivals():
    with urllib.request.urlopen(f"http://127.0.0.1:{orders}/_control/arrivals") as r:
        return json.load(r)["ms"]
seen = len(arrivals())
ready = threading.Barrier(burst)
def one():
    req = urllib.request.Request(f"http://127.0.0.1:{gw}/orders",
                                 headers={"x-api-key": "bench-api-key-0123456789"})
    ready.wait()
    urllib.request.urlopen(req).read()
threads = [threading.Thread(target=one) for _ in range(burst)]
for t in threads: t.start()
for t in threads: t.join()
# When the upstream saw each of the burst's requests, from the first.
ms = sorted(arrivals()[seen:])
ms = [m - ms[0] for m in ms]
buckets = {}
for m in ms:
    buckets[m // 100] = buckets.get(m // 100, 0) + 1
print("```")
print("ms after the first   reached the upstream")
for b in range(0, max(buckets) + 1):
    n = buckets.get(b, 0)
    print(f"{b * 100:5d}-{b * 100 + 99:<5d}        {n:2d} {'#' * n}")
print("```")
gaps = [b - a for a, b in zip(ms, ms[1:])]
print(f"{len(ms)} reached the upstream over {ms[-1]} ms; gaps between two: {min(gaps)}..{max(gaps)} ms")
PY
