#!/usr/bin/env bash
# The gateway's own CPU per request in each mode a route can be in (`make bench-modes`), in one
# run, next to pass-through: wrk -t1 -c$CONNS through turnstile ($THREADS worker threads) to an
# nginx origin, targets alternated over $ROUNDS rounds of $DURATION s, median CPU time (user +
# system) of the gateway process alone per request — Redis's side is not counted.
#   pass      no auth, no limit
#   ip        a per-IP limit (in process)
#   key       an API key, a plan limit in the memory store
#   token     an RS256 bearer token (remembered after its first request), same plan
#   redis1    an API key, one plan limit on Redis
#   redis4    an API key, four plan limits on Redis
#   keyed     an API key, one plan limit and one header-keyed limit on Redis
#   redis1-alone  as redis1 with store.batch_max = 1: every decision its own script call
#   redis1-one    as redis1 with store.batch_in_flight = 1: decisions queue behind every call
#   LAT_RATES="200 5000"  also latency at those fixed rates (oha -q RATE --latency-correction,
#                         $LAT_DURATION s, -c $CONNS) for the targets in $LAT_TARGETS (default:
#                         redis1 redis1-alone), alternated over $ROUNDS rounds: median p50 / p99
#   MODULE=1  also m-redis1, m-redis4, m-keyed: the same against a second Redis with
#             turnstile's module loaded (module/: store.decide_with = "auto" finds it), each
#             mode's Redis CPU read off its own Redis (MODULE_SO=<library>: that build).
# Every round runs the targets in the opposite order to the round before.
# Limits are far above the offered load: nothing is rejected. Prints one markdown table; for
# the Redis modes also Redis's CPU per request (the redis-server process, same rounds) and the
# mean batch size (turnstile_store_batched_decisions_total / turnstile_store_batches_total).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
THREADS=${THREADS:-1}
for tool in nginx wrk openssl python3 redis-server; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
# BIN=path: measure that binary instead of building this tree.
[ -n "${BIN:-}" ] || cargo build --release --bins --quiet
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/turnstile}
WORK=$(mktemp -d /tmp/turnstile-modes.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

b64() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/rsa.pem" 2>/dev/null
openssl pkey -in "$WORK/rsa.pem" -pubout -out "$WORK/rsa.pub"
payload=$(printf '{"iss":"bench","aud":"api","sub":"user-42","exp":%s}' $(($(date +%s) + 86400)) | b64)
h=$(printf '{"alg":"RS256","typ":"JWT"}' | b64)
TOKEN="$h.$payload.$(printf '%s.%s' "$h" "$payload" | openssl dgst -sha256 -sign "$WORK/rsa.pem" -binary | b64)"

ORIGIN=$(port); REDIS=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
REDIS_PID=$!
wait_port "$ORIGIN"; wait_port "$REDIS"
if [ -n "${MODULE:-}" ]; then
  if [ -z "${MODULE_SO:-}" ]; then
    cargo build --quiet --release --locked -p turnstile-module
    MODULE_SO="$PWD/${CARGO_TARGET_DIR:-target}/release/libturnstile_module.so"
  fi
  MREDIS=$(port)
  redis-server --port "$MREDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
    --loadmodule "$MODULE_SO" > "$WORK/mredis.log" 2>&1 & pids+=($!)
  MREDIS_PID=$!
  wait_port "$MREDIS"
fi

BIG=10000000
limit() { echo "{ name = \"$1\", algorithm = \"sliding_window\", limit = $BIG, window = \"$2\" }"; }
declare -A PORTS PIDS ADMINS
start() { # name store auth plan-limits route-extra
  local p a; p=$(port); a=$(port)
  cat > "$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
threads = $THREADS
pid_file = "$WORK/$1.pid"
upgrade_sock = "$WORK/$1.sock"
key_hash_secret = "bench-key-hash-secret-0123456789"
[admin]
listen = "127.0.0.1:$a"
$2
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[plans.p]
limits = [$4]
[[clients]]
id = "bench"
plan = "p"
api_keys = ["bench-api-key-0123456789"]
[issuers.i]
issuer = "bench"
audiences = ["api"]
keys = { file = "$WORK/rsa.pub" }
algorithms = ["RS256"]
plan = "p"
[[routes]]
name = "r"
path_prefix = "/"
upstream = "o"
auth = "$3"
$5
TOML
  RUST_LOG=warn "$BIN" --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  PIDS[$1]=$!
  (wait_port "$p") || { cat "$WORK/$1.log" >&2; exit 1; }
  PORTS[$1]=$p
  ADMINS[$1]=$a
}
REDIS_STORE=$(printf '[store]\nkind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "1s"' "$REDIS")
ONE=$(limit l 1h)
FOUR="$(limit a 1m), $(limit b 1h), $(limit c 1d), $(limit d 10m)"
KEYED=$(printf '[[routes.limits]]\nname = "k"\nalgorithm = "sliding_window"\nlimit = %s\nwindow = "1h"\nkey = ["header:x-tenant"]' "$BIG")
start pass "" none "$ONE" ""
start ip "" none "$ONE" 'ip_limit = { rate = "10000000/s", burst = 10000000 }'
start key "" api_key "$ONE" ""
start token "" jwt "$ONE" ""
start redis1 "$REDIS_STORE" api_key "$ONE" ""
start redis4 "$REDIS_STORE" api_key "$FOUR" ""
start keyed "$REDIS_STORE" api_key "$ONE" "$KEYED"
start redis1-alone "$REDIS_STORE
batch_max = 1" api_key "$ONE" ""
start redis1-one "$REDIS_STORE
batch_in_flight = 1" api_key "$ONE" ""
declare -A RPID
for t in redis1 redis4 keyed redis1-alone redis1-one; do RPID[$t]=$REDIS_PID; done
if [ -n "${MODULE:-}" ]; then
  MSTORE=$(printf '[store]\nkind = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "1s"' "$MREDIS")
  start m-redis1 "$MSTORE" api_key "$ONE" ""
  start m-redis4 "$MSTORE" api_key "$FOUR" ""
  start m-keyed "$MSTORE" api_key "$ONE" "$KEYED"
  for t in m-redis1 m-redis4 m-keyed; do RPID[$t]=$MREDIS_PID; done
fi
KEY="X-Api-Key: bench-api-key-0123456789"
declare -A HEADER=(
  [pass]="Accept: */*" [ip]="Accept: */*" [key]="$KEY" [token]="Authorization: Bearer $TOKEN"
  [redis1]="$KEY" [redis4]="$KEY" [keyed]="$KEY" [redis1-alone]="$KEY" [redis1-one]="$KEY"
  [m-redis1]="$KEY" [m-redis4]="$KEY" [m-keyed]="$KEY"
)
# TARGETS="pass redis1 ...": only those modes (each still started).
read -r -a targets <<<"${TARGETS:-pass ip key token redis1 redis4 keyed redis1-alone}"
for t in "${targets[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "${HEADER[$t]}" -H "X-Tenant: t1" "http://127.0.0.1:${PORTS[$t]}/")
  [ "$code" = 200 ] || { echo "$t answers $code" >&2; cat "$WORK/$t.log" >&2; exit 1; }
  wrk -t1 -c"$CONNS" -d1s -H "${HEADER[$t]}" -H "X-Tenant: t1" "http://127.0.0.1:${PORTS[$t]}/" > /dev/null
done

# The targets of round $1, in the opposite order every other round: a mode measured just after
# another may read differently (seen in redis_core.sh's rows), so no mode always goes first.
round_order() { # round targets...
  local round=$1
  shift
  if (( round % 2 == 0 )); then printf '%s\n' "$@" | tac; else printf '%s\n' "$@"; fi
}
declare -A RPS CPU RCPU
for round in $(seq "$ROUNDS"); do
  for t in $(round_order "$round" "${targets[@]}"); do
    rpid=${RPID[$t]:-$REDIS_PID}
    rbefore=$(cpu_ticks "$rpid")
    read -r rps us < <(cpu_round "${PIDS[$t]}" "${PORTS[$t]}" "$t" "${HEADER[$t]}" "X-Tenant: t1")
    [ -n "${us:-}" ] || exit 1
    rus=$(awk -v t=$(($(cpu_ticks "$rpid") - rbefore)) -v n="$rps" -v d="$DURATION" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / (n * d)}')
    RPS[$t]="${RPS[$t]:-} $rps"; CPU[$t]="${CPU[$t]:-} $us"; RCPU[$t]="${RCPU[$t]:-} $rus"
    echo "round $round $t $rps req/s, $us µs CPU/request, Redis $rus µs/request" >&2
  done
done
# A gateway's counter (0 when absent).
counter() { curl -s "http://127.0.0.1:${ADMINS[$1]}/metrics" | awk -v m="$2" '$1 == m {print $2; f=1} END {if (!f) print 0}'; }
# The "/ pass-through" column needs pass among TARGETS ("—" without it).
PASS=$(echo "${CPU[pass]:-0}" | median)
echo "$THREADS worker thread(s); $ROUNDS rounds x ${DURATION}s, wrk -t1 -c$CONNS; the gateway process's CPU only"
echo
echo "| mode | req/s (median) | CPU µs / request (median) | / pass-through | rounds (µs) | Redis CPU µs / request | mean batch |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  cpu=$(echo "${CPU[$t]}" | median)
  redis="" batch=""
  case $t in
    redis*|keyed|m-*)
      redis=$(echo "${RCPU[$t]}" | median)
      batch=$(awk -v d="$(counter "$t" turnstile_store_batched_decisions_total)" -v b="$(counter "$t" turnstile_store_batches_total)" 'BEGIN {if (b > 0) printf "%.1f", d / b; else print "—"}') ;;
  esac
  echo "| $t | $(echo "${RPS[$t]}" | median) | $cpu | $(awk -v a="$cpu" -v b="$PASS" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "—"}') | ${CPU[$t]} | $redis | $batch |"
