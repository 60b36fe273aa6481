#!/usr/bin/env bash
# TLS and HTTP/2 next to nginx (`make bench-tls`), same certificate (ECDSA P-256), same
# origin (nginx, return 200), 1 worker each, targets alternated over $ROUNDS rounds:
#   handshakes/s   wrk -t1 -c$CONNS -H 'Connection: close' over https: every request a new
#                  connection and a full TLS handshake (wrk does not resume sessions)
#   h2 req/s       h2load -c$CONNS -m$STREAMS over TLS with ALPN h2, $H2_REQUESTS requests
# Prints a markdown table (medians).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
STREAMS=${STREAMS:-10}
H2_REQUESTS=${H2_REQUESTS:-100000}
for tool in nginx wrk h2load openssl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt install nginx wrk nghttp2-client openssl)" >&2; exit 1; }
done
cargo build --release --bins --quiet
WORK=$(mktemp -d /tmp/turnstile-tls.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
ORIGIN=$(port); NGX=$(port); TS=$(port); TS_PLAIN=$(port); TS_ADMIN=$(port)
cat > "$WORK/nginx.conf" <<NGX
worker_processes 1; daemon off; pid $WORK/nginx.pid; error_log $WORK/nginx.err;
events { worker_connections 4096; }
http { access_log off;
  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 64; }
  server { listen 127.0.0.1:$ORIGIN; keepalive_requests 1000000; location / { return 200 "ok\n"; } }
  server { listen 127.0.0.1:$NGX ssl http2; keepalive_requests 1000000;
    ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache off; ssl_session_tickets off;
    location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
NGX
nginx -c "$WORK/nginx.conf" & pids+=($!)
cat > "$WORK/turnstile.toml" <<TOML
[server]
listen = "127.0.0.1:$TS_PLAIN"
threads = 1
pid_file = "$WORK/ts.pid"
upgrade_sock = "$WORK/ts.sock"
[server.tls]
listen = "127.0.0.1:$TS"
[[server.tls.certificates]]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
[admin]
listen = "127.0.0.1:$TS_ADMIN"
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[[routes]]
name = "r"
path_prefix = "/"
upstream = "o"
TOML
RUST_LOG=warn target/release/turnstile --config "$WORK/turnstile.toml" > "$WORK/ts.log" 2>&1 & pids+=($!)
wait_port "$NGX"; wait_port "$TS"

declare -A HS H2
for round in $(seq "$ROUNDS"); do
  for t in nginx:$NGX turnstile:$TS; do
    name=${t%%:*}; p=${t##*:}
    hs=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -H 'Connection: close' "https://127.0.0.1:$p/" | awk '/Requests\/sec/ {print $2}')
    h2=$(h2load -n"$H2_REQUESTS" -c"$CONNS" -m"$STREAMS" "https://127.0.0.1:$p/" 2>/dev/null | awk '/^finished in/ {gsub(",","",$4); print $4}')
    HS[$name]="${HS[$name]:-} $hs"; H2[$name]="${H2[$name]:-} $h2"
    echo "round $round $name handshakes/s $hs h2 req/s $h2" >&2
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| | TLS handshakes/s (new connection per request) | HTTP/2 req/s (h2load -c$CONNS -m$STREAMS) |"
echo "| --- | --- | --- |"
for name in nginx turnstile; do
  echo "| $name | $(echo "${HS[$name]}" | median) (${HS[$name]# }) | $(echo "${H2[$name]}" | median) (${H2[$name]# }) |"
done
