# Helpers shared by the load scripts (sourced, not run): free ports, waiting for a listener,
# CPU time of processes, medians, the nginx origin every script proxies to.

# A free TCP port on loopback.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits (up to 10 s) until something listens on 127.0.0.1:$1.
wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

# User + system clock ticks spent so far by the processes listed in $1.
cpu_ticks() { local s=0 pid; for pid in $1; do s=$((s + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done; echo $s; }

# The median of the numbers on stdin (space or newline separated; the mean of the middle
# two for an even count).
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# origin_conf DIR PORT: an nginx config (1 worker) answering 200 "ok" on PORT, pid and error
# log in DIR; prints the config's path.
origin_conf() {
  cat > "$1/origin.conf" <<NGX
worker_processes 1; daemon off; pid $1/origin.pid; error_log $1/origin.err;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$2; keepalive_requests 1000000; location / { return 200 "ok\n"; } } }
NGX
  echo "$1/origin.conf"
}

# cpu_round PID PORT NAME [HEADER...]: one wrk -t1 -c$CONNS run of $DURATION s against port PORT
# with those headers; prints "req/s CPU-µs-per-request" of the processes PID (user + system).
# Exits when an answer was not 2xx (NAME says which target).
cpu_round() {
  local pid=$1 port=$2 name=$3 before after out rps total non2xx h
  shift 3
  local headers=()
  for h in "$@"; do headers+=(-H "$h"); done
  before=$(cpu_ticks "$pid")
  out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" "${headers[@]}" "http://127.0.0.1:$port/")
  after=$(cpu_ticks "$pid")
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  total=$(echo "$out" | awk '/requests in/ {print $1}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  [ -z "$non2xx" ] || { echo "$name: $non2xx answers were not 2xx" >&2; exit 1; }
  echo "$rps $(awk -v t=$((after - before)) -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')"
}

# oha_ms PERCENT: the latency oha's report (on stdin) gives at PERCENT ("99.00%"), in ms. oha
# prints "99.00% in 0.4583 ms" (unit: secs, ms or µs depending on magnitude).
oha_ms() {
  awk -v p="$1" '$1 == p && $2 == "in" {
    v = $3; if ($4 == "secs") v *= 1000; else if ($4 != "ms") v /= 1000; printf "%.3f", v }'
}

# bench_start NAME TOOL...: what every load script begins with — exits naming a missing
# tool; builds this tree's release binaries unless BIN names one (BIN is then the gateway's
# path); makes WORK (a temporary folder) and `pids` (processes to stop), both cleaned up on
# exit. Call it from the repository's root.
bench_start() {
  local name=$1 tool
  shift
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
  done
  [ -n "${BIN:-}" ] || cargo build --release --bins --quiet
  BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/turnstile}
  WORK=$(mktemp -d "/tmp/turnstile-$name.XXXXXX")
  pids=()
  trap bench_cleanup EXIT INT TERM
}
bench_cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }

# The source of one script: its files (a `NAME_FILES` list of sources.rs — the directory's own
# when it holds one), concatenated, from lua/ or the directory $2.
source_of() {
  local list=src/limit/store/redis/sources.rs
  if [[ -f ${2:-lua}/sources.rs ]]; then list=${2:-lua}/sources.rs; fi
  # From the list's first line to its closing bracket (on that same line for a short list).
  sed -n "/[^A-Z_]$1 = \[/{:a;/\]/!{N;ba};p}" "$list" | grep -o '"[a-z_]*\.lua"' |
    tr -d '"' | while read -r f; do cat "${2:-lua}/$f"; echo; done
}

# redis_conf DIR PORT REDIS ORIGIN [STORE-LINES]: a gateway's configuration on PORT ($THREADS
# worker threads, default 1; files in DIR) in front of the origin on port ORIGIN, with the
# Redis on port REDIS as its store (STORE-LINES added to [store]), one API-key client
# (X-Api-Key: bench-api-key-0123456789) whose plan is one token bucket far above any load,
# and the route redis1 (/redis1) limited by it. Tables may be appended after it.
redis_conf() {
  cat <<TOML
[server]
listen = "127.0.0.1:$2"
threads = ${THREADS:-1}
key_hash_secret = "bench-key-hash-secret-0123456789"
pid_file = "$1/gw.pid"
upgrade_sock = "$1/gw.sock"
[store]
kind = "redis"
url = "redis://127.0.0.1:$3"
timeout = "2s"
${5:-}
[upstreams.o]
servers = ["127.0.0.1:$4"]
[plans.p]
limits = [{ name = "per-s", algorithm = "token_bucket", limit = 1000000, window = "1s" }]
[[clients]]
id = "bench"
plan = "p"
api_keys = ["bench-api-key-0123456789"]
[[routes]]
name = "redis1"
path_prefix = "/redis1"
upstream = "o"
auth = "api_key"
TOML
}

# floor_binary: builds benches/floor.rs (bare pingora-proxy and pingora-core, bench-only) and
# prints its path.
floor_binary() {
  local bin
  bin=$(cargo bench --bench floor --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "floor" and m.get("executable"):
        print(m["executable"])')
  [ -x "$bin" ] || { echo "could not build benches/floor.rs" >&2; exit 1; }
  echo "$bin"
}

# wait_started NAME PID PORT LOG: until PORT answers /pass, or the process PID is gone (then
# LOG's tail and exit).
wait_started() {
  for _ in $(seq 240); do
    curl -s -o /dev/null "http://127.0.0.1:$3/pass" && return 0
    kill -0 "$2" 2>/dev/null || { echo "$1 did not start:" >&2; tail -20 "$4" >&2; exit 1; }
    sleep 0.5
  done
}
