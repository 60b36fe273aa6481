#!/bin/sh
# Stubs every source file Cargo.toml names (the library, each [[bin]] path, each [[bench]]),
# so that the container build can compile the dependencies in a layer of their own, before
# the sources are copied (Dockerfile). Derived from Cargo.toml itself: a new target cannot be
# forgotten here. tests/operations/container.rs runs it, and the same cargo command, in a
# temporary directory.
set -eu
mkdir -p src
: > src/lib.rs
awk '
  /^\[\[bin\]\]/   { section = "bin"; next }
  /^\[\[bench\]\]/ { section = "bench"; next }
  /^\[/            { section = ""; next }
  section == "bin"   && /^path *=/ { gsub(/.*= *"|".*/, ""); print "main " $0 }
  section == "bench" && /^name *=/ { gsub(/.*= *"|".*/, ""); print "main benches/" $0 ".rs" }
' Cargo.toml | while read -r kind path; do
  mkdir -p "$(dirname "$path")"
  echo 'fn main() {}' > "$path"
done
# The workspace's other members ([workspace] members: module/, the Redis module): cargo reads
# their manifests to resolve the workspace; each gets an empty library.
awk '/^members *=/ { gsub(/.*\[|\].*|"| /, ""); n = split($0, m, ","); for (i = 1; i <= n; i++) print m[i] }' Cargo.toml |
  while read -r member; do
    mkdir -p "$member/src"
    : > "$member/src/lib.rs"
  done
