# Multi-stage build of turnstile and the demo orders-api.
#   docker build -t turnstile .
#   docker run -p 8080:8080 -p 9090:9090 turnstile            # the baked-in config
#   docker run -v $PWD/my.toml:/etc/turnstile/turnstile.toml:ro turnstile
# Builder: Rust with cmake (Pingora's build needs it). Runtime: Debian slim, a non-root user,
# curl for the health check, a default configuration (conf/container.toml), nothing else.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The commit --version names (no .git in the build context): pass it with
#   docker build --build-arg TURNSTILE_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG TURNSTILE_COMMIT=unknown
ENV TURNSTILE_COMMIT=$TURNSTILE_COMMIT
# Dependencies first, in a layer of their own, so that source edits do not rebuild them:
# every source file Cargo.toml names is stubbed (scripts/stub-sources.sh reads the manifest).
# tests/operations/container.rs runs these two lines as they are, in a temporary directory.
COPY Cargo.toml Cargo.lock build.rs ./
# The workspace's other member (the optional Redis module, not in the image): cargo reads its
# manifest to resolve the workspace; its library is stubbed too.
COPY module/Cargo.toml module/Cargo.toml
COPY scripts/stub-sources.sh scripts/stub-sources.sh
RUN sh scripts/stub-sources.sh && cargo build --release --locked --bins
COPY src src
COPY lua lua
COPY benches benches
RUN touch src/main.rs src/lib.rs src/bin/orders-api.rs build.rs \
 && cargo build --release --locked --bins

# The optional Redis module (module/; docs/operations.md): built in a stage of its own (the
# redis-module crate's bindgen needs libclang) and shipped in a Redis image that loads it —
# docker-compose.yml's Redis and deploy/kubernetes/redis.yaml use it:
#   docker build --target redis-module -t turnstile-redis .
# tests/image runs this stage's COPYs and cargo commands in a temporary directory, and
# starts redis-server with the image's command on what they built.
FROM rust:1-bookworm AS module
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY module/Cargo.toml module/Cargo.toml
COPY scripts/stub-sources.sh scripts/stub-sources.sh
RUN sh scripts/stub-sources.sh
COPY module/src module/src
RUN cargo build --release --locked -p turnstile-module

# A Redis that decides natively (the official image's user, data directory and entrypoint).
FROM redis:7-bookworm AS redis-module
COPY --from=module /src/target/release/libturnstile_module.so /usr/local/lib/redis/modules/libturnstile_module.so
CMD ["redis-server", "--loadmodule", "/usr/local/lib/redis/modules/libturnstile_module.so"]

# The gateway's image (the default target: the last stage).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home turnstile
COPY --from=build /src/target/release/turnstile /src/target/release/orders-api /usr/local/bin/
COPY conf /etc/turnstile/examples
COPY conf/container.toml /etc/turnstile/turnstile.toml
# Overridable at run time: the config path, and the listen addresses of the file. The admin
# listener (/metrics, /healthz, /readyz) is reachable from outside the container by default
# here, so Prometheus and the orchestrator can use it; protect it with an [admin] token.
ENV TURNSTILE_CONFIG=/etc/turnstile/turnstile.toml \
    TURNSTILE_ADMIN_LISTEN=0.0.0.0:9090
USER 10001:10001
EXPOSE 8080 9090
# Liveness: the process answers on the admin listener (readiness, /readyz, is the
# orchestrator's to probe: it also says whether the upstreams are healthy).
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
  CMD ["curl", "-fsS", "http://127.0.0.1:9090/healthz"]
CMD ["turnstile"]
