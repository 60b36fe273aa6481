#!/usr/bin/env bash
# What identifying a caller costs the whole gateway (`make bench-identity`): wrk -t1
# -c$CONNS through turnstile (1 worker thread, memory store, one plan limit far from
# reached) to an nginx origin, each request carrying
#   key          an API key (X-Api-Key)
#   jwt-cached   an RS256 bearer token, remembered after its first request
#   rs256        the same token with the cache off (max_cached_tokens = 0): verified every time
#   eddsa        an EdDSA token with the cache off
# next to `none` (no auth, no limit: the gateway's pass-through) in the same run, alternated over $ROUNDS rounds of $DURATION s. Tokens are signed here by
# openssl (RS256: PKCS#1 v1.5 over SHA-256; EdDSA: raw Ed25519); the gateway reads the public
# keys from PEM files. Reported: median req/s and median CPU time (user + system) per request.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
for tool in nginx wrk openssl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
cargo build --release --bins --quiet
WORK=$(mktemp -d /tmp/turnstile-identity.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

b64() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/rsa.pem" 2>/dev/null
openssl pkey -in "$WORK/rsa.pem" -pubout -out "$WORK/rsa.pub"
openssl genpkey -algorithm ed25519 -out "$WORK/ed.pem"
openssl pkey -in "$WORK/ed.pem" -pubout -out "$WORK/ed.pub"
payload=$(printf '{"iss":"bench","aud":"api","sub":"user-42","exp":%s,"scope":"orders:read"}' $(($(date +%s) + 86400)) | b64)
h=$(printf '{"alg":"RS256","typ":"JWT"}' | b64)
RS256="$h.$payload.$(printf '%s.%s' "$h" "$payload" | openssl dgst -sha256 -sign "$WORK/rsa.pem" -binary | b64)"
h=$(printf '{"alg":"EdDSA","typ":"JWT"}' | b64)
printf '%s.%s' "$h" "$payload" > "$WORK/ed.msg"
EDDSA="$h.$payload.$(openssl pkeyutl -sign -inkey "$WORK/ed.pem" -rawin -in "$WORK/ed.msg" | b64)"

ORIGIN=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
wait_port "$ORIGIN"

declare -A PORTS PIDS
start() { # name server-extra auth alg key-file
  local p a; p=$(port); a=$(port)
  cat > "$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
threads = 1
pid_file = "$WORK/$1.pid"
upgrade_sock = "$WORK/$1.sock"
$2
[admin]
listen = "127.0.0.1:$a"
[upstreams.o]
servers = ["127.0.0.1:$ORIGIN"]
[plans.p]
limits = [{ name = "l", algorithm = "sliding_window", limit = 100000000, window = "1h" }]
[[clients]]
id = "bench"
plan = "p"
api_keys = ["bench-api-key-0123456789"]
[issuers.i]
issuer = "bench"
audiences = ["api"]
keys = { file = "$5" }
algorithms = ["$4"]
plan = "p"
[[routes]]
name = "r"
path_prefix = "/"
upstream = "o"
auth = "$3"
TOML
  RUST_LOG=warn target/release/turnstile --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  PIDS[$1]=$!
  (wait_port "$p") || { cat "$WORK/$1.log" >&2; exit 1; }
  PORTS[$1]=$p
}
start none "" none RS256 "$WORK/rsa.pub"
start key "" api_key RS256 "$WORK/rsa.pub"
start jwt-cached "" jwt RS256 "$WORK/rsa.pub"
start rs256 "max_cached_tokens = 0" jwt RS256 "$WORK/rsa.pub"
start eddsa "max_cached_tokens = 0" jwt EdDSA "$WORK/ed.pub"
declare -A HEADER=(
  [none]="Accept: */*"
  [key]="X-Api-Key: bench-api-key-0123456789"
  [jwt-cached]="Authorization: Bearer $RS256"
  [rs256]="Authorization: Bearer $RS256"
  [eddsa]="Authorization: Bearer $EDDSA"
)
targets=(none key jwt-cached rs256 eddsa)
for t in "${targets[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "${HEADER[$t]}" "http://127.0.0.1:${PORTS[$t]}/")
  [ "$code" = 200 ] || { echo "$t answers $code" >&2; cat "$WORK/$t.log" >&2; exit 1; }
done

declare -A RPS CPU
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    read -r rps us < <(cpu_round "${PIDS[$t]}" "${PORTS[$t]}" "$t" "${HEADER[$t]}")
    [ -n "${us:-}" ] || exit 1
    RPS[$t]="${RPS[$t]:-} $rps"; CPU[$t]="${CPU[$t]:-} $us"
    echo "round $round $t $rps req/s, $us µs CPU/request" >&2
  done
done
echo "| credential | req/s (median of $ROUNDS) | CPU µs / request (median) | rounds (req/s) |"
echo "| --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  echo "| $t | $(echo "${RPS[$t]}" | median) | $(echo "${CPU[$t]}" | median) | ${RPS[$t]} |"
done
