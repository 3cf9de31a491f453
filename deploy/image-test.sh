#!/usr/bin/env bash
# Build and run both container image targets (`e2b`, `local`) from the
# unchanged Dockerfile with podman + runc, as root. Run by tests/deploy/run.sh
# (scripts/test.sh installs podman, runc, slirp4netns and mmdebstrap).
#
#   1. stand-ins for the Dockerfile's bases, under the exact names its FROM
#      lines use, made only when no image of that name is in local storage
#      (image registries are not reachable from the test machines):
#        debian:<release>-slim          mmdebstrap --variant=minbase, slimmed like the official one
#        rust:<version>-slim-<release>  that root + gcc/libc6-dev + the host's Rust toolchain
#        gcr.io/distroless/cc-debian12  glibc, libgcc, CA certificates, nonroot = 65532
#      (deploy/image-test/*.Containerfile; see deploy/README.md "Tested").
#   2. builds both targets (build arguments only; the BuildKit cache mounts of
#      the Dockerfile are podman cache mounts kept between runs) and tags them
#      sandbox-mcp:<version> and sandbox-mcp:<version>-local (deploy/k8s uses <version>);
#   3. runs each: `e2b` as its non-root user with --network host against an
#      embedded provider started on the host; `local` with exactly the
#      privileges of the run line in deploy/README.md. For each: HEALTHCHECK
#      turns healthy, /readyz answers 200, a full MCP session with the official
#      Python client (deploy/image-test/mcp_session.py), then SIGTERM while
#      that session is still open and owns a sandbox: the container exits 0
#      within the grace and its shutdown has killed that sandbox;
#   4. reports the image sizes and fails past the targets (e2b 40 MB, local 120 MB).
#
# Environment:
#   SANDBOX_MCP_PYTHON  a python with the `mcp` package (default python3)
#   SANDBOX_MCP_NO_SKIP=1  a missing prerequisite fails instead of skipping
#   IMAGE_TEST_KEEP_IMAGES=0  remove the built images at the end (default: keep, so reruns are warm)
# Binds 127.0.0.1 only (free ports); containers, volumes and files it makes
# carry this run's id and are removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
python=${SANDBOX_MCP_PYTHON:-python3}
run_id="imgtest-$$-$(date +%s)"
grace=10 # seconds between SIGTERM and SIGKILL: Docker's default, the strictest of our run lines
# Size targets (uncompressed, MB = 10^6 bytes); an image above its target fails.
# See deploy/README.md ("Sizes") for where the bytes go.
max_e2b_mb=40
max_local_mb=120

log() { printf 'image-test: %s\n' "$*" >&2; }
. "$here/../tests/deploy/workdir.sh" # remove_work_dir
die() { log "FAIL: $*"; exit 1; }
skip() {
  if [ "${SANDBOX_MCP_NO_SKIP:-0}" = 1 ]; then die "$* (SANDBOX_MCP_NO_SKIP=1)"; fi
  log "SKIPPED: $*"
  exit 0
}
now() { date +%s; }

[ "$(id -u)" = 0 ] || skip "must run as root (rootful podman; the local target creates namespaces)"
for tool in podman runc mmdebstrap slirp4netns curl; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (apt-get install podman runc slirp4netns mmdebstrap curl)"
done
"$python" -c 'import mcp' 2>/dev/null || die "$python cannot import the 'mcp' package (set SANDBOX_MCP_PYTHON)"

