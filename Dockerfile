# syntax=docker/dockerfile:1.7
#
# sandbox-mcp container images (see deploy/README.md for the exact run lines).
#
#   docker build -t sandbox-mcp .                 # default target `e2b`: gateway for an
#                                                 # E2B-compatible provider; distroless, non-root
#   docker build -t sandbox-mcp:local --target local .
#                                                 # gateway + embedded local provider; runs as root
#                                                 # and needs CAP_SYS_ADMIN, CAP_NET_ADMIN and
#                                                 # /dev/net/tun (see deploy/README.md)
#
# The supervisor script that runs inside each sandbox is embedded in the binary,
# so the E2B image contains nothing but the binary, glibc and CA certificates.
#
# Configuration: environment variables SANDBOX_MCP_<SECTION>__<KEY> (they win
# over the file) and/or a TOML file mounted at /etc/sandbox-mcp/config.toml and
# passed with `--config` (the default command does that only if you override it).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------------------
# build: release binary (Rust + gcc from the official slim image; aws-lc builds
# with the C compiler, no cmake needed).
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
# The image's binary is optimised for size (opt-level "s": 16.9 -> 11.4 MB; the
# gateway waits on the network, not the CPU). These build arguments reach cargo
# as CARGO_PROFILE_RELEASE_* environment variables, for this build only
# (Cargo.toml's release profile stays as is): e.g.
# `--build-arg CARGO_PROFILE_RELEASE_OPT_LEVEL=3` for the speed-optimised binary.
ARG CARGO_PROFILE_RELEASE_OPT_LEVEL=s
WORKDIR /src
# .dockerignore admits only what the build needs (manifest, lock, sources,
# supervisor script, build script and declared targets).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin sandbox-mcp --bin sandbox-mcp-envd \
    && install -D -s -m 0755 target/release/sandbox-mcp /out/sandbox-mcp \
    && install -D -s -m 0755 target/release/sandbox-mcp-envd /out/sandbox-mcp-envd \
    && /out/sandbox-mcp --version

# ---------------------------------------------------------------------------
# local-root: the root file system of the `local` image. The sandboxes' root
# file system is that image's own `/` (template `base`), so it carries what a
# sandbox user expects: bash, coreutils, python3 with its standard library (the
# task supervisor needs it), procps, CA certificates, e2fsprogs (each sandbox's
# disk image), and iproute2 + nftables, with which the provider sets up each
# sandbox's own network namespace. Then, in the same layer, what nothing runs:
# python's test package and pydoc data, the byte-code of rarely imported
# modules (the rest is kept: the sandbox user cannot write byte-code to /usr,
# so every import of a module without it compiles it again), and the package
# management (apt, dpkg, debconf, perl-base, gnutls, account tools);
# /var/lib/dpkg/status stays, listing what is installed, for image scanners. To add programs for the sandboxes, add them
# to the apt-get line and rebuild: the image has no package manager.
FROM debian:${DEBIAN_RELEASE}-slim AS local-root
# Versions are not pinned: this stage must pick up Debian security updates on rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 procps iproute2 nftables \
    && rm -rf /var/lib/apt/lists/* \
    && rm -rf /usr/lib/python3.*/test /usr/lib/python3.*/pydoc_data /usr/lib/python3.*/lib-dynload/_test*.so \
       /usr/lib/python3.*/lib-dynload/_ctypes_test*.so /usr/lib/python3.*/lib-dynload/_xxtestfuzz*.so \
       /usr/lib/python3.*/xmlrpc/__pycache__ \
    && find /usr/lib/python3.*/__pycache__ -regextype posix-extended \
       -regex '.*/(_pydecimal|_pyio|pydoc|turtle|mailbox)\.cpython-[^/]*\.pyc' -delete \
    && find /usr/lib/python3.*/encodings/__pycache__ -name '*.pyc' -regextype posix-extended \
       ! -regex '.*/(__init__|aliases|utf_8|ascii|latin_1|idna|punycode)\.cpython-[^/]*\.pyc' -delete \
    && dpkg --purge --force-depends --force-remove-essential apt libapt-pkg6.0 gpgv debian-archive-keyring \
       adduser login passwd libsemanage2 libsemanage-common libsepol2 \
       libgnutls30 libhogweed6 libnettle8 libp11-kit0 libtasn1-6 \
    && dpkg --purge --force-depends --force-remove-essential debconf perl-base \
    && dpkg --purge --force-depends --force-remove-essential dpkg \
    && rm -rf /var/lib/dpkg/info /var/lib/dpkg/*-old /var/lib/dpkg/available /var/cache/debconf /var/cache/apt \
       /var/lib/apt /etc/apt /etc/dpkg /var/log/* /var/cache/ldconfig/aux-cache

# ---------------------------------------------------------------------------
# local: gateway with the embedded local provider, on that root flattened into
# one layer (deleting files from the Debian base in a later layer would not
# make the image smaller). It must run as root with CAP_SYS_ADMIN and
# CAP_NET_ADMIN, /dev/net/tun, and an unconfined seccomp/AppArmor profile, and
# its state directory must be a volume (overlayfs cannot use the container's
# own overlay root as upper layer).
FROM scratch AS local
# Copying the whole root is the point: one layer without what local-root deleted.
# hadolint ignore=DL3067
COPY --from=local-root / /
COPY --from=build /out/sandbox-mcp /usr/local/bin/sandbox-mcp
# The lean sandbox agent (README: The sandbox agent binary).
COPY --from=build /out/sandbox-mcp-envd /usr/local/bin/sandbox-mcp-envd
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SANDBOX_MCP_SERVER__LISTEN=0.0.0.0:8080 \
    SANDBOX_MCP_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz \
    SANDBOX_MCP_SERVER__LOG_FORMAT=json \
    SANDBOX_MCP_PROVIDER__KIND=local \
    SANDBOX_MCP_LOCAL__STATE_DIR=/var/lib/sandbox-mcp
VOLUME ["/var/lib/sandbox-mcp"]
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/sandbox-mcp", "healthcheck"]
# Root is required here: the embedded provider creates namespaces and mounts.
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/usr/local/bin/sandbox-mcp"]
CMD ["serve"]

# ---------------------------------------------------------------------------
# e2b (default): gateway only, for E2B cloud, self-hosted E2B, or a separate
# `sandbox-mcp provider`. Distroless: glibc, libgcc, CA certificates, no shell.
FROM gcr.io/distroless/cc-debian12:nonroot AS e2b
COPY --from=build /out/sandbox-mcp /usr/local/bin/sandbox-mcp
ENV SANDBOX_MCP_SERVER__LISTEN=0.0.0.0:8080 \
    SANDBOX_MCP_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz \
    SANDBOX_MCP_SERVER__LOG_FORMAT=json \
    SANDBOX_MCP_PROVIDER__KIND=e2b
EXPOSE 8080
STOPSIGNAL SIGTERM
# `sandbox-mcp healthcheck` GETs $SANDBOX_MCP_HEALTHCHECK_URL and exits 0 only
# on 2xx (there is no curl in a distroless image). If you move the listener to
# another port, set both variables.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/sandbox-mcp", "healthcheck"]
# 10001: a fixed non-root uid/gid, so Kubernetes can check runAsNonRoot.
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/sandbox-mcp"]
CMD ["serve"]
