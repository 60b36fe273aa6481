#!/usr/bin/env bash
# Whole-gateway load test, in one run, on this machine (`make bench-load`).
#
# Starts: nginx as a fast origin (return 200); the peers a user would pick instead, each
# pass-through and with its per-address limit — nginx (reverse proxy with upstream
# keep-alive; limit_req), HAProxy (a stick-table request-rate limit), pingap 0.13.1 (the other
# gateway on Pingora; its limit plugin, installed by this script when missing); a local
# redis-server; and turnstile in five modes: pass-through, per-IP limit, global Redis limit on
# every request, both, and the global limit with quota leasing (`lease = 1000` per minute
# window: Redis called once per leased slice). Every proxy gets $THREADS worker thread(s)
# (default 1; THREADS=2 for the scale run). Limits are far above the offered load: nothing is
# rejected. The headline columns are turnstile / pingap and turnstile / nginx for the same
# mode (pass-through next to pass-through; limited modes next to the per-address limits).
#
# 1. Throughput: wrk -t1 -c$CONNS for $DURATION s per target, targets alternated over $ROUNDS
#    rounds (machine drift hits all alike); the median is reported, with the median CPU time
#    the proxying process spent per request (steadier than req/s on a shared machine).
# 2. Latency at a fixed rate: oha -q $RATE --latency-correction for $LAT_DURATION s per target.
# 3. Redis commands per request (INFO commandstats), peak RSS of every gateway (VmHWM), and a
#    flood of distinct client addresses through the per-IP table (RSS and tracked entries).
#
# Prints one markdown table; copy it into BENCHMARKS.md with the machine and date.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-5}
# Worker threads of every proxy (nginx workers, HAProxy threads, pingap and turnstile threads).
THREADS=${THREADS:-1}
# turnstile's server.work_stealing (default: the product's default, true).
WORK_STEALING=${WORK_STEALING:-true}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
RATE=${RATE:-5000}
LAT_DURATION=${LAT_DURATION:-10}
FLOOD_DURATION=${FLOOD_DURATION:-10}

for tool in nginx haproxy wrk redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt install nginx haproxy wrk redis-server)" >&2; exit 1; }
done
# oha, the fixed-rate latency client: installed here when missing.
if ! command -v oha >/dev/null; then
  echo "installing oha (cargo install; a few minutes)" >&2
  cargo install oha --locked >&2
fi
# pingap, the other gateway built on Pingora: installed here when missing (its build needs
# protoc: apt install protobuf-compiler).
PINGAP=${PINGAP:-$(command -v pingap || echo "$HOME/.cargo/bin/pingap")}
if [ ! -x "$PINGAP" ]; then
  command -v protoc >/dev/null || { echo "missing protoc for pingap's build (apt install protobuf-compiler)" >&2; exit 1; }
  echo "installing pingap 0.13.1 (cargo install; a few minutes)" >&2
  cargo install pingap --version 0.13.1 --locked >&2
  PINGAP="$HOME/.cargo/bin/pingap"
fi
cargo build --release --bins --quiet
BIN=target/release

