#!/usr/bin/env bash
# Starts the local provider on a free loopback port with a temporary state
# directory, runs e2b_sdk_compat.py against it with $SANDBOX_MCP_PYTHON (a
# python with e2b==2.63.0 installed; default: python3), then stops it.
# Usage: tests/interop/run_e2b_sdk_compat.sh [path/to/sandbox-mcp]   (needs root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../../target/debug/sandbox-mcp}"
python="${SANDBOX_MCP_PYTHON:-python3}"
key="e2b_$(printf '0%.0s' {1..38})aa"
state="$(mktemp -d /tmp/sandbox-mcp-sdk-state.XXXXXX)"
out="$state.stdout"
"$bin" provider --listen 127.0.0.1:0 --state-dir "$state" --api-key "$key" >"$out" &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$state" "$out"
}
trap cleanup EXIT
for _ in $(seq 1 300); do
  url="$(sed -n 's/.*listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$out" | head -n1)"
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "the provider exited early" >&2; exit 1; }
  sleep 0.1
done
[ -n "${url:-}" ] || { echo "the provider did not report its address" >&2; exit 1; }
PROVIDER_URL="$url" E2B_API_KEY="$key" "$python" "$here/e2b_sdk_compat.py"
