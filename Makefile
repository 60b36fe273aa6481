# turnstile — everyday commands. `make demo` and `make test` work on a fresh Debian/Ubuntu
# machine with Rust: they install cmake / redis-server first when missing.

CARGO ?= cargo

.PHONY: all deps build demo test lint fmt bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --bins

demo: build
	@scripts/demo.sh

test: deps
	$(CARGO) test --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

bench: deps
	$(CARGO) bench

clean:
	$(CARGO) clean
