#!/usr/bin/env bash
# Runs the whole test suite RUNS times and reports every failing test of every run, so a
# flaky test shows up as such instead of passing by luck once.
#
#   scripts/test-repeat.sh [RUNS] [CONTENTION]
#
# CONTENTION: "none" (default), "cpu" (stress-ng keeps every CPU busy while the tests run) or
# "alternate" (odd runs under contention, even runs without). stress-ng is installed when
# missing (Debian package stress-ng). The output of each failing run is kept in
# target/test-repeat/run-N.log; the summary lists each failed test with the runs it failed in.
# Exit status: 0 when every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
contention=${2:-none}
case "$contention" in none | cpu | alternate) ;; *)
  echo "usage: $0 [RUNS] [none|cpu|alternate]" >&2
  exit 2
  ;;
esac

if [ "$contention" != none ] && ! command -v stress-ng >/dev/null 2>&1; then
  echo "installing stress-ng (for CPU contention)"
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
  else
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
  fi || {
    echo "error: stress-ng is missing and could not be installed" >&2
    exit 2
  }
fi

out=target/test-repeat
mkdir -p "$out"
rm -f "$out"/run-*.log "$out"/failures
# Build once, outside the measured runs, so the first run does not compete with the build.
cargo test --all-targets --no-run -q || exit 1

stress_pid=
stop_stress() {
  if [ -n "$stress_pid" ]; then
    kill "$stress_pid" 2>/dev/null
    wait "$stress_pid" 2>/dev/null
    stress_pid=
  fi
}
trap stop_stress EXIT

failed_runs=0
for run in $(seq 1 "$runs"); do
  loaded=no
  if [ "$contention" = cpu ] || { [ "$contention" = alternate ] && [ $((run % 2)) -eq 1 ]; }; then
    stress-ng --cpu "$(nproc)" --timeout 3600s >/dev/null 2>&1 &
    stress_pid=$!
    loaded=yes
  fi
  log="$out/run-$run.log"
  start=$(date +%s)
  if cargo test --all-targets >"$log" 2>&1; then
    echo "run $run/$runs (cpu contention: $loaded): ok ($(($(date +%s) - start)) s)"
    rm -f "$log"
  else
    failed_runs=$((failed_runs + 1))
    tests=$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u)
    [ -n "$tests" ] || tests="(no test failed: the build or a test binary broke; see $log)"
    echo "run $run/$runs (cpu contention: $loaded): FAILED ($(($(date +%s) - start)) s), output in $log"
    while IFS= read -r t; do
      echo "    $t"
      echo "$t	$run" >>"$out/failures"
    done <<<"$tests"
  fi
  stop_stress
done

echo
if [ "$failed_runs" -eq 0 ]; then
  echo "all $runs runs passed"
  exit 0
fi
echo "$failed_runs of $runs runs failed; failing tests (runs):"
sort "$out/failures" | awk -F'\t' '{ runs[$1] = runs[$1] (runs[$1] ? "," : "") $2 } END { for (t in runs) print "    " t " (" runs[t] ")" }'
exit 1
