#!/usr/bin/env bash
# `make release`: the release binary, packaged with the docs an operator needs, and checksums.
# Publishes nothing. Writes into ${OUT:-dist}/:
#   turnstile-<version>-<target>.tar.gz   turnstile, README.md, CHANGELOG.md, docs/, conf/gateway.toml
#   turnstile-<version>-<target>          the bare binary (debug info stripped)
#   SHA256SUMS                            of the archive and of the bare binary
# TURNSTILE_BIN=path packages that binary instead of building one (the test uses it).
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
target=$(rustc -vV | sed -n 's/^host: //p')
out=${OUT:-dist}
bin=${TURNSTILE_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --locked --bin turnstile
  bin=target/release/turnstile
fi

# The binary must be the version it is packaged as.
reported=$("$bin" --version)
case "$reported" in
  "turnstile $version "*) ;;
  *) echo "error: $bin reports \"$reported\", not version $version" >&2; exit 1 ;;
esac

name="turnstile-$version-$target"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/conf" "$out"
# Debug info off the shipped binary (symbols stay, so panics still name their functions):
# about 80 → 17 MB. The line tables stay in target/release for profiling.
cp "$bin" "$stage/$name/turnstile"
strip --strip-debug "$stage/$name/turnstile"
cp README.md CHANGELOG.md "$stage/$name/"
cp -r docs "$stage/$name/docs"
cp conf/gateway.toml "$stage/$name/conf/"
# Reproducible archive: sorted names, fixed owner and time.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='@0' \
  -C "$stage" -czf "$out/$name.tar.gz" "$name"
cp "$stage/$name/turnstile" "$out/turnstile-$version-$target"
(cd "$out" && sha256sum "$name.tar.gz" "turnstile-$version-$target" > SHA256SUMS)
echo "$reported"
echo "wrote $out/$name.tar.gz, $out/turnstile-$version-$target and $out/SHA256SUMS"
