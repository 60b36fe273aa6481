#!/usr/bin/env bash
# `make cluster-demo`: the docker-compose.yml topology as local processes on loopback —
# redis-server, two orders-api, three turnstile replicas, HAProxy in front — built from the
# same config files (conf/cluster/), with only the addresses rewritten:
#   service names          -> 127.0.0.1 and the ports below
#   the balancer's address -> 127.0.0.2 (HAProxy connects to the gateways from it; it is the
#                             only trusted proxy, so the gateways see the client's address)
# Runs until Ctrl-C (or SIGTERM). Ports can be chosen with environment variables; when ready,
# they are written to $WORK/ports.env and "cluster ready" is printed.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release}
WORK=${WORK:-$(mktemp -d /tmp/turnstile-cluster.XXXXXX)}
LB_PORT=${LB_PORT:-8080}
REDIS_PORT=${REDIS_PORT:-6390}
O1_PORT=${O1_PORT:-9001}
O2_PORT=${O2_PORT:-9002}
read -r -a GW_PORTS <<< "${GW_PORTS:-8081 8082 8083}"
read -r -a ADMIN_PORTS <<< "${ADMIN_PORTS:-9091 9092 9093}"
LB_ADDR=127.0.0.2
mkdir -p "$WORK"

for tool in redis-server haproxy; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed (apt-get install redis-server haproxy)" >&2; exit 1; }
done
for b in turnstile orders-api; do
  [ -x "$BIN/$b" ] || { echo "error: $BIN/$b missing: run cargo build --release --bins" >&2; exit 1; }
done

pids=()
cleanup() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

# Render the shared files; fail if a compose-only address survived (the files drifted).
render_gateway() { # index gateway-port admin-port
  sed -e "s|redis://redis:6379|redis://127.0.0.1:$REDIS_PORT|" \
      -e "s|\"orders-1:9001\"|\"127.0.0.1:$O1_PORT\"|" \
      -e "s|\"orders-2:9002\"|\"127.0.0.1:$O2_PORT\"|" \
      -e "s|listen = \"0.0.0.0:8080\"|listen = \"127.0.0.1:$2\"|" \
      -e "s|listen = \"0.0.0.0:9090\"|listen = \"127.0.0.1:$3\"|" \
      -e "s|172.28.0.10/32|$LB_ADDR/32|" \
      -e "s|/tmp/turnstile|$WORK/gateway-$1|g" \
      conf/cluster/turnstile.toml > "$WORK/gateway-$1.toml"
  if grep -qE 'redis:6379|orders-[12]:|0\.0\.0\.0|172\.28\.' "$WORK/gateway-$1.toml"; then
    echo "error: conf/cluster/turnstile.toml no longer matches what this script rewrites" >&2; exit 1
  fi
}
for i in 1 2 3; do render_gateway "$i" "${GW_PORTS[$((i-1))]}" "${ADMIN_PORTS[$((i-1))]}"; done
sed -e "s|bind \*:8080|bind 127.0.0.1:$LB_PORT|" \
    -e "s|source 172.28.0.10|source $LB_ADDR|" \
    -e "s|turnstile-1:8080 check port 9090|127.0.0.1:${GW_PORTS[0]} check port ${ADMIN_PORTS[0]}|" \
    -e "s|turnstile-2:8080 check port 9090|127.0.0.1:${GW_PORTS[1]} check port ${ADMIN_PORTS[1]}|" \
    -e "s|turnstile-3:8080 check port 9090|127.0.0.1:${GW_PORTS[2]} check port ${ADMIN_PORTS[2]}|" \
    conf/cluster/haproxy.cfg > "$WORK/haproxy.cfg"
if grep -qE 'turnstile-[123]:|172\.28\.|\*:8080' "$WORK/haproxy.cfg"; then
  echo "error: conf/cluster/haproxy.cfg no longer matches what this script rewrites" >&2; exit 1
fi

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --maxmemory 256mb --maxmemory-policy noeviction --dir "$WORK" > "$WORK/redis.log" 2>&1 & pids+=($!)
"$BIN/orders-api" --port "$O1_PORT" --name orders-1 > "$WORK/orders-1.log" 2>&1 & pids+=($!)
"$BIN/orders-api" --port "$O2_PORT" --name orders-2 > "$WORK/orders-2.log" 2>&1 & pids+=($!)
for i in 1 2 3; do
  "$BIN/turnstile" --config "$WORK/gateway-$i.toml" > "$WORK/gateway-$i.log" 2>&1 & pids+=($!)
done
haproxy -f "$WORK/haproxy.cfg" -db > "$WORK/haproxy.log" 2>&1 & pids+=($!)

wait_port() {
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "error: port $1 never opened; logs in $WORK" >&2; exit 1
}
for p in "$REDIS_PORT" "$O1_PORT" "$O2_PORT" "${GW_PORTS[@]}" "${ADMIN_PORTS[@]}" "$LB_PORT"; do wait_port "$p"; done

{
  echo "LB_PORT=$LB_PORT"; echo "REDIS_PORT=$REDIS_PORT"
  echo "GW_PORTS=\"${GW_PORTS[*]}\""; echo "ADMIN_PORTS=\"${ADMIN_PORTS[*]}\""
} > "$WORK/ports.env"
cat <<TXT
cluster ready: HAProxy on 127.0.0.1:$LB_PORT -> gateways ${GW_PORTS[*]} (admin ${ADMIN_PORTS[*]})
  -> orders-api $O1_PORT, $O2_PORT; Redis $REDIS_PORT. Logs and configs in $WORK.

  curl -i -H 'X-Api-Key: demo-cluster-key-0001' http://127.0.0.1:$LB_PORT/orders
  for i in \$(seq 35); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Api-Key: demo-cluster-key-0001' http://127.0.0.1:$LB_PORT/orders; done; echo
                     # 30 per minute for the client, counted once across the three replicas
  curl -s http://127.0.0.1:${ADMIN_PORTS[0]}/metrics | grep turnstile_requests_total

Ctrl-C stops everything.
TXT
wait
