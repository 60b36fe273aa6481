#!/usr/bin/env bash
# What the operator console costs the request path (`make bench-console`), in one run: two
# gateways with the same configuration (an API key, one plan limit on Redis, limits far above
# the load: nothing refused), wrk -t1 -c$CONNS through each ($THREADS worker threads) to an
# nginx origin, alternated over $ROUNDS rounds of $DURATION s; median CPU time (user + system)
# of the gateway process per request — everything the process does, its admin listener too.
#   quiet    nobody looks
#   watched  the console open all the while: every $POLL_S s the calls its overview and
#            "limited now" pages make (/metrics, /config, /readyz, /reloads, /fleet, /limited),
#            with the admin token, from before the first round to after the last
# What is kept for the console when nobody looks (refusals, on the refusal path only; the
# summaries published with the heartbeat) is in BENCHMARKS.md, counted with callgrind.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-7}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
THREADS=${THREADS:-1}
POLL_S=${POLL_S:-2}
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh
bench_start console nginx wrk curl python3 redis-server

ORIGIN=$(port); REDIS=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
wait_port "$ORIGIN"; wait_port "$REDIS"

ADMIN_TOKEN=bench-console-token-0123456789
declare -A PORTS PIDS ADMINS
start() { # name
  local p a; p=$(port); a=$(port)
  cat > "$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
threads = $THREADS
pid_file = "$WORK/$1.pid"
upgrade_sock = "$WORK/$1.sock"
[admin]
listen = "127.0.0.1:$a"
tokens = { bench = "$ADMIN_TOKEN" }
[store]
kind = "redis"
url = "redis://127.0.0.1:$REDIS"
timeout = "1s"
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[plans.p]
limits = [{ name = "l", algorithm = "sliding_window", limit = 10000000, window = "1h" }]
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
  RUST_LOG=warn "$BIN" --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  PIDS[$1]=$!
  (wait_port "$p") || { cat "$WORK/$1.log" >&2; exit 1; }
  PORTS[$1]=$p
  ADMINS[$1]=$a
}
start quiet
start watched
KEY="X-Api-Key: bench-api-key-0123456789"

# The console, open on the watched gateway: its calls every POLL_S seconds.
poll() {
  while :; do
    for path in /metrics /config /readyz /reloads /fleet /limited; do
      curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:${ADMINS[watched]}$path" >> "$WORK/polls"
    done
    sleep "$POLL_S"
  done
}
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $ADMIN_TOKEN" "http://127.0.0.1:${ADMINS[watched]}/limited")
[ "$code" = 200 ] || { echo "the admin API answers $code" >&2; exit 1; }
poll & pids+=($!)
targets=(quiet watched)
for t in "${targets[@]}"; do
  wrk -t1 -c"$CONNS" -d1s -H "$KEY" "http://127.0.0.1:${PORTS[$t]}/" > /dev/null
done

declare -A RPS CPU
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    read -r rps us < <(cpu_round "${PIDS[$t]}" "${PORTS[$t]}" "$t" "$KEY")
    [ -n "${us:-}" ] || exit 1
    RPS[$t]="${RPS[$t]:-} $rps"; CPU[$t]="${CPU[$t]:-} $us"
    echo "round $round $t $rps req/s, $us µs CPU/request" >&2
  done
done
polls=$(grep -c '^200$' "$WORK/polls" || true); failed=$(grep -vc '^200$' "$WORK/polls" || true)
QUIET=$(echo "${CPU[quiet]}" | median)
echo "$THREADS worker thread(s); $ROUNDS rounds x ${DURATION}s, wrk -t1 -c$CONNS; the gateway process's CPU only; console calls every ${POLL_S}s on 'watched'"
echo
echo "| gateway | req/s (median) | CPU µs / request (median) | / quiet | rounds (µs) |"
echo "| --- | --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  cpu=$(echo "${CPU[$t]}" | median)
  echo "| $t | $(echo "${RPS[$t]}" | median) | $cpu | $(awk -v a="$cpu" -v b="$QUIET" 'BEGIN {printf "%.3f", a/b}') | ${CPU[$t]} |"
done
echo
echo "paired rounds (watched − quiet, µs): $(paste -d' ' <(echo "${CPU[watched]}" | tr ' ' '\n' | grep -v '^$') <(echo "${CPU[quiet]}" | tr ' ' '\n' | grep -v '^$') | awk '{printf "%+.1f ", $1 - $2}')"
echo "console calls answered 200 during the run: $polls (others: $failed)"