WORK=$(mktemp -d /tmp/turnstile-load.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Anything still running from this run's directory (pingap outlived its SIGTERM and the
  # script in one run): only processes started here name $WORK.
  pkill -KILL -f -- "$WORK/" 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

ORIGIN=$(port); NGX=$(port); NGXL=$(port); REDIS=$(port)
KEY="load-test-key-0123456789"

cat > "$WORK/nginx.conf" <<EOF
worker_processes $THREADS; daemon off; pid $WORK/nginx.pid; error_log $WORK/nginx.err;
events { worker_connections 4096; }
http { access_log off;
  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 64; }
  limit_req_zone \$binary_remote_addr zone=ip:10m rate=1000000r/s;
  server { listen 127.0.0.1:$NGX; keepalive_requests 1000000;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:$NGXL; keepalive_requests 1000000;
    location / { limit_req zone=ip burst=1000000 nodelay;
      proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
nginx -c "$WORK/nginx.conf" & pids+=($!)

# HAProxy: pass-through, and a per-address request-rate limit in a stick table.
HAP=$(port); HAPL=$(port)
cat > "$WORK/haproxy.cfg" <<EOF
global
  nbthread ${THREADS}
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend plain
  bind 127.0.0.1:$HAP
  default_backend origin
frontend limited
  bind 127.0.0.1:$HAPL
  stick-table type ip size 100k expire 30s store http_req_rate(1s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }
  default_backend origin
backend origin
  http-reuse always
  server o 127.0.0.1:$ORIGIN
EOF
haproxy -f "$WORK/haproxy.cfg" -db > "$WORK/haproxy.log" 2>&1 & pids+=($!); PID_haproxy=$!; PID_haproxy_limit=$!

# pingap: pass-through, and its limit plugin keyed by IP.
PGP=$(port); PGPL=$(port)
cat > "$WORK/pingap.toml" <<EOF
[basic]
threads = ${THREADS}
log_level = "error"
pid_file = "$WORK/pingap.pid"
[upstreams.origin]
addrs = ["127.0.0.1:$ORIGIN"]
[plugins.iplimit]
category = "limit"
type = "rate"
tag = "ip"
max = 1000000000
interval = "1s"
[locations.plain]
upstream = "origin"
path = "/"
[locations.limited]
upstream = "origin"
path = "/"
plugins = ["iplimit"]
[servers.plain]
addr = "127.0.0.1:$PGP"
locations = ["plain"]
threads = ${THREADS}
[servers.limited]
addr = "127.0.0.1:$PGPL"
locations = ["limited"]
threads = ${THREADS}
EOF
"$PINGAP" -c "$WORK/pingap.toml" > "$WORK/pingap.log" 2>&1 & pids+=($!); PID_pingap=$!; PID_pingap_limit=$!
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & pids+=($!); PID_REDIS=$!

# mode name -> extra route lines / store
gateway() { # name ip_limit(0/1/flood) redis(0/1/lease)
  local name=$1 ip=$2 redis=$3 p a
  p=$(port); a=$(port)
  {
    echo "[server]"; echo "listen = \"127.0.0.1:$p\""; echo "threads = $THREADS"; echo "work_stealing = $WORK_STEALING"
    echo "pid_file = \"$WORK/$name.pid\""; echo "upgrade_sock = \"$WORK/$name.sock\""
    echo "trusted_proxies = [\"127.0.0.1/32\"]"; echo "max_tracked_ips = ${MAX_TRACKED:-100000}"
    echo "[admin]"; echo "listen = \"127.0.0.1:$a\""
    if [ "$redis" != 0 ]; then
      echo "[store]"; echo "kind = \"redis\""; echo "url = \"redis://127.0.0.1:$REDIS\""; echo "timeout = \"50ms\""
    fi
    echo "[upstreams.origin]"; echo "servers = [\"127.0.0.1:$ORIGIN\"]"
    echo "[plans.load]"
    if [ "$redis" = lease ]; then
      echo "limits = [{ name = \"per-minute\", algorithm = \"fixed_window\", limit = 1000000000, window = \"1m\", lease = 1000 }]"
    else
      echo "limits = [{ name = \"per-day\", algorithm = \"token_bucket\", limit = 1000000000, window = \"1s\" }]"
    fi
    echo "[[clients]]"; echo "id = \"load\""; echo "plan = \"load\""; echo "api_keys = [\"$KEY\"]"
    echo "[[routes]]"; echo "name = \"all\""; echo "path_prefix = \"/\""; echo "upstream = \"origin\""
    [ "$ip" = 1 ] && echo "ip_limit = { rate = \"1000000000/s\", burst = 1000000000 }"
    # A realistic limit for the flood: buckets stay partly drained, so they stay tracked.
    [ "$ip" = flood ] && echo "ip_limit = { rate = \"1/m\", burst = 5 }"
    [ "$redis" != 0 ] && echo "auth = \"api_key\""
  } > "$WORK/$name.toml"
  "$BIN/turnstile" --config "$WORK/$name.toml" > "$WORK/$name.log" 2>&1 & pids+=($!)
  eval "PORT_$name=$p; ADMIN_$name=$a; PID_$name=$!"
}
gateway passthrough 0 0
gateway per_ip 1 0
gateway redis 0 1
gateway both 1 1
gateway leased 0 lease
MAX_TRACKED=50000 gateway flood flood 0
for p in $ORIGIN $NGX $NGXL $PORT_passthrough $PORT_per_ip $PORT_redis $PORT_both $PORT_leased $PORT_flood $REDIS; do wait_port "$p"; done
for p in $HAP $HAPL $PGP $PGPL; do wait_port "$p"; done

TARGETS=(origin nginx nginx_limit_req haproxy haproxy_limit pingap pingap_limit passthrough per_ip redis both leased)
target_port() { case $1 in origin) echo $ORIGIN;; nginx) echo $NGX;; nginx_limit_req) echo $NGXL;;
  haproxy) echo $HAP;; haproxy_limit) echo $HAPL;; pingap) echo $PGP;; pingap_limit) echo $PGPL;;
  *) eval echo "\$PORT_$1";; esac; }
