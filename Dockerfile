# Runbook's container image.
#   docker build -t ghcr.io/runbook-dev/runbook:v0.1.0 .
# The build stage runs the same release build CI can run
# (cargo build --release --locked); the runtime image is distroless, with
# no shell or package manager, and runs as an unprivileged user.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that editing the sources reuses their layer.
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/
COPY crates/operator/Cargo.toml crates/operator/
COPY crates/sandbox/Cargo.toml crates/sandbox/
COPY crates/simulator/Cargo.toml crates/simulator/
COPY crates/bench/Cargo.toml crates/bench/
COPY crates/sys/Cargo.toml crates/sys/
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && for c in core operator sandbox simulator bench sys; do mkdir -p crates/$c/src && touch crates/$c/src/lib.rs; done \
    && for b in decision sandbox operator reload scenario; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked \
    && rm -rf src benches crates/*/src
COPY crates ./crates
COPY src ./src
COPY benches ./benches
COPY policies ./policies
COPY crds ./crds
COPY examples ./examples
RUN touch src/main.rs src/lib.rs crates/*/src/lib.rs && cargo build --release --locked --bin runbook

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/runbook /usr/local/bin/runbook
# The shipped policies, for --policy-dir /etc/runbook/policies; the
# manifests in deploy/ load them from a ConfigMap instead.
COPY --from=build /src/policies /etc/runbook/policies
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/runbook"]
CMD ["run"]