done

[ -n "${LAT_RATES:-}" ] || exit 0
read -r -a lat_targets <<<"${LAT_TARGETS:-redis1 redis1-alone}"
declare -A P50 P99
for round in $(seq "$ROUNDS"); do
  for rate in $LAT_RATES; do
    for t in $(round_order "$round" "${lat_targets[@]}"); do
      out=$(oha --no-tui -q "$rate" --latency-correction -z "${LAT_DURATION:-10}s" -c "$CONNS" -H "${HEADER[$t]}" -H "X-Tenant: t1" "http://127.0.0.1:${PORTS[$t]}/")
      P50[$t:$rate]="${P50[$t:$rate]:-} $(oha_ms 50.00% <<<"$out")"
      P99[$t:$rate]="${P99[$t:$rate]:-} $(oha_ms 99.00% <<<"$out")"
      echo "round $round $t at $rate/s: p50 $(oha_ms 50.00% <<<"$out") ms, p99 $(oha_ms 99.00% <<<"$out") ms" >&2
    done
  done
done
echo
echo "| mode | rate (req/s) | p50 ms (median) | p99 ms (median) | rounds p50 | rounds p99 |"
echo "| --- | --- | --- | --- | --- | --- |"
for rate in $LAT_RATES; do
  for t in "${lat_targets[@]}"; do
    echo "| $t | $rate | $(echo "${P50[$t:$rate]}" | median) | $(echo "${P99[$t:$rate]}" | median) | ${P50[$t:$rate]} | ${P99[$t:$rate]} |"
  done
done
