#!/usr/bin/env bash
# `make demo`: two orders-api instances behind the gateway (conf/demo.toml), until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
CONF=${CONF:-conf/demo.toml}

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping demo"
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

# The gateway (8080), its admin listener (9090) and the two upstreams (9001, 9002).
for port in 8080 9090 9001 9002; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "error: port $port is already in use; stop whatever listens there first" >&2
    exit 1
  fi
done

"$BIN/orders-api" --port 9001 --name orders-1 & pids+=($!)
"$BIN/orders-api" --port 9002 --name orders-2 & pids+=($!)
"$BIN/turnstile" check "$CONF"
"$BIN/turnstile" --config "$CONF" & gw=$!; pids+=($gw)

# Ready when this gateway answers (the ports were free before it started), and not while
# the process is gone.
ready=
for _ in $(seq 100); do
  if ! kill -0 "$gw" 2>/dev/null; then
    echo "error: turnstile exited at start (see its output above)" >&2
    exit 1
  fi
  if curl -fsS -o /dev/null -H 'Authorization: Bearer demo-admin-token-0001' http://127.0.0.1:9090/healthz 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[ -n "$ready" ] || { echo "error: turnstile did not become ready" >&2; exit 1; }

cat <<'TXT'

turnstile is listening on http://127.0.0.1:8080 (config: conf/demo.toml). Try:

  curl -i http://127.0.0.1:8080/healthz                                   # public, per-IP limit only
  curl -i http://127.0.0.1:8080/orders                                    # 401: no API key
  curl -i -H 'X-Api-Key: alice-demo-key-0001' http://127.0.0.1:8080/orders/42
  for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Api-Key: alice-demo-key-0001' http://127.0.0.1:8080/orders; done; echo
                                                                          # burst of 4, then 429 with Retry-After
  curl -i -H 'Authorization: Bearer partner-demo-key-0001' http://127.0.0.1:8080/orders   # another client, its own quota
  curl -i -X POST -H 'X-Api-Key: partner-demo-key-0001' -H 'content-type: application/json' \
       -d '{"item":"widget"}' http://127.0.0.1:8080/orders               # 202 from the upstream
  curl -i -H 'X-Api-Key: partner-demo-key-0001' 'http://127.0.0.1:8080/orders?delay_ms=6000'   # 504

Watch X-Upstream-Name alternate (round robin) and the RateLimit headers count down.
Ctrl-C stops everything.
TXT
wait
