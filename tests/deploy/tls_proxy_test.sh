#!/usr/bin/env bash
# A full MCP session through a real TLS reverse proxy.
#
# Starts the real `sandbox-mcp serve` (embedded local provider, bearer auth,
# deploy/compose/config.toml with loopback overrides) and Debian's nginx with
# deploy/proxy/sandbox-mcp.conf.template rendered by envsubst and a locally
# generated CA + certificate, then runs tests/deploy/mcp_over_tls.py (the
# official Python `mcp` client) against https://localhost:PORT/mcp.
#
# Environment:
#   SANDBOX_MCP_BIN     the binary (default target/debug/sandbox-mcp)
#   SANDBOX_MCP_PYTHON  a python with the `mcp` package (default python3)
# Needs root (the local provider creates namespaces; nginx may be installed).
# Binds only 127.0.0.1 on free ports; leaves no process or file behind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${SANDBOX_MCP_BIN:-$root/target/debug/sandbox-mcp}
python=${SANDBOX_MCP_PYTHON:-python3}

log() { printf 'tls_proxy_test: %s\n' "$*" >&2; }
. "$here/workdir.sh" # remove_work_dir
die() { log "FAIL: $*"; exit 1; }

if [ "$(id -u)" != 0 ]; then
  log "SKIPPED: must run as root (the embedded local provider creates namespaces and mounts)"
  exit 0
fi
[ -x "$bin" ] || die "sandbox-mcp binary not found at $bin (build it, or set SANDBOX_MCP_BIN)"
command -v openssl >/dev/null || die "openssl is required to generate the test certificate"
command -v curl >/dev/null || die "curl is required"
command -v envsubst >/dev/null || die "envsubst (gettext-base) is required"
"$python" -c 'import mcp' 2>/dev/null || die "$python cannot import the 'mcp' package (set SANDBOX_MCP_PYTHON)"

# --- nginx from Debian, installed if missing, without starting the system service.
if ! command -v nginx >/dev/null; then
  log "installing nginx (Debian package)"
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends nginx >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx >/dev/null; }
  [ "$made_policy" = 1 ] && rm -f "$policy"
  command -v nginx >/dev/null || die "nginx could not be installed"
fi

