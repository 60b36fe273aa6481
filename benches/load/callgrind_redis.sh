# A private redis-server under callgrind, for the scripts that count Redis's instructions per
# call (redis_count.sh, redis_packed.sh, redis_native.sh). Sourced after lib.sh: it checks the
# tools, starts the server (with the array REDIS_ARGS added to its arguments, when the sourcing
# script sets it) in a new $work directory (removed, and the server shut down, on exit) and
# defines
#   cli ARGS...    redis-cli to it
#   count FILE     the instructions Redis ran for FILE's calls (one per line, as redis-cli
#                  reads them), from counters zeroed before and dumped after; a call that
#                  failed stops the script
#   count_pools    for redis_packed.sh and redis_native.sh: each row of ROWS ("FORM LIMITS")
#                  a pool of clients (its seed), every pool's keys written first by
#                  BATCHES=3 × CLIENTS/64 of the script's `calls FORM LIMITS SEED PASS`, then
#                  ROUNDS rounds of `calls … ROUND` counted: the instructions per decision of
#                  each round, in the array `seen` by row
for tool in valgrind callgrind_control redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (make deps; apt install valgrind)" >&2; exit 1; }
done

work=$(mktemp -d)
rport=$(port)
cli() { redis-cli -p "$rport" "$@"; }
trap 'cli shutdown nosave >/dev/null 2>&1 || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" redis-server --port "$rport" \
  --save "" --appendonly no ${REDIS_ARGS[@]+"${REDIS_ARGS[@]}"} > "$work/valgrind.log" 2>&1 &
vg=$!
for _ in $(seq 600); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done
cli ping >/dev/null

count() { # file
  local dumps dump
  callgrind_control -z "$vg" >/dev/null 2>&1
  cli < "$1" > "$work/replies"
  if grep -q '^ERR\|^E \|^(error)' "$work/replies"; then
    echo "a call failed: $(grep -m1 '^ERR\|^E \|^(error)' "$work/replies")" >&2
    exit 1
  fi
  dumps=$(ls "$work" | grep -c '^cg.out\.' || true)
  callgrind_control -d "$vg" >/dev/null 2>&1
  for _ in $(seq 100); do
    (( $(ls "$work" | grep -c '^cg.out\.' || true) > dumps )) && break
    sleep 0.1
  done
  dump=$(ls -t "$work"/cg.out.* | head -1)
  grep -m1 -E '^(summary|totals):' "$dump" | awk '{print $2}'
}

count_pools() {
  local r form limits seed round total
  declare -gA seen
  seed=0
  for r in "${ROWS[@]}"; do # every pool's keys written: the counted decisions read state
    read -r form limits <<<"$r"
    seed=$((seed + 1))
    BATCHES=$(( (CLIENTS + 63) / 64 * 3 )) calls "$form" "$limits" "$seed" warm > "$work/warm"
    count "$work/warm" >/dev/null
  done
  for round in $(seq "$ROUNDS"); do
    seed=0
    for r in "${ROWS[@]}"; do
      read -r form limits <<<"$r"
      seed=$((seed + 1))
      calls "$form" "$limits" "$seed" "$round" > "$work/calls"
      total=$(count "$work/calls")
      seen[$r]+=" $((total / (BATCHES * 64)))"
    done
  done
}
