#!/usr/bin/env bash
# Builds benches/native_probe (a Redis module; not the product) into target/native_probe and
# prints the library's path, for redis_native.sh and redis_core.sh (NATIVE_PROBE=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1; then
  echo "the native probe's build needs libclang (apt install libclang-dev)" >&2
  exit 1
fi
CARGO_TARGET_DIR=target/native_probe cargo build --quiet --release --locked \
  --manifest-path benches/native_probe/Cargo.toml >&2
echo "$PWD/target/native_probe/release/libnative_probe.so"
