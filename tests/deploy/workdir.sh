# Shell helpers the deployment tests share (sourced by tests/deploy/tls_proxy_test.sh and
# deploy/image-test.sh; both define `log`).

# Removes the scratch directory $1, unless something is still mounted below it: that is a sandbox
# left behind (a bug to report), and deleting through the mount would reach into it. Returns 1 then.
remove_work_dir() {
  local dir=$1
  if awk -v w="$dir" 'index($5, w) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    log "FAIL: mounts left under $dir (not removed):"
    awk -v w="$dir" 'index($5, w) == 1 { print "  " $5 }' /proc/self/mountinfo >&2
    return 1
  fi
  rm -rf --one-file-system "$dir"
}
