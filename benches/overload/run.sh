#!/usr/bin/env bash
# Overload experiment (`make bench-overload`): an upstream whose capacity is well below the
# offered load, behind two turnstile gateways that differ only in `[upstreams.orders.shedding]`.
#
# The upstream: orders-api --capacity $CAPACITY --delay-ms $SERVICE_MS — it serves at most
# CAPACITY requests at a time, each for SERVICE_MS, so about CAPACITY*1000/SERVICE_MS per
# second; the rest wait in its queue (like a saturated thread pool). Each gateway gets its own
# upstream process, started fresh for every run (a backlog must not leak into the next run).
#
# The load, open loop (oha -q, latency corrected), two classes at once for $DURATION s:
#   critical   $CRITICAL_RPS req/s on /echo/critical  (route priority = "critical")
#   sheddable  $SHEDDABLE_RPS req/s on /echo/bulk     (route priority = "sheddable")
# Targets alternate over $ROUNDS rounds; the median of each figure is reported.
#
# Reported per target: goodput (200 responses per second, both classes), the critical
# class's success rate and p50/p99 latency (of all its responses, corrected for coordinated
# omission), and what happened to the rest (503 shed, 504 upstream timeout).
# Writes benches/overload/results.json, a markdown table on stdout, and the plot
# (benches/overload/plot.py → benches/overload/overload.svg).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20}
CAPACITY=${CAPACITY:-8}
SERVICE_MS=${SERVICE_MS:-20}
CRITICAL_RPS=${CRITICAL_RPS:-50}
SHEDDABLE_RPS=${SHEDDABLE_RPS:-750}
READ_TIMEOUT=${READ_TIMEOUT:-1s}

for tool in oha python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (cargo install oha)" >&2; exit 1; }
done
cargo build --release --bins --quiet
BIN=target/release
WORK=$(mktemp -d /tmp/turnstile-overload.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

# gateway NAME SHEDDING(0/1) UPSTREAM_PORT -> prints "port pid"
gateway() {
  local name=$1 shedding=$2 upstream=$3 p a
  p=$(port); a=$(port)
  {
    echo "[server]"; echo "listen = \"127.0.0.1:$p\""; echo "threads = 2"
    echo "pid_file = \"$WORK/$name.pid\""; echo "upgrade_sock = \"$WORK/$name.sock\""
    echo "watch_config = false"
    echo "[admin]"; echo "listen = \"127.0.0.1:$a\""
    echo "[upstreams.orders]"; echo "servers = [\"127.0.0.1:$upstream\"]"
    if [ "$shedding" = 1 ]; then
      echo "[upstreams.orders.shedding]"
      echo "min_limit = 4"; echo "max_limit = 200"; echo "initial_limit = 20"
      echo "window = \"100ms\""; echo "queue = 50"; echo "queue_timeout = \"50ms\""
    fi
    for r in critical:critical bulk:sheddable; do
      echo "[[routes]]"; echo "name = \"${r%%:*}\""; echo "path_prefix = \"/echo/${r%%:*}\""
      echo "upstream = \"orders\""; echo "read_timeout = \"$READ_TIMEOUT\""
      echo "priority = \"${r##*:}\""
    done
  } > "$WORK/$name.toml"
  "$BIN/turnstile" --config "$WORK/$name.toml" > "$WORK/$name.log" 2>&1 &
  echo "$p $!"
}

run() { # NAME SHEDDING ROUND
  local name=$1 shedding=$2 round=$3 up gw gwpid uppid
  up=$(port)
  "$BIN/orders-api" --port "$up" --name orders --threads 1 \
    --capacity "$CAPACITY" --delay-ms "$SERVICE_MS" > "$WORK/up-$name.log" 2>&1 &
  uppid=$!; pids+=("$uppid")
  wait_port "$up"
  read -r gw gwpid < <(gateway "$name" "$shedding" "$up")
  pids+=("$gwpid")
  wait_port "$gw"
  oha -z "${DURATION}s" -q "$CRITICAL_RPS" -c 200 --latency-correction --no-tui \
    --output-format json "http://127.0.0.1:$gw/echo/critical" > "$WORK/$name-$round-critical.json" &
  local c=$!
  oha -z "${DURATION}s" -q "$SHEDDABLE_RPS" -c 1000 --latency-correction --no-tui \
    --output-format json "http://127.0.0.1:$gw/echo/bulk" > "$WORK/$name-$round-bulk.json"
  wait "$c"
  kill "$gwpid" "$uppid" 2>/dev/null || true
  wait "$gwpid" "$uppid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  for target in shedding:1 no-shedding:0; do
    echo "round $round: ${target%%:*}" >&2
    run "${target%%:*}" "${target##*:}" "$round"
  done
done

python3 benches/overload/summarize.py "$WORK" "$ROUNDS" "$DURATION" \
  "capacity $CAPACITY x ${SERVICE_MS} ms (~$((CAPACITY * 1000 / SERVICE_MS)) req/s), offered $CRITICAL_RPS critical + $SHEDDABLE_RPS sheddable req/s, read_timeout $READ_TIMEOUT, $ROUNDS x ${DURATION}s" \
  > benches/overload/results.json
python3 benches/overload/plot.py benches/overload/results.json benches/overload/overload.svg
python3 benches/overload/plot.py --table benches/overload/results.json
