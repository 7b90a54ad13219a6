# syntax=docker/dockerfile:1
# One image for aliaslb-controller, aliaslb-agent and the aliaslb CLI (all in /usr/local/bin).
#
#   docker build -t ghcr.io/aliaslb/aliaslb:0.1.0 --build-arg ALIASLB_COMMIT=$(git rev-parse HEAD) .
#
# The build argument ALIASLB_COMMIT is the commit `--version`, `aliaslb version` and the metric
# aliaslb_build_info print (`unknown` without it) and the image's revision label. Every base
# image is multi-arch: built on an arm64 machine (or `docker buildx build --platform
# linux/arm64`, emulated), it is the arm64 image. `scripts/release` makes the released image
# (with scripts/image) for the machine it runs on; the release workflow runs it on amd64 and
# arm64 runners.
#
# `scripts/image` builds the same image offline, without Docker or a registry: a bookworm minbase
# root file system with nftables and netbase made by mmdebstrap from Debian's archive, the
# binaries cargo built (stripped) in /usr/local/bin, the same user, PATH and entrypoint, committed
# by buildah to an OCI archive. The end-to-end test e2e/tests/install.rs runs that image as the
# DaemonSet and the Deployment under real kubelets (scripts/kubelets).
#
# Build: the official Rust image (Debian bookworm) has the C toolchain `ring` needs.
# Runtime: Debian bookworm slim with Debian's `nftables` (the agent's host-port shield runs
# `nft`; a distroless base has no way to ship it with its libraries) and `netbase` (the
# /etc/protocols that nft reads protocol names such as `tcp` from), user nonroot (65532). The
# agent's DaemonSet overrides the user to root: netlink, nftables and raw sockets need it.

FROM rust:1.95-bookworm AS build
ARG ALIASLB_COMMIT=unknown
ENV ALIASLB_COMMIT=${ALIASLB_COMMIT}
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir across builds; the binaries are copied out of
# the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p aliaslb-controller -p aliaslb-agent \
    && mkdir -p /out \
    && cp target/release/aliaslb-controller target/release/aliaslb target/release/aliaslb-agent /out/

FROM debian:bookworm-slim
ARG ALIASLB_COMMIT=unknown
# The release is the workspace version (Cargo.toml); scripts/release checks they agree.
LABEL org.opencontainers.image.title=aliaslb \
      org.opencontainers.image.description="Bare-metal LoadBalancer for Kubernetes: aliaslb-controller, aliaslb-agent and the aliaslb CLI" \
      org.opencontainers.image.version=0.1.0 \
      org.opencontainers.image.revision=${ALIASLB_COMMIT} \
      org.opencontainers.image.source=https://github.com/aliaslb/aliaslb \
      org.opencontainers.image.licenses=Apache-2.0
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables netbase \
    && rm -rf /var/lib/apt/lists/* \
    && nft --version
COPY --from=build /out/aliaslb-controller /usr/local/bin/aliaslb-controller
COPY --from=build /out/aliaslb-agent /usr/local/bin/aliaslb-agent
COPY --from=build /out/aliaslb /usr/local/bin/aliaslb
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/aliaslb-controller"]
