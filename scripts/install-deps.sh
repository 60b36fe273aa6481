#!/usr/bin/env bash
# Installs what this machine lacks for `scripts/install-deps.sh demo` (building and the demo:
# `make demo`, `make build`) or `test` (the default: everything `make test` and the benches
# use as well):
#   cmake        — Pingora's build and aws-lc's (the token verification backend) (demo)
#   curl         — the demo tour's client, the TLS and HTTP/2 tests' client (demo)
#   redis-server — the tests start their own Redis servers
#   redis-tools  — redis-cli, to create the test Redis Cluster
#   haproxy      — the load balancer of the cluster topology test (scripts/cluster.sh)
#   openssl      — the TLS tests' `openssl s_client`
#   python3      — the framework-reading test upstream (tests/upstreams/frameworks.py), and
#                  (python3-venv) the Kubernetes manifests' validator, from PyPI
#   chromium, chromium-driver — the operator console's test in a real browser (WebDriver)
#   firefox-esr (or firefox), and geckodriver from crates.io (cargo install, pinned) — the
#                  console's test in Firefox
#   stress-ng    — the startup test keeps the CPUs busy (an instance started under load)
#   libclang-dev — the Redis module's build (`module`, and `test`, which builds it): the
#                  redis-module crate generates its bindings with bindgen
# Uses apt-get when root (or via passwordless sudo); otherwise says what to install.
set -euo pipefail

set_=${1:-test}
case "$set_" in demo|test|module) ;; *) echo "usage: $0 [demo|test|module]" >&2; exit 2 ;; esac

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ "$set_" != demo ] && ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
if [ "$set_" = test ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
  command -v stress-ng >/dev/null 2>&1 || need+=(stress-ng)
  command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  # The Kubernetes manifests' test installs its validator into a virtual environment.
  python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
  if ! command -v firefox-esr >/dev/null 2>&1 && ! command -v firefox >/dev/null 2>&1; then
    # Debian packages Firefox ESR; elsewhere the package is `firefox`.
    if grep -qs '^ID=debian' /etc/os-release; then need+=(firefox-esr); else need+=(firefox); fi
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found: install Rust first (https://rustup.rs), then re-run." >&2
  exit 1
fi

# WebDriver for Firefox: not packaged by Debian; built from its crate (about 2 minutes).
if [ "$set_" = test ] && ! command -v geckodriver >/dev/null 2>&1; then
  echo "installing geckodriver 0.37.1 (cargo install)"
  cargo install --locked --quiet geckodriver --version 0.37.1
fi

[ ${#need[@]} -eq 0 ] && exit 0

echo "installing missing packages: ${need[*]}"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "error: missing packages: ${need[*]}" >&2
  echo "       install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: no apt-get here; install these packages with your package manager: ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