work=$(mktemp -d "/tmp/sandbox-mcp-$run_id.XXXXXX")
containers=()
volumes=()
provider_pid=""
session_pid=""
cleanup() {
  local status=$?
  local c
  for c in "${containers[@]}"; do
    if [ "$status" != 0 ]; then
      log "--- last log lines of container $c"
      podman logs --tail 40 "$c" >&2 2>&1 || true
    fi
    podman rm -f -v -t 0 "$c" >/dev/null 2>&1 || true
  done
  for c in "${volumes[@]}"; do podman volume rm -f "$c" >/dev/null 2>&1 || true; done
  if [ -n "$session_pid" ]; then kill -TERM "$session_pid" 2>/dev/null || true; fi
  if [ -n "$provider_pid" ] && kill -0 "$provider_pid" 2>/dev/null; then
    kill -TERM "$provider_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$provider_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$provider_pid" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  if [ "$status" != 0 ] && [ -s "$work/provider.log" ]; then
    log "--- last lines of the host provider's log"
    tail -n 30 "$work/provider.log" >&2
  fi
  remove_work_dir "$work" || status=1
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- podman configuration for this machine kind: runc (Debian's crun refuses
# hybrid cgroup layouts), cgroupfs and file events (no systemd), ulimits no
# higher than the hard limits here (podman's defaults exceed them).
# (nproc: runc fails to set values near the hard limit here, so at most 32768.)
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
if [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; then nofile=1048576; fi
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$work/containers.conf"
# `podman build` (buildah) does not take default_ulimits from there.
build_ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}' >"$work/runtime" 2>"$work/podman-info.err" \
  || { cat "$work/podman-info.err" >&2; die "podman does not work here"; }
log "podman $(podman version --format '{{.Client.Version}}'), runtime $(head -n 1 "$work/runtime" | cut -c1-40)"

# --- what the Dockerfile asks for.
dockerfile="$root/Dockerfile"
arg_default() { sed -n "s/^ARG $1=\\(.*\\)$/\\1/p" "$dockerfile" | head -n 1; }
rust_version=$(arg_default RUST_VERSION)
debian_release=$(arg_default DEBIAN_RELEASE)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$rust_version" ] && [ -n "$debian_release" ] && [ -n "$version" ] \
  || die "cannot read RUST_VERSION/DEBIAN_RELEASE from the Dockerfile or the version from Cargo.toml"

# The host toolchain that stands in for the official Rust image: the one named
# by RUST_VERSION if installed, else the default one (then RUST_VERSION is
# passed as a build argument, and the stand-in carries that name).
host_sysroot=""
for tc in $(rustup toolchain list 2>/dev/null | awk '{print $1}'); do
  case "$tc" in "$rust_version".*-*|"$rust_version"-*) host_sysroot=$(rustup run "$tc" rustc --print sysroot) && break ;; esac
done
if [ -z "$host_sysroot" ]; then
  host_sysroot=$(rustc --print sysroot) || die "no Rust toolchain on this machine"
  host_rust=$(rustc -V | awk '{print $2}')
  log "Rust $rust_version is not installed here: the build uses the host's Rust $host_rust (--build-arg RUST_VERSION=${host_rust%.*})"
  rust_version=${host_rust%.*}
fi
host_sysroot=$(readlink -f "$host_sysroot")
toolchain_name="$("$host_sysroot/bin/rustc" -vV | sed -n 's/^release: //p')-$("$host_sysroot/bin/rustc" -vV | sed -n 's/^host: //p')"
build_args=(--build-arg "RUST_VERSION=$rust_version" --build-arg "DEBIAN_RELEASE=$debian_release")

# FROM lines, with the build arguments substituted; stage names are not bases.
bases=()
stages=" "
while read -r from_image as_kw stage_name; do
  image=${from_image//\$\{RUST_VERSION\}/$rust_version}
  image=${image//\$\{DEBIAN_RELEASE\}/$debian_release}
  # `scratch` is the empty image, not one to pull.
  case "$stages" in *" $image "*) ;; *) [ "$image" = scratch ] || bases+=("$image") ;; esac
  [ "${as_kw,,}" = as ] && stages+="$stage_name "
done < <(sed -n 's/^FROM[[:space:]]\+\(--[^ ]*[[:space:]]\+\)*//p' "$dockerfile")
[ "${#bases[@]}" -ge 2 ] || die "found no base images in the Dockerfile's FROM lines"

# Docker Hub's short names, as podman resolves them from local storage.
qualified() { case "$1" in */*.*/* | *.*/*) echo "$1" ;; */*) echo "docker.io/$1" ;; *) echo "docker.io/library/$1" ;; esac; }

ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -f "$ca_bundle" ] || ca_bundle=/etc/ssl/certs/ca-certificates.crt
debian_name=$(qualified "debian:$debian_release-slim")

# Slimmed like the official -slim image (merged /usr without the usrmerge
# package, no docs, man pages, locales; apt keeps no caches); the dpkg and apt
# settings stay in the image, so later apt-get installs are slim too.
mmdebstrap_args=(--variant=minbase --format=tar --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --aptopt='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; }'
  --aptopt='Dir::Cache::pkgcache ""' --aptopt='Dir::Cache::srcpkgcache ""'
  --aptopt='Acquire::GzipIndexes "true"' --aptopt='Acquire::Languages "none"'
  --aptopt='Apt::AutoRemove::SuggestsImportant "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
  "$debian_release" "$work/debian.tar"
  "deb http://deb.debian.org/debian $debian_release main"
  "deb http://deb.debian.org/debian $debian_release-updates main"
  "deb http://deb.debian.org/debian-security $debian_release-security main")