work=$(mktemp -d /tmp/sandbox-mcp-tls.XXXXXX)
gateway_pid=""
nginx_pid=""
cleanup() {
  local status=$?
  if [ -n "$nginx_pid" ] && kill -0 "$nginx_pid" 2>/dev/null; then
    kill -TERM "$nginx_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$nginx_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nginx_pid" 2>/dev/null || true
  fi
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -TERM "$gateway_pid" 2>/dev/null || true
    # Graceful shutdown kills the sessions' sandboxes.
    # Bounded by 2 x shutdown_grace_secs (20) + 5 s in the gateway.
    for _ in $(seq 500); do kill -0 "$gateway_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$gateway_pid" 2>/dev/null; then
      log "gateway did not stop within 50 s of SIGTERM; killing it"
      kill -KILL "$gateway_pid" 2>/dev/null || true
      status=1
    fi
  fi
  wait 2>/dev/null || true
  if [ "$status" != 0 ]; then
    for f in gateway.log nginx/error.log; do
      [ -s "$work/$f" ] && { log "--- last lines of $f"; tail -n 40 "$work/$f" >&2; }
    done
  fi
  remove_work_dir "$work" || status=1
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# --- certificates: a throw-away CA and a server certificate for localhost.
tls="$work/tls"
mkdir -p "$tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=sandbox-mcp test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
  "extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid" >"$tls/server.ext"
openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
  -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
chmod 0600 "$tls"/*.key

# --- the gateway, with bearer auth (only the token's SHA-256 is configured).
gateway_port=$(free_port)
proxy_port=$(free_port)
while [ "$proxy_port" = "$gateway_port" ]; do proxy_port=$(free_port); done
token=$(openssl rand -hex 32)
token_sha=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
public_origin="https://localhost:$proxy_port"
mkdir -p "$work/state"

# The compose file's session store is its Redis service (redis://redis:6379), which does not exist
# here; this test is about the proxy, so sessions stay in the gateway's memory.
log "starting sandbox-mcp serve on 127.0.0.1:$gateway_port"
env SANDBOX_MCP_TOKENS="deploytest:$token_sha" \
  SANDBOX_MCP_SERVER__LISTEN="127.0.0.1:$gateway_port" \
  SANDBOX_MCP_SERVER__ALLOWED_ORIGINS="[\"$public_origin\"]" \
  SANDBOX_MCP_SERVER__SSE_KEEP_ALIVE_SECS=1 \
  SANDBOX_MCP_SERVER__LOG_FORMAT=text \
  SANDBOX_MCP_LOCAL__STATE_DIR="$work/state" \
  SANDBOX_MCP_PROVIDER__DEPLOYMENT="tls-proxy-test" \
  SANDBOX_MCP_SESSIONS__STORE=memory \
  "$bin" serve --config "$root/deploy/compose/config.toml" >"$work/gateway.log" 2>&1 &
gateway_pid=$!

for _ in $(seq 300); do
  kill -0 "$gateway_pid" 2>/dev/null || die "sandbox-mcp serve exited during start-up"
  curl -fsS -o /dev/null "http://127.0.0.1:$gateway_port/healthz" 2>/dev/null && break
  sleep 0.1
done
curl -fsS -o /dev/null "http://127.0.0.1:$gateway_port/healthz" || die "gateway /healthz not answering"

# --- nginx in its own prefix, not daemonized, with the shipped server config.
ngx="$work/nginx"
mkdir -p "$ngx"
chmod 0755 "$work" "$ngx"
# shellcheck disable=SC2016 # envsubst's variable list must reach it unexpanded
template_vars='${PROXY_LISTEN} ${PROXY_SERVER_NAME} ${PROXY_TLS_CERT} ${PROXY_TLS_KEY} ${SANDBOX_MCP_UPSTREAM}'
PROXY_LISTEN="127.0.0.1:$proxy_port" PROXY_SERVER_NAME=localhost \
  PROXY_TLS_CERT="$tls/server.pem" PROXY_TLS_KEY="$tls/server.key" \
  SANDBOX_MCP_UPSTREAM="127.0.0.1:$gateway_port" \
  envsubst "$template_vars" <"$root/deploy/proxy/sandbox-mcp.conf.template" >"$ngx/sandbox-mcp.conf"
cat >"$ngx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $ngx/nginx.pid;
error_log $ngx/error.log warn;
events { worker_connections 256; }
http {
    access_log $ngx/access.log;
    client_body_temp_path $ngx/client_body;
    proxy_temp_path $ngx/proxy;
    fastcgi_temp_path $ngx/fastcgi;
    uwsgi_temp_path $ngx/uwsgi;
    scgi_temp_path $ngx/scgi;
    include $ngx/sandbox-mcp.conf;
}
EOF
nginx -t -p "$ngx" -e "$ngx/error.log" -c "$ngx/nginx.conf" 2>"$ngx/check.log" \
  || { cat "$ngx/check.log" >&2; die "nginx rejected the rendered config"; }
log "starting nginx on https://localhost:$proxy_port"
nginx -p "$ngx" -e "$ngx/error.log" -c "$ngx/nginx.conf" &
nginx_pid=$!
for _ in $(seq 100); do
  kill -0 "$nginx_pid" 2>/dev/null || die "nginx exited during start-up"
  curl -fsS -o /dev/null --cacert "$tls/ca.pem" "https://localhost:$proxy_port/healthz" 2>/dev/null && break
  sleep 0.1
done

# --- the session, through the proxy, with the official MCP client. It also
# checks nginx's access log (the DELETE went through the proxy) and that the
# token appears in no log.
SANDBOX_MCP_TEST_TOKEN="$token" SANDBOX_MCP_TEST_CA="$tls/ca.pem" \
  SANDBOX_MCP_TEST_ALLOWED_ORIGIN="$public_origin" \
  SANDBOX_MCP_TEST_ACCESS_LOG="$ngx/access.log" \
  SANDBOX_MCP_TEST_LOGS="$ngx/access.log:$ngx/error.log:$work/gateway.log" \
  SANDBOX_MCP_TEST_BIN="$bin" SANDBOX_MCP_TEST_GATEWAY_PORT="$gateway_port" \
  "$python" "$here/mcp_over_tls.py" "https://localhost:$proxy_port/mcp"
