#!/usr/bin/env bash
# What tracing costs the whole gateway (`make bench-tracing`): wrk -t1 -c$CONNS against an
# nginx origin through turnstile (1 worker thread, no limits) as
#   before   a build without tracing code (BEFORE=path/to/turnstile; optional)
#   off      this build, no [tracing] table
#   ratio0   tracing on, sample_ratio = 0 (context read, ids made, traceparent sent upstream)
#   ratio1   tracing on, every request sampled, spans exported to a local OTLP sink
#            (benches/load/otlp_sink.py) — what the sink does not take is dropped and counted
# alternated over $ROUNDS rounds of $DURATION s; the median req/s is reported.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-50}
for tool in nginx wrk python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
cargo build --release --bins --quiet
WORK=$(mktemp -d /tmp/turnstile-tracing.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=benches/load/lib.sh
. benches/load/lib.sh

ORIGIN=$(port); SINK=$(port)
nginx -c "$(origin_conf "$WORK" "$ORIGIN")" & pids+=($!)
python3 benches/load/otlp_sink.py "$SINK" & pids+=($!)
wait_port "$ORIGIN"; wait_port "$SINK"

declare -A PORTS
start() { # name binary tracing-table
  local p a; p=$(port); a=$(port)
  printf '[server]\nlisten = "127.0.0.1:%s"\nthreads = 1\npid_file = "%s/%s.pid"\nupgrade_sock = "%s/%s.sock"\n[admin]\nlisten = "127.0.0.1:%s"\n%s\n[upstreams.o]\nservers = ["127.0.0.1:%s"]\n[[routes]]\nname = "r"\npath_prefix = "/"\nupstream = "o"\n' \
    "$p" "$WORK" "$1" "$WORK" "$1" "$a" "$3" "$ORIGIN" > "$WORK/$1.toml"
  RUST_LOG=warn "$2" --config "$WORK/$1.toml" > "$WORK/$1.log" 2>&1 & pids+=($!)
  wait_port "$p"; PORTS[$1]=$p
}
targets=()
if [ -n "${BEFORE:-}" ]; then start before "$BEFORE" ""; targets+=(before); fi
start off target/release/turnstile ""; targets+=(off)
start ratio0 target/release/turnstile "$(printf '[tracing]\nendpoint = "http://127.0.0.1:%s/v1/traces"\nsample_ratio = 0.0' "$SINK")"; targets+=(ratio0)
start ratio1 target/release/turnstile "$(printf '[tracing]\nendpoint = "http://127.0.0.1:%s/v1/traces"\nsample_ratio = 1.0' "$SINK")"; targets+=(ratio1)

declare -A RESULTS
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    rps=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:${PORTS[$t]}/" | awk '/Requests\/sec/ {print $2}')
    RESULTS[$t]="${RESULTS[$t]:-} $rps"
    echo "round $round $t $rps" >&2
  done
done
echo "| build | req/s (median of $ROUNDS) | all rounds |"
echo "| --- | --- | --- |"
for t in "${targets[@]}"; do
  median=$(echo "${RESULTS[$t]}" | tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "| $t | $median | ${RESULTS[$t]} |"
done
a=${PORTS[ratio1]}
echo "ratio1 spans: $(curl -s "http://127.0.0.1:$(grep -A1 '\[admin\]' "$WORK/ratio1.toml" | sed -n 's/.*:\([0-9]*\)".*/\1/p')/metrics" | grep turnstile_trace_spans_total | tr '\n' ' ')" >&2