# Stand-ins carry this label (a hash of their recipe): an image without it is
# a real one and used as is; a stand-in of an older recipe is made again.
standin_label=org.sandbox-mcp.image-test.standin
debian_recipe=$(printf '%s\n' "${mmdebstrap_args[@]}" | sed "s|$work|WORK|" | sha256sum | cut -c1-16)
recipe_of() { # $1: Containerfile
  cat "$1" - <<<"$debian_recipe $toolchain_name" | sha256sum | cut -c1-16
}

make_debian() { # $1: image name
  local t0
  t0=$(now)
  log "stand-in $1: mmdebstrap --variant=minbase $debian_release"
  mmdebstrap --quiet "${mmdebstrap_args[@]}" >"$work/mmdebstrap.log" 2>&1 \
    || { tail -n 30 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  podman import --quiet --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "LABEL $standin_label=$debian_recipe" \
    "$work/debian.tar" "$1" >/dev/null
  rm -f "$work/debian.tar"
  log "stand-in $1 made in $(($(now) - t0)) s"
}

standin_build() { # $1: image name, $2: Containerfile, rest: podman build options
  local name=$1 file=$2 t0
  shift 2
  t0=$(now)
  log "stand-in $name: $(basename "$file")"
  podman build --quiet --pull=never --network host --format docker "${build_ulimits[@]}" -f "$file" \
    --build-arg "DEBIAN_IMAGE=$debian_name" --label "$standin_label=$(recipe_of "$file")" \
    "$@" -t "$name" "$here/image-test" >"$work/standin.log" 2>&1 \
    || { tail -n 30 "$work/standin.log" >&2; die "building the stand-in $name failed"; }
  log "stand-in $name made in $(($(now) - t0)) s"
}

# The recipe hash an image of that name should carry if it is a stand-in.
expected_recipe() { # $1: base image as the Dockerfile names it
  case "$1" in
    debian:*) echo "$debian_recipe" ;;
    rust:*) recipe_of "$here/image-test/rust.Containerfile" ;;
    gcr.io/distroless/cc-*) recipe_of "$here/image-test/distroless.Containerfile" ;;
    *) echo none ;;
  esac
}
present() { # $1: base image as the Dockerfile names it; true if usable as is
  local name label
  name=$(qualified "$1")
  podman image exists "$name" || return 1
  label=$(podman image inspect --format "{{index .Labels \"$standin_label\"}}" "$name" 2>/dev/null || true)
  [ -z "$label" ] || [ "$label" = "<no value>" ] || [ "$label" = "$(expected_recipe "$1")" ]
}

ensure_base() { # $1: base image as the Dockerfile names it
  local name
  name=$(qualified "$1")
  if present "$1"; then
    log "base $1: present in local storage ($(podman image inspect --format '{{.Id}}' "$name" | cut -c1-12)), used as is"
    return
  fi
  case "$1" in
    debian:*) make_debian "$name" ;;
    rust:*)
      present "debian:$debian_release-slim" || make_debian "$debian_name"
      standin_build "$name" "$here/image-test/rust.Containerfile" --build-arg "TOOLCHAIN=$toolchain_name" \
        -v "$host_sysroot:/host-toolchain:ro" -v "$(readlink -f "$ca_bundle"):/host-ca.crt:ro"
      ;;
    gcr.io/distroless/cc-*)
      present "debian:$debian_release-slim" || make_debian "$debian_name"
      standin_build "$name" "$here/image-test/distroless.Containerfile"
      ;;
    *) die "no stand-in known for the base image $1 (add one to deploy/image-test.sh)" ;;
  esac
}

t_bases=$(now)
for base in "${bases[@]}"; do ensure_base "$base"; done
log "bases ready in $(($(now) - t_bases)) s"

