#!/usr/bin/env bash
# Renders deploy/k8s with kustomize (kubectl's built-in, or a kustomize binary)
# and validates every rendered resource against the Kubernetes OpenAPI schemas
# (kubernetes-validate, strict: unknown fields fail) for the oldest and newest
# Kubernetes versions we support, then runs the consistency checks of
# check_k8s.py (with its self-test). Proves the validator can fail, too.
#
# Environment: SANDBOX_MCP_PYTHON  python whose environment has kubernetes-validate
#              and PyYAML (scripts/requirements-test.txt); default python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${SANDBOX_MCP_PYTHON:-python3}
# Oldest: the preStop `sleep` action is on by default from 1.30. Newest: what the validator knows.
versions=${SANDBOX_MCP_K8S_VERSIONS:-"1.30.0 1.37.0"}

die() { printf 'validate_k8s: FAIL: %s\n' "$*" >&2; exit 1; }

bindir=$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')
validator="$bindir/kubernetes-validate"
[ -x "$validator" ] || validator=$(command -v kubernetes-validate || true)
[ -n "$validator" ] || die "kubernetes-validate not found (pip install -r scripts/requirements-test.txt)"

work=$(mktemp -d /tmp/sandbox-mcp-k8s.XXXXXX)
trap 'rm -rf "$work"' EXIT

if command -v kubectl >/dev/null; then
  kubectl kustomize "$root/deploy/k8s" >"$work/rendered.yaml" || die "kustomize rendering failed"
elif command -v kustomize >/dev/null; then
  kustomize build "$root/deploy/k8s" >"$work/rendered.yaml" || die "kustomize rendering failed"
else
  die "neither kubectl (with built-in kustomize) nor kustomize is installed"
fi
resources=$(grep -c '^kind:' "$work/rendered.yaml")
[ "$resources" -ge 10 ] || die "only $resources resources rendered"

passed=0
failed=0
for version in $versions; do
  if "$validator" --strict -k "$version" "$work/rendered.yaml" >"$work/validate.log" 2>&1; then
    ok=$(grep -c 'passed for resource' "$work/validate.log" || true)
    if [ "$ok" = "$resources" ]; then
      echo "ok   all $resources rendered resources valid against Kubernetes $version (strict)"
      passed=$((passed + 1))
    else
      echo "FAIL Kubernetes $version: $ok of $resources resources reported valid"; cat "$work/validate.log"
      failed=$((failed + 1))
    fi
  else
    echo "FAIL Kubernetes $version schema validation:"; grep -v 'passed for resource' "$work/validate.log"
    failed=$((failed + 1))
  fi
done

# The validator must reject what the API server would: an unknown field and a wrong type.
sed 's/^  replicas: 2$/  replicaz: 2/' "$work/rendered.yaml" >"$work/broken1.yaml"
sed 's/containerPort: 8080/containerPort: "eighty"/' "$work/rendered.yaml" >"$work/broken2.yaml"
for broken in broken1 broken2; do
  if cmp -s "$work/rendered.yaml" "$work/$broken.yaml"; then
    echo "FAIL self-test $broken: the mutation did not apply"; failed=$((failed + 1))
  elif "$validator" --strict --quiet "$work/$broken.yaml" >/dev/null 2>&1; then
    echo "FAIL self-test $broken: the schema validator accepted a broken manifest"; failed=$((failed + 1))
  else
    echo "ok   self-test $broken: the schema validator rejects a broken manifest"; passed=$((passed + 1))
  fi
done

echo "validate_k8s: schemas: $passed passed, $failed failed"
"$python" "$here/check_k8s.py" "$work/rendered.yaml" --self-test || failed=$((failed + 1))
[ "$failed" = 0 ]
