# Thin for now (not built in CI: no Docker engine there). Multi-stage: build, then a small
# runtime image with a non-root user.
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bins

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 turnstile
COPY --from=build /src/target/release/turnstile /src/target/release/orders-api /usr/local/bin/
USER turnstile
EXPOSE 8080
CMD ["turnstile", "--config", "/etc/turnstile/turnstile.toml"]
