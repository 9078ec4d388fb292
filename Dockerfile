# syntax=docker/dockerfile:1
#
# checkov:skip=CKV_DOCKER_2:No HEALTHCHECK: the distroless image has no shell or HTTP client and gap-healer has no health-probe subcommand; Kubernetes probes /healthz and /readyz (Docker HEALTHCHECK is ignored there).
#
# gap-healer container image.
#   docker build -t gap-healer:0.1.0 .
# Build stage: the official Rust image (pinned); run stage: distroless cc
# (glibc + libgcc, no shell, no package manager), user 65532 (nonroot).
# TLS is rustls/ring, so no OpenSSL is needed at build or run time.

FROM rust:1.95-bookworm AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0

# 1) Dependencies only: this layer is rebuilt only when Cargo.toml/Cargo.lock
#    change. Empty stand-in sources let cargo compile every dependency.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src target/release/.fingerprint/gap-healer-* target/release/deps/gap_healer-* \
           target/release/deps/libgap_healer-* target/release/gap-healer target/release/gap-healer.d

# 2) The crate itself.
COPY . .
RUN cargo build --release --locked --bin gap-healer \
 && install -D -m 0755 target/release/gap-healer /out/gap-healer \
 && /out/gap-healer --help > /dev/null

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gap-healer" \
      org.opencontainers.image.description="Fills holes in the GlobalPosition of an Eventuous event store with tombstones so all-stream subscriptions stop stalling" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/gap-healer/gap-healer" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"

COPY --from=build /out/gap-healer /usr/local/bin/gap-healer

# Numeric user and group: runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
# /metrics, /healthz, /readyz
EXPOSE 9477
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/gap-healer"]
CMD ["run"]
