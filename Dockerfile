# syntax=docker/dockerfile:1
#
# checkov:skip=CKV_DOCKER_2:No HEALTHCHECK: the distroless image has no shell or HTTP client and gap-healer has no health-probe subcommand; Kubernetes probes /healthz and /readyz (Docker HEALTHCHECK is ignored there).
#
# gap-healer container image. Built the same way by docker, podman and buildah
# (README.md, "Container image", has the build arguments):
#   docker build -t gap-healer:0.1.0 .      (or podman build, buildah build)
# Build stage: the official Rust image (pinned); run stage: distroless cc
# (glibc + libgcc, no shell, no package manager), user 65532 (nonroot).
# Both named in full (registry/repository:tag): podman and buildah refuse a
# short name where no unqualified-search registry is configured (Debian's
# default), and a full name never resolves to another registry's image.
# TLS is rustls/ring, so no OpenSSL is needed at build or run time.

# 0) The manifests alone: every Cargo.toml the build context holds (the root
#    package's and those of the workspace members .dockerignore lets in, such
#    as tests/kit/Cargo.toml) and Cargo.lock, at their paths. Nothing is named
#    here, so a member added to or dropped from the workspace needs only its
#    .dockerignore line; the dependency layer below is keyed on these files.
FROM docker.io/library/rust:1.95-bookworm AS manifests
WORKDIR /src
COPY . .
RUN find . -type f ! -name Cargo.toml ! -name Cargo.lock -delete \
 && find . -mindepth 1 -depth -type d -empty -delete

FROM docker.io/library/rust:1.95-bookworm AS build
# A failing command anywhere in a RUN's loops or pipes fails the build.
SHELL ["/bin/bash", "-eo", "pipefail", "-c"]
WORKDIR /src
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0

# 1) Dependencies only: rebuilt only when a manifest or Cargo.lock changes.
#    cargo reads every target of every workspace manifest (and every path
#    dependency's) even to build one binary, so each gets an empty stand-in:
#    the library (src/lib.rs or [lib] path), every [[bin]], [[bench]],
#    [[test]] and [[example]] (its path, else cargo's default one) and a
#    build script named in [package]. The root package's stand-ins (src/) go
#    before step 2; the others stay: benches/, tests/ and the members' sources
#    are not in the build context, and the binary does not need them.
COPY --from=manifests /src ./
RUN find . -name Cargo.toml | while read -r manifest; do \
      dir=$(dirname "$manifest"); \
      awk ' \
        function val(line) { sub(/^[^=]*=[ \t]*["\047]/, "", line); sub(/["\047].*$/, "", line); return line } \
        function flush() { \
          if (kind == "lib") { print "lib " (path != "" ? path : "src/lib.rs"); lib = 1 } \
          else if (kind == "bin") print "main " (path != "" ? path : (name == pkg ? "src/main.rs" : "src/bin/" name ".rs")); \
          else if (kind == "bench" || kind == "test" || kind == "example") \
            print "main " (path != "" ? path : (kind == "bench" ? "benches" : kind == "test" ? "tests" : "examples") "/" name ".rs"); \
          kind = ""; name = ""; path = "" } \
        /^[ \t]*\[/ { flush(); table = $0; gsub(/[][ \t]/, "", table); \
                      if (table == "lib" || table == "bin" || table == "bench" || table == "test" || table == "example") kind = table; \
                      next } \
        table == "package" && /^[ \t]*name[ \t]*=/ { pkg = val($0) } \
        table == "package" && /^[ \t]*build[ \t]*=[ \t]*["\047]/ { print "main " val($0) } \
        kind != "" && /^[ \t]*name[ \t]*=/ { name = val($0) } \
        kind != "" && /^[ \t]*path[ \t]*=/ { path = val($0) } \
        END { flush(); if (!lib) print "lib src/lib.rs" }' "$manifest" \
      | while read -r what target; do \
          mkdir -p "$dir/$(dirname "$target")"; \
          if [ "$what" = main ]; then echo 'fn main() {}' > "$dir/$target"; else : > "$dir/$target"; fi; \
        done; \
    done \
 && cargo build --release --locked \
 && rm -rf src target/release/.fingerprint/gap-healer-* target/release/deps/gap_healer-* \
           target/release/deps/libgap_healer-* target/release/gap-healer target/release/gap-healer.d

# 2) The crate itself. The revision reaches `gap-healer --version` through
#    build.rs (the build context has no .git); declared here, after the
#    dependency layer, so a new revision rebuilds only this step.
COPY . .
ARG REVISION=unknown
RUN GAP_HEALER_BUILD_COMMIT="$REVISION" cargo build --release --locked --bin gap-healer \
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
