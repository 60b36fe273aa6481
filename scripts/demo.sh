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

for port in 9001 9002; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "error: port $port is already in use; stop whatever listens there first" >&2
    exit 1
  fi
done

"$BIN/orders-api" --port 9001 --name orders-1 & pids+=($!)
"$BIN/orders-api" --port 9002 --name orders-2 & pids+=($!)
"$BIN/turnstile" check "$CONF"
"$BIN/turnstile" --config "$CONF" & pids+=($!)

for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break
  sleep 0.1
done

cat <<'TXT'

turnstile is listening on http://127.0.0.1:8080 (config: conf/demo.toml). Try:

  curl -i http://127.0.0.1:8080/orders            # round robin: watch X-Upstream-Name
  curl -i http://127.0.0.1:8080/orders/42
  curl -i -X POST http://127.0.0.1:8080/orders -H 'content-type: application/json' -d '{"item":"widget"}'
  curl -i http://127.0.0.1:8080/nope              # 404 problem+json
  curl -i 'http://127.0.0.1:8080/orders?delay_ms=6000'   # slower than read_timeout: 504

Ctrl-C stops everything.
TXT
wait