# --- the two targets, from the unchanged Dockerfile.
build_target() { # $1: target, $2: tag
  local t0
  t0=$(now)
  log "building target $1 as $2"
  podman build --pull=never --network host --format docker --layers "${build_ulimits[@]}" "${build_args[@]}" \
    --target "$1" --iidfile "$work/$1.iid" -t "$2" -f "$dockerfile" "$root" >"$work/build-$1.log" 2>&1 \
    || { tail -n 40 "$work/build-$1.log" >&2; die "building target $1 failed (log above)"; }
  grep -i -E 'warn|not supported' "$work/build-$1.log" | grep -v -E '^\s*(Compiling|warning: unused)' | head -n 5 >&2 || true
  log "target $1 built in $(($(now) - t0)) s"
}
e2b_tag="localhost/sandbox-mcp:$version"
local_tag="localhost/sandbox-mcp:$version-local"
build_target e2b "$e2b_tag"
build_target local "$local_tag"
e2b_image=$(cat "$work/e2b.iid")
local_image=$(cat "$work/local.iid")

# --- sizes.
size_mb() { podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%.1f", $1 / 1000000}'; }
# What a registry stores and a pull transfers: the layers gzip-compressed.
gzip_mb() { podman save --quiet "$1" 2>/dev/null | gzip -6 | wc -c | awk '{printf "%.1f", $1 / 1000000}'; }
e2b_mb=$(size_mb "$e2b_image")
local_mb=$(size_mb "$local_image")
size_line() { # $1: label, $2: image, $3: size MB, $4: target MB
  log "image size $1 $3 MB uncompressed, $(gzip_mb "$2") MB gzip (target <= $4 MB uncompressed: $(
    awk -v s="$3" -v t="$4" 'BEGIN { if (s > t) printf "NOT MET, %.1f MB over", s - t; else printf "met, %.1f MB under", t - s }'))"
}
size_line "e2b:  " "$e2b_image" "$e2b_mb" "$max_e2b_mb"
size_line "local:" "$local_image" "$local_mb" "$max_local_mb"

# --- running them.
free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
token=$(openssl rand -hex 32)
token_sha=$(printf %s "$token" | sha256sum | cut -d' ' -f1)

health_status() {
  podman inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Healthcheck.Status}}{{end}}' "$1" 2>/dev/null
}

# HEALTHCHECK: podman runs it from systemd timers, and there is no systemd
# here (`podman run` logs that it cannot add the timer), so the test runs the image's own HEALTHCHECK command with `podman
# healthcheck run` (which records the result) until the container is healthy.
wait_healthy() { # $1: container
  local status=""
  for _ in $(seq 60); do
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] || die "container $1 exited during start-up"
    podman healthcheck run "$1" >/dev/null 2>&1 || true
    status=$(health_status "$1")
    [ "$status" = healthy ] && break
    sleep 0.5
  done
  [ "$status" = healthy ] || die "container $1: HEALTHCHECK status '$status', not healthy"
  log "ok   $1: HEALTHCHECK healthy"
}

check_readyz() { # $1: base url
  local code
  for _ in $(seq 40); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$1/readyz" || true)
    [ "$code" = 200 ] && break
    sleep 0.5
  done
  [ "$code" = 200 ] || die "$1/readyz answered $code, not 200"
  log "ok   /readyz 200"
}

# The session runs in the background and ends holding one more sandbox in an
# open session, so that SIGTERM finds work to clean up.
run_session() { # $1: base url, $2: label; sets held_sandbox
  local hold="$work/hold-$2" out="$work/session-$2.out"
  log "MCP session against the $2 container"
  SANDBOX_MCP_TEST_TOKEN="$token" SANDBOX_MCP_TEST_HOLD_FILE="$hold" \
    "$python" "$here/image-test/mcp_session.py" "$1/mcp" >"$out" 2>&1 &
  session_pid=$!
  for _ in $(seq 900); do
    [ -s "$hold" ] && break
    kill -0 "$session_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$hold" ]; then
    wait "$session_pid" || true
    session_pid=""
    cat "$out" >&2
    die "the MCP session against the $2 container failed"
  fi
  held_sandbox=$(head -n 1 "$hold")
}
end_session() { # $1: label; after the container stopped
  local status=0
  wait "$session_pid" || status=$?
  session_pid=""
  grep -v '^Session termination failed' "$work/session-$1.out" >&2 || true
  [ "$status" = 0 ] || die "the MCP session against the $1 container failed"
}

