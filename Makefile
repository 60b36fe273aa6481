# turnstile — everyday commands. `make demo` and `make test` work on a fresh Debian/Ubuntu
# machine with Rust: they install cmake / redis-server first when missing.

CARGO ?= cargo

.PHONY: all deps deps-demo build release demo cluster-demo test test-repeat lint fmt bench bench-load bench-floor bench-overload bench-tracing bench-tls bench-identity bench-shaping bench-resilience bench-redis-core bench-cluster-batching bench-redis-native bench-modes bench-console bench-console-count bench-count fuzz module clean

all: build

# What the tests (and benches) need; deps-demo: only what building and the demo need.
deps:
	@scripts/install-deps.sh test

deps-demo:
	@scripts/install-deps.sh demo

build: deps-demo
	$(CARGO) build --release --bins

demo: build
	@scripts/demo.sh

# The release binary as an archive with the docs, and SHA256SUMS, in dist/ (nothing published).
release: deps-demo
	@scripts/release.sh

# The docker-compose topology without Docker: Redis, 2 orders-api, 3 gateways, HAProxy.
cluster-demo: build
	@scripts/cluster.sh

# The optional Redis module (module/): target/release/libturnstile_module.so, for
# `loadmodule` (docs/operations.md). Its unit tests run with `make test`, and the limits
# suite loads it into the Redis servers it starts.
module: deps-module
	$(CARGO) build --release --locked -p turnstile-module

deps-module:
	@scripts/install-deps.sh module

# --no-fail-fast: one run lists every failing test, not only those of the first failing file.
# Then the module's own tests, and the limits suite once more with the module loaded into
# every Redis the tests start (TURNSTILE_TEST_MODULE): both paths pass the same tests.
test: deps module
	$(CARGO) test --all-targets --no-fail-fast
	$(CARGO) test --locked -p turnstile-module
	TURNSTILE_TEST_MODULE=1 $(CARGO) test --test limits --no-fail-fast

# The suite RUNS times, every other run with all CPUs kept busy by stress-ng; lists each
# failing test with the runs it failed in (flakiness hunting: CONTENTION=none|cpu|alternate).
RUNS ?= 5
CONTENTION ?= alternate
test-repeat: deps
	@scripts/test-repeat.sh $(RUNS) $(CONTENTION)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

bench-load: deps
	benches/load/run.sh

# The floor under turnstile: CPU per request of nginx, a pingora-core loop, bare
# pingora-proxy and turnstile pass-through, with perf profiles (benches/floor.rs).
bench-floor: deps
	benches/load/floor.sh

# The gateway's own CPU per request in each mode (pass-through, per-IP, API key, bearer token,
# one / four Redis limits, plan + keyed), next to pass-through; THREADS=2 for two workers.
bench-modes: deps
	benches/load/modes.sh

# The request path counted in instructions (callgrind): pass-through, one and four Redis
# limits, plan + keyed, beside the floor (bare pingora-proxy, the same adding the forwarding
# headers, and that with one EVALSHA through the redis crate); BEFORE=<older binary>
# alternates it with this tree's, the way to show a change costs nothing on a noisy machine.
bench-count: deps
	benches/load/count.sh

# What the operator console costs the request path: the same gateway with nobody looking and
# with the console's calls every 2 s, alternated in one run.
bench-console: deps
	benches/load/console.sh

# The same, counted in instructions (callgrind): what recording a refusal, publishing the
# summaries and a console tick cost.
bench-console-count: deps
	benches/load/console_count.sh

# Overload experiment: goodput and the critical class's p99 with and without load shedding
# (needs oha: cargo install oha). Writes benches/overload/{results.json,overload.svg}.
bench-overload: deps
	benches/overload/run.sh

# What tracing costs the whole gateway (off / on unsampled / on sampled); BEFORE=path to a
# build without tracing adds it to the run.
bench-tracing: deps
	benches/load/tracing.sh

# What identifying a caller costs the whole gateway: API key, cached token, RS256 and EdDSA
# verified per request (same run).
bench-identity: deps
	benches/load/identity.sh

# What a request held by a leaky bucket and one charged from its response cost, next to a
# plain Redis-limited one (needs h2load: apt install nghttp2-client); and the shape of a burst.
bench-shaping: deps
	benches/load/shaping.sh

# What retries, outlier ejection and least-request balancing cost a request that succeeds:
# the same two nginx servers behind a plain route and resilient ones (same run, ratios).
bench-resilience: deps
	benches/load/resilience.sh

# Decisions one Redis core sustains per kind of plan (turnstile's scripts under
# redis-benchmark, Redis and the load pinned to their own CPUs).
bench-redis-core: deps
	benches/load/redis_core.sh

# Batching on a 3-master Redis Cluster with many clients: batch_max = 64 against 1, same run.
bench-cluster-batching: deps
	benches/load/cluster_batching.sh

# Redis's instructions per decision, Lua (lua/batch.lua) against the same decisions in native
# code (benches/native_probe: a Redis module probe, not the product; needs libclang-dev).
bench-redis-native: deps
	benches/load/redis_native.sh

# TLS handshakes/s and HTTP/2 requests/s next to nginx, same certificate.
bench-tls: deps
	benches/load/tls.sh

bench: deps
	$(CARGO) bench

# Runs each libFuzzer target for FUZZ_SECONDS (needs `cargo install cargo-fuzz`; the stable
# toolchain is allowed the nightly flags cargo-fuzz uses). The committed seeds in
# fuzz/corpus/<target>/ are read; new inputs go to fuzz/work/ (not committed) and crashers to
# fuzz/artifacts/: copy a crasher into fuzz/corpus/<target>/ once fixed — `make test` replays
# that directory.
FUZZ_SECONDS ?= 60
fuzz:
	@command -v cargo-fuzz >/dev/null || { echo "install cargo-fuzz first: cargo install cargo-fuzz"; exit 1; }
	cd fuzz && for t in config client_ip api_key headers request_path body_fields one_reading module_args; do \
		mkdir -p work/$$t && RUSTC_BOOTSTRAP=1 cargo fuzz run -O $$t work/$$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -max_len=4096 || exit 1; \
	done

clean:
	$(CARGO) clean