# The process doing the proxying for a target (its CPU time is reported per request).
# (every worker of nginx; the one process of the others)
target_pid() { case $1 in origin) pgrep -P "$(cat "$WORK/origin.pid")" | tr '\n' ' ';; nginx|nginx_limit_req) pgrep -P "$(cat "$WORK/nginx.pid")" | tr '\n' ' ';; *) eval echo "\$PID_$1";; esac; }
TICK=$(getconf CLK_TCK)
target_header() { case $1 in redis|both|leased) echo "X-Api-Key: $KEY";; *) echo "X-Bench: 1";; esac; }
# Round trips (script calls) and all commands (those run inside scripts count too).
redis_calls() { redis-cli -p "$REDIS" INFO commandstats | awk -F'[=,:]' '$1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" {s+=$3} END {print s+0}'; }
# Microseconds Redis spent inside the scripts (INFO commandstats: the `usec_per_call` total).
redis_usec() { redis-cli -p "$REDIS" INFO commandstats | awk -F'[=,:]' '$1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" {s+=$5} END {print s+0}'; }
redis_cmds() { redis-cli -p "$REDIS" INFO commandstats | awk -F'[=,:]' '/^cmdstat_/ && $1 != "cmdstat_info" {s+=$3} END {print s+0}'; }

# Warm up every target (connections, scripts).
for t in "${TARGETS[@]}"; do wrk -t1 -c"$CONNS" -d1s -H "$(target_header "$t")" "http://127.0.0.1:$(target_port "$t")/" >/dev/null; done

declare -A RPS CALLS CMDS REQS CPU USEC RCPU
echo "throughput: $ROUNDS rounds x ${DURATION}s per target, wrk -t1 -c$CONNS" >&2
for round in $(seq "$ROUNDS"); do
  for t in "${TARGETS[@]}"; do
    pid=$(target_pid "$t"); ticks_before=$(cpu_ticks "$pid")
    calls_before=$(redis_calls); before=$(redis_cmds); usec_before=$(redis_usec); redis_before=$(cpu_ticks "$PID_REDIS")
    out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -H "$(target_header "$t")" "http://127.0.0.1:$(target_port "$t")/")
    calls_after=$(redis_calls); after=$(redis_cmds); ticks_after=$(cpu_ticks "$pid")
    USEC[$t]=$(( ${USEC[$t]:-0} + $(redis_usec) - usec_before )); RCPU[$t]=$(( ${RCPU[$t]:-0} + $(cpu_ticks "$PID_REDIS") - redis_before ))
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    [ -n "$non2xx" ] && { echo "$t: $non2xx non-2xx responses: the limits are too low" >&2; exit 1; }
    RPS[$t]="${RPS[$t]:-} $rps"
    CMDS[$t]=$(( ${CMDS[$t]:-0} + after - before )); REQS[$t]=$(( ${REQS[$t]:-0} + reqs ))
    CALLS[$t]=$(( ${CALLS[$t]:-0} + calls_after - calls_before ))
    CPU[$t]="${CPU[$t]:-} $(awk -v t=$((ticks_after - ticks_before)) -v hz="$TICK" -v r="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / r}')"
    echo "  round $round $t: $rps req/s" >&2
  done
done

declare -A P50 P99 P999
echo "latency: oha -q $RATE --latency-correction -z ${LAT_DURATION}s -c $CONNS" >&2
for t in "${TARGETS[@]}"; do
  out=$(oha --no-tui -q "$RATE" --latency-correction -z "${LAT_DURATION}s" -c "$CONNS" -H "$(target_header "$t")" "http://127.0.0.1:$(target_port "$t")/")
  ms() { oha_ms "$1" <<<"$out"; }
  P50[$t]=$(ms "50.00%"); P99[$t]=$(ms "99.00%"); P999[$t]=$(ms "99.90%")
done

# A flood of distinct client addresses through the per-IP table (trusted proxy header).
cat > "$WORK/flood.lua" <<'EOF'
counter = 0
request = function()
  counter = counter + 1
  local a = counter % 256; local b = math.floor(counter / 256) % 256; local c = math.floor(counter / 65536) % 256
  wrk.headers["X-Forwarded-For"] = "10." .. c .. "." .. b .. "." .. a
  return wrk.format(nil, "/")