stop_within_grace() { # $1: container
  local t0 elapsed code
  t0=$(date +%s.%N)
  podman stop -t "$grace" "$1" >/dev/null 2>"$work/stop.err" || { cat "$work/stop.err" >&2; die "podman stop $1 failed"; }
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  code=$(podman inspect --format '{{.State.ExitCode}}' "$1")
  [ "$code" = 0 ] || die "container $1 exited with status $code after SIGTERM (137 = killed after the ${grace}s grace)"
  awk -v e="$elapsed" -v g="$grace" 'BEGIN { exit !(e < g) }' || die "container $1 took ${elapsed}s to stop (grace ${grace}s)"
  log "ok   $1: SIGTERM -> exit 0 in ${elapsed}s (grace ${grace}s)"
}

# e2b: the gateway image, as its non-root user, in front of the embedded
# provider on the host (host network: the provider listens on loopback). The
# provider is the release binary of the image itself, copied out of it.
t_run=$(now)
bin="$work/sandbox-mcp"
podman create --name "extract-$run_id" "$local_image" >/dev/null 2>&1
containers+=("extract-$run_id")
podman cp "extract-$run_id:/usr/local/bin/sandbox-mcp" "$bin"
podman cp "extract-$run_id:/usr/local/bin/sandbox-mcp-envd" "$work/sandbox-mcp-envd"
podman rm -v "extract-$run_id" >/dev/null 2>&1
"$bin" --version >/dev/null || die "the binary copied out of the local image does not run on this host"
key="e2b_$(openssl rand -hex 20)"
mkdir -p "$work/provider-state"
"$bin" provider --listen 127.0.0.1:0 --api-key "$key" --state-dir "$work/provider-state" \
  >"$work/provider.out" 2>"$work/provider.log" &
provider_pid=$!
provider_addr=""
for _ in $(seq 100); do
  kill -0 "$provider_pid" 2>/dev/null || die "the host provider exited during start-up"
  provider_addr=$(grep -o -E '127\.0\.0\.1:[0-9]+' "$work/provider.out" | head -n 1 || true)
  [ -n "$provider_addr" ] && break
  sleep 0.1
done
[ -n "$provider_addr" ] || die "the host provider did not print its address"
port=$(free_port)
ctr="sandbox-mcp-e2b-$run_id"
containers+=("$ctr")
podman run -d --name "$ctr" --network host \
  --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  -e SANDBOX_MCP_SERVER__LISTEN="127.0.0.1:$port" \
  -e SANDBOX_MCP_HEALTHCHECK_URL="http://127.0.0.1:$port/healthz" \
  -e SANDBOX_MCP_TOKENS="imagetest:$token_sha" \
  -e SANDBOX_MCP_SERVER__ALLOWED_HOSTS='["127.0.0.1","localhost"]' \
  -e SANDBOX_MCP_PROVIDER__API_URL="http://$provider_addr" \
  -e SANDBOX_MCP_PROVIDER__SANDBOX_URL="http://$provider_addr" \
  -e SANDBOX_MCP_PROVIDER__DEPLOYMENT="$run_id" \
  -e E2B_API_KEY="$key" \
  "$e2b_image" >/dev/null 2>"$work/run-e2b.err" || { cat "$work/run-e2b.err" >&2; die "podman run (e2b) failed"; }
pid=$(podman inspect --format '{{.State.Pid}}' "$ctr")
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
[ "$uid" != 0 ] && [ "$uid" = "$(podman image inspect --format '{{.Config.User}}' "$e2b_image" | cut -d: -f1)" ] \
  || die "the e2b container runs as uid $uid, not the image's non-root user"
log "ok   e2b container runs as uid $uid"
wait_healthy "$ctr"
check_readyz "http://127.0.0.1:$port"
run_session "http://127.0.0.1:$port" e2b
stop_within_grace "$ctr"
end_session e2b
# The gateway's shutdown ended the open session and killed the sandbox it owned.
left=""
for _ in $(seq 50); do
  left=$(curl -fsS -H "X-API-Key: $key" "http://$provider_addr/sandboxes") || die "the host provider does not list sandboxes"
  [ "$left" = "[]" ] && break
  sleep 0.1
done
[ "$left" = "[]" ] || die "sandboxes left on the provider after the e2b container stopped: $left"
log "ok   the e2b gateway's shutdown killed the open session's sandbox $held_sandbox"
kill -TERM "$provider_pid"
wait "$provider_pid" 2>/dev/null || true
provider_pid=""
log "e2b target ran in $(($(now) - t_run)) s"

