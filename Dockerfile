# Multi-stage build of turnstile and the demo orders-api.
#   docker build -t turnstile .
# Builder: Rust with cmake (Pingora's build needs it). Runtime: Debian slim, a non-root user,
# curl for container health checks, nothing else.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin benches \
 && echo 'fn main() {}' > src/main.rs && echo 'fn main() {}' > src/bin/orders-api.rs \
 && touch src/lib.rs benches/core.rs benches/limits.rs benches/redis.rs \
 && cargo build --release --locked --bins || true
COPY src src
COPY lua lua
COPY benches benches
RUN touch src/main.rs src/lib.rs src/bin/orders-api.rs \
 && cargo build --release --locked --bins

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home turnstile
COPY --from=build /src/target/release/turnstile /src/target/release/orders-api /usr/local/bin/
COPY conf /etc/turnstile/examples
USER turnstile
EXPOSE 8080 9090
CMD ["turnstile", "--config", "/etc/turnstile/turnstile.toml"]