end
EOF
flood_before=$(awk '/VmHWM/ {print $2}' "/proc/$PID_flood/status")
wrk -t1 -c"$CONNS" -d"${FLOOD_DURATION}s" -s "$WORK/flood.lua" "http://127.0.0.1:$PORT_flood/" > "$WORK/flood.txt"
flood_reqs=$(awk '/requests in/ {print $1}' "$WORK/flood.txt")
flood_after=$(awk '/VmHWM/ {print $2}' "/proc/$PID_flood/status")
tracked=$(curl -s "http://127.0.0.1:$ADMIN_flood/metrics" | awk '/^turnstile_tracked_entries\{table="ip:all"\}/ {print $2}')

PASS_RPS=$(echo "${RPS[passthrough]}" | median)
# A turnstile mode's peers: pass-through next to pass-through, every limited mode next to the
# peers' per-address limits (nginx limit_req, HAProxy's stick table, pingap's limit plugin).
peer() { case $1:$2 in passthrough:pingap) echo pingap;; passthrough:nginx) echo nginx;;
  *:pingap) echo pingap_limit;; *:nginx) echo nginx_limit_req;; esac; }
printf '\n%s worker thread(s) per proxy; turnstile work_stealing = %s\n' "$THREADS" "$WORK_STEALING"
printf '\n| target | req/s (median of %s) | turnstile / pingap | turnstile / nginx | vs turnstile pass-through | CPU µs/req | p50 ms | p99 ms | p99.9 ms | Redis calls/req | Redis cmds/req | Redis µs/call | Redis CPU µs/req | peak RSS MiB |\n' "$ROUNDS"
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
for t in "${TARGETS[@]}"; do
  rps=$(echo "${RPS[$t]}" | median)
  vs_pgp="-"; vs_ngx="-"
  case $t in
    passthrough|per_ip|redis|both|leased)
      vs_pgp=$(awk -v a="$rps" -v b="$(echo "${RPS[$(peer "$t" pingap)]}" | median)" 'BEGIN {printf "%.2f", a/b}')
      vs_ngx=$(awk -v a="$rps" -v b="$(echo "${RPS[$(peer "$t" nginx)]}" | median)" 'BEGIN {printf "%.2f", a/b}');;
  esac
  vs_pass=$(awk -v a="$rps" -v b="$PASS_RPS" 'BEGIN {printf "%.2f", a/b}')
  calls="-"; cmds="-"; rss="-"; usec="-"; rcpu="-"
  case $t in
    redis|both|leased)
      calls=$(awk -v c="${CALLS[$t]}" -v r="${REQS[$t]}" 'BEGIN {printf "%.3f", c/r}')
      cmds=$(awk -v c="${CMDS[$t]}" -v r="${REQS[$t]}" 'BEGIN {printf "%.2f", c/r}')
      # Inside the scripts per call (usec_per_call), and the Redis process's CPU per request
      # (the scripts, reading the calls, writing the replies).
      usec=$(awk -v u="${USEC[$t]}" -v c="${CALLS[$t]}" 'BEGIN {printf "%.2f", c ? u/c : 0}')
      rcpu=$(awk -v t="${RCPU[$t]}" -v hz="$TICK" -v r="${REQS[$t]}" 'BEGIN {printf "%.2f", t / hz * 1e6 / r}');;
  esac
  case $t in
    passthrough|per_ip|redis|both|leased) pid=$(eval echo "\$PID_$t"); rss=$(awk '/VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status");;
  esac
  cpu=$(echo "${CPU[$t]}" | median)
  printf '| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$rps" "$vs_pgp" "$vs_ngx" "$vs_pass" "$cpu" "${P50[$t]}" "${P99[$t]}" "${P999[$t]}" "$calls" "$cmds" "$usec" "$rcpu" "$rss"
done
printf '\nflood: %s requests from distinct addresses in %ss through a per-IP table (ip_limit 1/m burst 5, max_tracked_ips = 50000):\n' "$flood_reqs" "$FLOOD_DURATION"
printf 'tracked entries after: %s; gateway peak RSS %.1f MiB before, %.1f MiB after\n' "${tracked:-?}" "$(awk -v k="$flood_before" 'BEGIN {print k/1024}')" "$(awk -v k="$flood_after" 'BEGIN {print k/1024}')"
