#!/usr/bin/env bash
# What the operator console costs, counted (`make bench-console-count`): the gateway's
# instructions under callgrind (deterministic, whatever else the machine does), 1 worker
# thread, h2load --h1 -c1, in phases dumped apart (callgrind_control):
#   admitted  $N requests on a route with nothing to refuse: does anything kept for the
#             console run at all (`record_refusal`: never)?
#   refused   $N requests refused by a plan limit on Redis: what recording a refusal costs
#             (`record_refusal`, inclusive) of a refusal's instructions
#   idle      $IDLE_S s with nobody looking: the heartbeat publishing the summaries
#             (`Refusals::published`, per heartbeat)
#   watched   $TICKS console ticks (the calls its overview and "limited now" make every 2 s)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-2000}; TICKS=${TICKS:-10}; IDLE_S=${IDLE_S:-5}
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh
bench_start console-count nginx h2load curl python3 redis-server valgrind callgrind_annotate callgrind_control

ORIGIN=$(port); REDIS=$(port); P=$(port); A=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
wait_port "$ORIGIN"; wait_port "$REDIS"
TOKEN=bench-console-token-0123456789
cat > "$WORK/gw.toml" <<TOML
[server]
listen = "127.0.0.1:$P"
threads = 1
pid_file = "$WORK/gw.pid"
upgrade_sock = "$WORK/gw.sock"
[admin]
listen = "127.0.0.1:$A"
tokens = { bench = "$TOKEN" }
[store]
kind = "redis"
url = "redis://127.0.0.1:$REDIS"
timeout = "2s"
heartbeat_interval = "1s"
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[plans.p]
limits = [{ name = "per-day", algorithm = "fixed_window", limit = 1, window = "1d" }]
[[clients]]
id = "bench"
plan = "p"
api_keys = ["bench-api-key-0123456789"]
[[routes]]
name = "open"
path_prefix = "/open"
upstream = "o"
[[routes]]
name = "limited"
path_prefix = "/limited"
upstream = "o"
auth = "api_key"
TOML
RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" "$BIN" --config "$WORK/gw.toml" > "$WORK/gw.log" 2>&1 & pids+=($!)
VG=$!
for _ in $(seq 240); do curl -s -o /dev/null "http://127.0.0.1:$P/open" && break; sleep 0.5; done
KEY="X-Api-Key: bench-api-key-0123456789"
tick() { for path in /metrics /config /readyz /reloads /fleet /limited; do curl -s -o /dev/null -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$A$path"; done; }
h2load --h1 -c1 -n300 "http://127.0.0.1:$P/open" > /dev/null
h2load --h1 -c1 -n300 -H "$KEY" "http://127.0.0.1:$P/limited" > /dev/null
tick
callgrind_control -z "$VG" > /dev/null
h2load --h1 -c1 -n"$N" "http://127.0.0.1:$P/open" | grep -q "$N 2xx" || { echo "admitted: not all 2xx" >&2; exit 1; }
callgrind_control -d admitted "$VG" > /dev/null
h2load --h1 -c1 -n"$N" -H "$KEY" "http://127.0.0.1:$P/limited" | grep -q "$N 4xx" || { echo "refused: not all 4xx" >&2; exit 1; }
callgrind_control -d refused "$VG" > /dev/null
sleep "$IDLE_S"
callgrind_control -d idle "$VG" > /dev/null
for _ in $(seq "$TICKS"); do tick; done
callgrind_control -d watched "$VG" > /dev/null

total() { awk '/^totals:/ {print $2}' "$1"; }
# Inclusive instructions and calls of the first function matching $2 in dump $1 ("0 0" if none).
fn_cost() {
  # (awk reads to the end: an early exit would stop callgrind_annotate with SIGPIPE.)
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null | awk -v f="$2" '!done && $0 ~ f && $0 !~ /=>/ {gsub(",", "", $1); print $1; done = 1}' | { read -r v || true; echo "${v:-0}"; }
}
# Calls of the function matching $2 (from the callers' lines: "=> file:function (1,000x)").
calls() { callgrind_annotate --tree=calling --inclusive=yes "$1" 2>/dev/null | grep -F "=>" | grep -F "$2 (" | grep -oE '\([0-9,]+x\)' | tr -d '(x,)' | awk '{s += $1} END {print s + 0}'; }
dump() { ls "$WORK"/cg.out.* | sort -t. -k3 -n | sed -n "${1}p"; }
admitted=$(dump 1); refused=$(dump 2); idle=$(dump 3); watched=$(dump 4)
echo "valgrind --tool=callgrind, 1 worker thread, h2load --h1 -c1, $N requests per phase after 300 to warm up"
echo
echo "| phase | instructions | per unit | console's part |"
echo "| --- | --- | --- | --- |"
a=$(total "$admitted"); ar=$(fn_cost "$admitted" "record_refusal")
echo "| admitted ($N requests) | $a | $((a / N)) per request | record_refusal: $ar |"
r=$(total "$refused"); rr=$(fn_cost "$refused" "proxy::response::record_refusal")
echo "| refused ($N requests, 429) | $r | $((r / N)) per request | record_refusal: $((rr / N)) per request ($(awk -v a="$rr" -v b="$r" 'BEGIN {printf "%.1f", 100 * a / b}') %) |"
i=$(total "$idle"); ip=$(fn_cost "$idle" "refusals::Refusals::published"); ic=$(calls "$idle" "refusals::Refusals::published")
echo "| idle (${IDLE_S} s, nobody looking) | $i | — | Refusals::published: $ip in ${ic:-?} heartbeat(s) |"
w=$(total "$watched")
echo "| watched ($TICKS console ticks) | $w | $((w / TICKS)) per tick (6 calls) | all of it |"