# local: the gateway with the embedded provider, run with the privileges of
# the documented run line (deploy/README.md, the block after the
# "local-run-line" marker): its --cap-add/--cap-drop/--security-opt/--device/
# --privileged/--sysctl options are taken from there, so the test follows the docs.
t_run=$(now)
documented=$(awk '/<!-- local-run-line/ { on = 1; next } on && /^```sh/ { inblock = 1; next } inblock && /^```/ { exit } inblock' \
  "$root/deploy/README.md")
[ -n "$documented" ] || die "deploy/README.md has no run line after the local-run-line marker"
privileges=()
while read -r word; do
  case "$word" in
    --privileged) privileges+=("$word") ;;
    # Docker's name for an unmasked /proc and /sys (needed to mount /proc in a
    # user namespace) is podman's unmask=ALL.
    --security-opt=systempaths=unconfined) privileges+=(--security-opt=unmask=ALL) ;;
    --cap-add=* | --cap-drop=* | --security-opt=* | --device=* | --sysctl=*) privileges+=("$word") ;;
  esac
done < <(printf '%s\n' "$documented" | sed -e 's/#.*$//' -e 's/\\$//' \
  | tr -s ' \t' '\n' | awk '/^--(cap-add|cap-drop|security-opt|device|sysctl)$/ { opt = $0; next } opt { print opt "=" $0; opt = ""; next } { print }')
[ "${#privileges[@]}" -gt 0 ] || die "no privileges found in the documented local run line"
log "local run line privileges (deploy/README.md): ${privileges[*]}"
port=$(free_port)
ctr="sandbox-mcp-local-$run_id"
vol="sandbox-mcp-state-$run_id"
containers+=("$ctr")
volumes+=("$vol")
podman run -d --name "$ctr" --network slirp4netns -p "127.0.0.1:$port:8080" \
  "${privileges[@]}" \
  -v "$vol:/var/lib/sandbox-mcp" \
  -e SANDBOX_MCP_TOKENS="imagetest:$token_sha" \
  -e SANDBOX_MCP_PROVIDER__DEPLOYMENT="$run_id" \
  "$local_image" >/dev/null 2>"$work/run-local.err" || { cat "$work/run-local.err" >&2; die "podman run (local) failed"; }
wait_healthy "$ctr"
check_readyz "http://127.0.0.1:$port"
run_session "http://127.0.0.1:$port" local
stop_within_grace "$ctr"
end_session local
podman logs "$ctr" >"$work/local.log" 2>&1 || true
awk -v id="\"$held_sandbox\"" '/"sandbox removed"/ && index($0, id) { found = 1 } END { exit !found }' "$work/local.log" \
  || die "the local container stopped without removing the open session's sandbox $held_sandbox"
log "ok   the local gateway's shutdown removed the open session's sandbox $held_sandbox"
log "local target ran in $(($(now) - t_run)) s"

# --- sizes against the targets (checked after the runs, so that one CI run
# reports both a size regression and a run failure), and the tags deploy/k8s uses.
fail_size=0
awk -v s="$e2b_mb" -v m="$max_e2b_mb" 'BEGIN { exit !(s <= m) }' || { log "FAIL: e2b image is $e2b_mb MB > $max_e2b_mb MB"; fail_size=1; }
awk -v s="$local_mb" -v m="$max_local_mb" 'BEGIN { exit !(s <= m) }' || { log "FAIL: local image is $local_mb MB > $max_local_mb MB"; fail_size=1; }
k8s_tag=$(sed -n 's/^[[:space:]]*newTag:[[:space:]]*"\{0,1\}\([^"]*\)"\{0,1\}[[:space:]]*$/\1/p' "$root/deploy/k8s/kustomization.yaml")
[ "$k8s_tag" = "$version" ] || { log "FAIL: deploy/k8s/kustomization.yaml uses tag '$k8s_tag', the build produces '$version'"; fail_size=1; }
[ "$fail_size" = 0 ] || exit 1
if [ "${IMAGE_TEST_KEEP_IMAGES:-1}" = 0 ]; then
  podman rmi "$e2b_tag" "$local_tag" >/dev/null 2>&1 || true
fi
log "images: $e2b_tag ($e2b_mb MB), $local_tag ($local_mb MB); k8s tag $k8s_tag matches"
log "all image checks passed"
