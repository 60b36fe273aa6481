#!/usr/bin/env bash
# The floor under turnstile (`make bench-floor`): CPU per request of a plain keep-alive HTTP/1
# proxy, in one run, on this machine, for
#   nginx       reverse proxy with upstream keep-alive (the reference)
#   core        pingora-core's server session + HTTP/1 connector and pool, no pingora-proxy
#               (benches/floor.rs; bench-only, not the product)
#   proxy       bare pingora-proxy: a ProxyHttp with only upstream_peer (benches/floor.rs)
#   turnstile   the gateway, pass-through (one route, no limits)
#   before      with BEFORE=path/to/an/older/turnstile: that binary, same configuration — a
#               change on the request path measured before and after in the same run
# all with $THREADS worker thread(s), in front of the same nginx origin (return 200).
#
# wrk -t1 -c$CONNS for $DURATION s per target, targets alternated over $ROUNDS rounds; median
# req/s and CPU µs per request of the proxying process. Then, when PROFILE=1 (default) and perf
# works here, a `perf record` of each Pingora target under the same load and its top symbols
# (self time, software cpu-clock: this machine may have no hardware counters).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-1}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
PROFILE=${PROFILE:-1}

for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt install nginx wrk)" >&2; exit 1; }
done
cargo build --release --bins --quiet

WORK=$(mktemp -d /tmp/turnstile-floor.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh
FLOOR=$(floor_binary)

ORIGIN=$(port); NGX=$(port); CORE=$(port); PROXY=$(port); GW=$(port); ADMIN=$(port)
OLD=$(port); OLD_ADMIN=$(port)
cat > "$WORK/nginx.conf" <<EOF
worker_processes $THREADS; daemon off; pid $WORK/nginx.pid; error_log $WORK/nginx.err;
events { worker_connections 4096; }
http { access_log off;
  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 64; }
  server { listen 127.0.0.1:$NGX; keepalive_requests 1000000;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF
cat > "$WORK/gw.toml" <<EOF
[server]
listen = "127.0.0.1:$GW"
threads = $THREADS
pid_file = "$WORK/gw.pid"
upgrade_sock = "$WORK/gw.sock"
[admin]
listen = "127.0.0.1:$ADMIN"
[upstreams.origin]
servers = ["127.0.0.1:$ORIGIN"]
[[routes]]
name = "all"
path_prefix = "/"
upstream = "origin"
EOF
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
nginx -c "$WORK/nginx.conf" & pids+=($!)
"$FLOOR" core "127.0.0.1:$CORE" "127.0.0.1:$ORIGIN" "$THREADS" > "$WORK/core.log" 2>&1 & pids+=($!); PID_core=$!
"$FLOOR" proxy "127.0.0.1:$PROXY" "127.0.0.1:$ORIGIN" "$THREADS" > "$WORK/proxy.log" 2>&1 & pids+=($!); PID_proxy=$!
"${CARGO_TARGET_DIR:-target}/release/turnstile" --config "$WORK/gw.toml" > "$WORK/gw.log" 2>&1 & pids+=($!); PID_turnstile=$!
for p in $ORIGIN $NGX $CORE $PROXY $GW; do wait_port "$p"; done

TARGETS=(nginx core proxy turnstile)
if [ -n "${BEFORE:-}" ]; then
  sed -e "s/127.0.0.1:$GW/127.0.0.1:$OLD/" -e "s/127.0.0.1:$ADMIN/127.0.0.1:$OLD_ADMIN/" \
    -e "s#$WORK/gw\.#$WORK/old.#g" "$WORK/gw.toml" > "$WORK/old.toml"
  "$BEFORE" --config "$WORK/old.toml" > "$WORK/old.log" 2>&1 & pids+=($!); PID_before=$!
  wait_port "$OLD"
  TARGETS+=(before)
fi
target_port() { case $1 in nginx) echo $NGX;; core) echo $CORE;; proxy) echo $PROXY;; turnstile) echo $GW;; before) echo $OLD;; esac; }
target_pid() { case $1 in nginx) pgrep -P "$(cat "$WORK/nginx.pid")" | tr '\n' ' ';; *) eval echo "\$PID_$1";; esac; }
TICK=$(getconf CLK_TCK)

for t in "${TARGETS[@]}"; do
  out=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(target_port "$t")/")
  [ "$out" = 200 ] || { echo "$t answers $out, not 200" >&2; exit 1; }
  wrk -t1 -c"$CONNS" -d1s "http://127.0.0.1:$(target_port "$t")/" >/dev/null
done

declare -A RPS CPU
echo "throughput: $ROUNDS rounds x ${DURATION}s per target, wrk -t1 -c$CONNS, $THREADS thread(s)" >&2
for round in $(seq "$ROUNDS"); do
  for t in "${TARGETS[@]}"; do
    pid=$(target_pid "$t"); before=$(cpu_ticks "$pid")
    out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$(target_port "$t")/")
    after=$(cpu_ticks "$pid")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    [ -n "$non2xx" ] && { echo "$t: $non2xx non-2xx responses" >&2; exit 1; }
    RPS[$t]="${RPS[$t]:-} $rps"
    CPU[$t]="${CPU[$t]:-} $(awk -v t=$((after - before)) -v hz="$TICK" -v r="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / r}')"
    echo "  round $round $t: $rps req/s" >&2
  done
done

NGX_CPU=$(echo "${CPU[nginx]}" | median); PROXY_CPU=$(echo "${CPU[proxy]}" | median)
printf '\n%s worker thread(s); %s rounds x %ss, wrk -t1 -c%s\n\n' "$THREADS" "$ROUNDS" "$DURATION" "$CONNS"
printf '| target | req/s (median) | CPU µs/req (median) | CPU / nginx | CPU / bare pingora-proxy |\n| --- | --- | --- | --- | --- |\n'
for t in "${TARGETS[@]}"; do
  cpu=$(echo "${CPU[$t]}" | median)
  printf '| %s | %.0f | %s | %.2f | %.2f |\n' "$t" "$(echo "${RPS[$t]}" | median)" "$cpu" \
    "$(awk -v a="$cpu" -v b="$NGX_CPU" 'BEGIN {print a/b}')" "$(awk -v a="$cpu" -v b="$PROXY_CPU" 'BEGIN {print a/b}')"
done

if [ "$PROFILE" = 1 ] && command -v perf >/dev/null && perf record -e cpu-clock -o /dev/null true >/dev/null 2>&1; then
  for t in core proxy turnstile; do
    pid=$(target_pid "$t")
    wrk -t1 -c"$CONNS" -d"$((DURATION + 2))s" "http://127.0.0.1:$(target_port "$t")/" >/dev/null &
    load=$!
    sleep 1
    perf record -q -e cpu-clock -g -p "$pid" -o "$WORK/$t.perf" -- sleep "$DURATION" >/dev/null 2>&1
    wait "$load"
    printf '\n%s: samples by object, then the top user-space symbols (perf, cpu-clock)\n\n```\n' "$t"
    perf report -i "$WORK/$t.perf" --no-children -g none --sort dso --stdio 2>/dev/null |
      awk '/^ +[0-9.]+%/ && n++ < 6'
    echo
    perf report -i "$WORK/$t.perf" --no-children -g none --sort symbol --stdio 2>/dev/null |
      awk -v top="${TOP:-20}" '/^ +[0-9.]+%/ && $2 != "[k]" && n++ < top'
    printf '```\n'
  done
fi
