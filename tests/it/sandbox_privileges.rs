//! Integration tests of what root inside a sandbox can and cannot do (issue 10): the real
//! `sandbox-mcp provider` binary, real namespaces, commands run through envd. Needs root (skips
//! loudly otherwise, fails under SANDBOX_MCP_NO_SKIP).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness, oci};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use harness::*;
use reqwest::StatusCode;
use serde_json::json;

/// The default `local.id_range`.
const HOST_BASE: u32 = 1_000_000_000;

/// Files the test plants on the host; removed on drop.
struct Planted(Vec<PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Host pids of every process in the PID namespace of agent `pid`.
fn sandbox_processes(pid: i32) -> Vec<i32> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == ns))
        .collect()
}

/// Real, effective, saved and filesystem uids of a host pid.
fn uids_of(pid: i32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .map(|l| l.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn host_secrets_are_invisible_and_sandbox_root_is_unprivileged_on_the_host() {
    require_root!();
    let tag = format!("{}-{}", std::process::id(), rand_suffix());
    let etc_secret = PathBuf::from(format!("/etc/sbx-test-secret-{tag}"));
    let var_lib_secret = PathBuf::from(format!("/var/lib/sbx-test-secret-{tag}"));
    let other_home = PathBuf::from(format!("/home/sbx-test-other-{tag}"));
    let _planted = Planted(vec![etc_secret.clone(), var_lib_secret.clone(), other_home.clone()]);
    for (path, is_dir) in [(&etc_secret, false), (&var_lib_secret, true), (&other_home, true)] {
        let file = if is_dir {
            std::fs::create_dir_all(path).unwrap();
            path.join("secret")
        } else {
            path.clone()
        };
        std::fs::write(&file, "TOP-SECRET").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    let p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let id = id_of(&sbx);

    // The host's accounts, its root-only files, /var/lib and other homes are not there.
    let (_, shadow) = p.run(&sbx, "cat /etc/shadow", Some("root")).await;
    let names: Vec<&str> = shadow.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(names, vec!["root", "user"], "{shadow}");
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    for line in host_shadow.lines().filter(|l| l.split(':').nth(1).is_some_and(|h| h.len() > 2)) {
        assert!(!shadow.contains(line), "host shadow line visible: {line}");
    }
    for path in [&etc_secret, &var_lib_secret.join("secret"), &other_home.join("secret")] {
        let (code, out) = p.run(&sbx, &format!("cat {}", path.display()), Some("root")).await;
        assert_ne!(code, 0, "{} readable: {out}", path.display());
        assert!(!out.contains("TOP-SECRET"));
    }
    let (_, out) = p.run(&sbx, "ls -A /home; ls -A /var/lib | wc -l; ls -A /root | wc -l", Some("root")).await;
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["user", "0", "0"], "{out}");
    // The generated /etc: the sandbox's resolver, localhost and its own name.
    let (_, out) = p.run(&sbx, "cat /etc/resolv.conf", None).await;
    assert_eq!(out, "nameserver 169.254.0.22\n");
    let (_, out) = p.run(&sbx, "cat /etc/hosts", None).await;
    assert!(out.contains("127.0.0.1\tlocalhost") && out.contains(&format!("\t{id}")), "{out}");
    // The host's programs are there.
    let (code, out) = p.run(&sbx, "python3 -c 'print(6*7)' && bash --version | head -1", None).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("42\n"), "{out}");

    // Root inside maps to an unprivileged host uid; so does every process the host sees.
    let (_, out) = p.run(&sbx, "cat /proc/self/uid_map /proc/self/gid_map", Some("root")).await;
    let maps: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    let want = vec!["0", "1000000000", "65536"];
    assert_eq!(maps, vec![want.clone(), want], "not the identity map: {out}");
    let (code, _) = p.run(&sbx, "sleep 1000 >/dev/null 2>&1 &", Some("root")).await;
    assert_eq!(code, 0);
    let (code, _) = p.run(&sbx, "sleep 1001 >/dev/null 2>&1 &", None).await;
    assert_eq!(code, 0);
    let envd_pid = p.record(&id)["envd_pid"].as_i64().unwrap() as i32;
    let procs = sandbox_processes(envd_pid);
    assert!(procs.len() >= 3, "envd and two sleeps: {procs:?}");
    let mut seen_user = false;
    for pid in &procs {
        let uids = uids_of(*pid);
        assert!(uids.iter().all(|u| *u >= HOST_BASE), "pid {pid} runs with host uids {uids:?}");
        seen_user |= uids.iter().all(|u| *u == HOST_BASE + 1000);
    }
    assert!(seen_user, "user's sleep runs as host uid {}", HOST_BASE + 1000);

    // Root still administers the sandbox: writes to /etc and /usr, ownership kept.
    let (code, out) = p
        .run(
            &sbx,
            "echo 'export SBX=1' >> /etc/profile && mkdir -p /usr/local/bin && echo '#!/bin/sh' > /usr/local/bin/tool \
             && chown user:user /usr/local/bin/tool && stat -c %U:%G /usr/local/bin/tool /usr/bin/env && grep -c SBX /etc/profile",
            Some("root"),
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["user:user", "root:root", "1"], "{out}");
    let (code, out) =
        p.run(&sbx, "touch /home/user/mine /tmp/mine && stat -c %U /home/user/mine /tmp/mine", None).await;
    assert_eq!((code, out.as_str()), (0, "user\nuser\n"));
    // On the host the writes belong to the sandbox's range and the host's /usr is untouched.
    assert!(
        !Path::new("/usr/local/bin/tool").exists() || std::fs::read("/usr/local/bin/tool").unwrap() != b"#!/bin/sh\n"
    );
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn blocked_syscalls_fail_with_eperm_inside() {
    require_root!();
    let p = Provider::start(&[]);
    check_blocked_syscalls(&p, "base").await;
}

/// The same checks in a sandbox of a Debian OCI image (its own python3, util-linux and libc).
#[tokio::test(flavor = "multi_thread")]
async fn blocked_syscalls_fail_with_eperm_inside_a_debian_oci_template() {
    require_root!();
    let Some(rootfs) = oci::debian_python_rootfs() else { return };
    let layout = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    oci::write_layout(layout.path(), &[std::fs::read(&rootfs).unwrap()]);
    let p = Provider::start(&[]);
    let out = Command::new(common::binary())
        .arg("template")
        .arg("--state-dir")
        .arg(&p.state)
        .args(["import", "debian", layout.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_blocked_syscalls(&p, "debian").await;
}

async fn check_blocked_syscalls(p: &Provider, template: &str) {
    let sbx = p.create(json!({"templateID": template})).await;
    let calls: Vec<(&str, i64, &str)> = vec![
        ("mount", libc::SYS_mount, "0,0,0,0,0"),
        ("keyctl", libc::SYS_keyctl, "0,0"),
        ("add_key", libc::SYS_add_key, "b'user',b'k',b'v',1,-3"),
        ("request_key", libc::SYS_request_key, "b'user',b'k',0,0"),
        ("bpf", libc::SYS_bpf, "0,0,0"),
        ("perf_event_open", libc::SYS_perf_event_open, "0,0,-1,-1,0"),
        ("kexec_load", libc::SYS_kexec_load, "0,0,0,0"),
        ("init_module", libc::SYS_init_module, "0,0,0"),
        ("finit_module", libc::SYS_finit_module, "0,0,0"),
        ("unshare(CLONE_NEWUSER)", libc::SYS_unshare, "0x10000000"),
        ("setns", libc::SYS_setns, "0,0"),
        ("userfaultfd", libc::SYS_userfaultfd, "0"),
        ("io_uring_setup", libc::SYS_io_uring_setup, "1,0"),
    ];
    let mut script =
        String::from("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n");
    for (name, nr, args) in &calls {
        script.push_str(&format!(
            "ctypes.set_errno(0); r = libc.syscall({nr}, {args}); print('{name}', r, ctypes.get_errno())\n"
        ));
    }
    for user in ["root", "user"] {
        let (code, out) = p.run(&sbx, &format!("python3 - <<'EOF'\n{script}EOF"), Some(user)).await;
        assert_eq!(code, 0, "{out}");
        for (name, _, _) in &calls {
            let line = out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{out}"));
            assert!(line.ends_with(" -1 1"), "{user}: {line} (want -1 EPERM)");
        }
    }
    let (_, out) = p.run(&sbx, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status", None).await;
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), vec!["NoNewPrivs:", "1", "Seccomp:", "2"], "{out}");
    // A nested user namespace with full capabilities is not possible, for user or root.
    let (code, out) = p.run(&sbx, "command -v unshare", None).await;
    assert_eq!(code, 0, "{template} has no unshare: {out}");
    for user in ["user", "root"] {
        let (code, out) = p.run(&sbx, "unshare -Urmn true", Some(user)).await;
        assert_ne!(code, 0, "{user}: unshare -Urmn succeeded: {out}");
    }
    // Ordinary process creation is unaffected.
    let (code, out) = p
        .run(&sbx, "(sleep 0 &) ; python3 -c 'import subprocess; print(subprocess.run([\"true\"]).returncode)'", None)
        .await;
    assert_eq!((code, out.trim()), (0, "0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_templates_are_used_and_unknown_templates_are_refused() {
    require_root!();
    // A minimal root filesystem: bash and its libraries, accounts, a marker.
    let tmp = tempfile::Builder::new().prefix("sbx-template-test").tempdir_in("/var/tmp").unwrap();
    let rootfs = tmp.path().join("rootfs");
    for dir in ["etc", "usr/bin", "tmp", "home/user", "root"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    std::os::unix::fs::symlink("usr/bin", rootfs.join("bin")).unwrap();
    let ldd = Command::new("ldd").arg("/usr/bin/bash").output().unwrap();
    let mut files = vec![PathBuf::from("/usr/bin/bash")];
    for word in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
        if word.starts_with('/') {
            files.push(PathBuf::from(word));
        }
    }
    for file in &files {
        let real = std::fs::canonicalize(file).unwrap();
        let dst = rootfs.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&real, &dst).unwrap();
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::write(rootfs.join("etc/marker"), "custom-template\n").unwrap();

    let p = Provider::start(&["--template", &format!("mini={}", rootfs.display())]);
    let sbx = p.create(json!({"templateID": "mini"})).await;
    let (code, out) = p
        .run(
            &sbx,
            "read -r m < /etc/marker; echo $m; [ -e /usr/bin/python3 ] && echo host-usr; echo done",
            Some("root"),
        )
        .await;
    assert_eq!((code, out.as_str()), (0, "custom-template\ndone\n"));
    let (code, out) = p.run(&sbx, "echo changed > /etc/marker; read -r m < /etc/marker; echo $m", Some("root")).await;
    assert_eq!((code, out.as_str()), (0, "changed\n"));
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/marker")).unwrap(),
        "custom-template\n",
        "lower layer untouched"
    );

    let (status, v) = p.call(reqwest::Method::POST, "/v2/sandboxes", Some(json!({"templateID": "nope"}))).await;
    assert_eq!((status, v["code"].as_i64()), (StatusCode::NOT_FOUND, Some(404)), "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("nope"), "{v}");

    // A template that is not a root filesystem is refused at start, naming local.templates.
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox-mcp"))
        .args(["provider", "--listen", "127.0.0.1:0", "--api-key", API_KEY, "--state-dir"])
        .arg(tmp.path().join("state2"))
        .args(["--template", &format!("bad={}", tmp.path().join("missing").display())])
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("local.templates"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(&sbx)), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_provider_on_the_same_state_directory_is_refused() {
    require_root!();
    let p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox-mcp"))
        .args(["provider", "--listen", "127.0.0.1:0", "--api-key", API_KEY, "--state-dir"])
        .arg(&p.state)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second provider started: {stderr}");
    assert!(out.stdout.is_empty(), "it never listened");
    assert!(stderr.contains("local.state_dir") && stderr.contains("already uses the state directory"), "{stderr}");
    // The first one still owns its sandbox.
    let (code, out) = p.run(&sbx, "echo alive", None).await;
    assert_eq!((code, out.as_str()), (0, "alive\n"));
    let rec = p.record(&id_of(&sbx));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(&sbx)), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_nothing_left(&p, &id_of(&sbx), rec["envd_pid"].as_i64().unwrap() as i32, &cgroups_of(&rec));
}

/// Loop devices whose backing file is under `dir`.
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|backing| backing.trim().starts_with(&*dir.to_string_lossy()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_past_the_disk_limit_fail_with_enospc_inside_and_spare_the_host() {
    require_root!();
    let p = Provider::start(&["--disk-limit-mb", "64"]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let id = id_of(&sbx);
    let host_free = || nix::sys::statvfs::statvfs(&p.state).map(|s| s.blocks_available() * s.fragment_size()).unwrap();
    let before = host_free();
    // 100 MiB into a 64 MiB disk: ENOSPC inside, for /tmp, /home/user and the root alike.
    let (code, out) = p.run(&sbx, "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1", None).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    for path in ["/home/user/more", "/more"] {
        let (code, out) = p.run(&sbx, &format!("head -c 2000000 /dev/zero > {path}"), Some("root")).await;
        assert_ne!(code, 0, "{path}: {out}");
        assert!(out.contains("No space left on device"), "{path}: {out}");
    }
    // The host lost at most the sandbox's limit (other tests may write at the same time: generous).
    let after = host_free();
    assert!(before.saturating_sub(after) < 200 * 1024 * 1024, "host free space fell by {}", before - after);
    // E2B metrics report the limit.
    let (status, metrics) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}/metrics"), None).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let (used, total) = (metrics[0]["diskUsed"].as_u64().unwrap(), metrics[0]["diskTotal"].as_u64().unwrap());
    assert!(total > 50 * 1024 * 1024 && total <= 64 * 1024 * 1024, "diskTotal {total}");
    assert!(used > 50 * 1024 * 1024, "diskUsed {used}");
    let (_, detail) = p.call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(detail["diskSizeMB"], 64, "{detail}");
    // Freeing space makes writes work again.
    let (code, out) = p.run(&sbx, "rm /tmp/fill && echo ok > /tmp/small && cat /tmp/small", None).await;
    assert_eq!((code, out.as_str()), (0, "ok\n"));
    // Killing the sandbox releases its disk and loop device.
    let rec = p.record(&id);
    let dir = p.state.join("sandboxes").join(&id);
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_nothing_left(&p, &id, rec["envd_pid"].as_i64().unwrap() as i32, &cgroups_of(&rec));
    assert!(wait_until(std::time::Duration::from_secs(5), || loop_devices_under(&dir).is_empty()), "loop device left");
}

fn rand_suffix() -> String {
    format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
}

/// The user namespace of a host pid (`user:[inode]`).
fn userns_of(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/user")).map(|l| l.to_string_lossy().into_owned()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn prepared_disks_and_user_namespaces_are_per_sandbox_and_die_with_the_provider() {
    require_root!();
    let mut p = Provider::start(&["--disk-limit-mb", "64"]);
    let pool = p.state.join("disk-pool");
    let secs = std::time::Duration::from_secs;
    // The pool fills in the background: its images are formatted and attached ahead of time.
    assert!(wait_until(secs(20), || loop_devices_under(&pool).len() >= 2), "no disk prepared ahead of time");
    let (a, b) = (p.create(json!({"templateID": "base"})).await, p.create(json!({"templateID": "base"})).await);
    let dirs: Vec<PathBuf> = [&a, &b].iter().map(|s| p.state.join("sandboxes").join(id_of(s))).collect();
    for dir in &dirs {
        assert_eq!(loop_devices_under(dir).len(), 1, "{}: one disk of its own", dir.display());
    }
    // Each sandbox has a user namespace of its own, neither the host's nor the other's.
    let pids: Vec<i32> = [&a, &b].iter().map(|s| p.record(&id_of(s))["envd_pid"].as_i64().unwrap() as i32).collect();
    let (ns_a, ns_b, host) = (userns_of(pids[0]), userns_of(pids[1]), userns_of(std::process::id() as i32));
    assert!(ns_a.starts_with("user:") && ns_a != ns_b && ns_a != host && ns_b != host, "{ns_a} {ns_b} {host}");
    let (code, out) = p.run(&a, "echo one > /tmp/f && cat /proc/self/uid_map", Some("root")).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), vec!["0", &HOST_BASE.to_string(), "65536"], "{out}");

    // A crashed provider's prepared disks are unmounted and their loop devices freed by the kernel
    // (nothing but its descriptors held them); the running sandboxes keep theirs.
    p.crash();
    assert!(wait_until(secs(10), || loop_devices_under(&pool).is_empty()), "{:?}", loop_devices_under(&pool));
    for dir in &dirs {
        assert_eq!(loop_devices_under(dir).len(), 1, "{}", dir.display());
    }
    // Restarted, it re-adopts them and prepares disks again from the images left in the pool.
    p.launch();
    let (code, out) = p.run(&a, "cat /tmp/f", None).await;
    assert_eq!((code, out.as_str()), (0, "one\n"));
    assert!(wait_until(secs(20), || !loop_devices_under(&pool).is_empty()), "pool not prepared again");
    for sbx in [&a, &b] {
        let id = id_of(sbx);
        let rec = p.record(&id);
        let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert_nothing_left(&p, &id, rec["envd_pid"].as_i64().unwrap() as i32, &cgroups_of(&rec));
    }
    // A clean stop releases everything too.
    let mut process = p.take_process();
    process.signal(nix::sys::signal::Signal::SIGTERM);
    process.wait_timeout(secs(30)).expect("the provider exits on SIGTERM");
    assert!(wait_until(secs(10), || loop_devices_under(&p.state).is_empty()), "{:?}", loop_devices_under(&p.state));
}

/// Watches the newest pids of its sandbox for `SECONDS` (argv[1]) and, for every process still
/// named `envd` (a command between envd's clone and its exec, sharing envd's memory and holding a
/// copy of envd's descriptors), tries its memory map, its descriptors and its environment. Prints how often it saw
/// such a process as uid 1000 and as uid 0, and how often it got through.
const PRE_EXEC_WATCHER: &str = r#"
import os, sys, time
end = time.time() + float(sys.argv[1])
seen = {"1000": 0, "0": 0}
exposed = []
def status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return ""
while time.time() < end:
    with open("/proc/loadavg") as f:
        last = int(f.read().split()[-1])
    for pid in range(last - 2, last + 6):
        text = status(pid)
        if not text.startswith("Name:\tenvd"):
            continue
        uid = next(l.split()[1] for l in text.splitlines() if l.startswith("Uid:"))
        seen[uid] = seen.get(uid, 0) + 1
        try:
            with open(f"/proc/{pid}/maps") as f:
                if "sandbox-mcp" in f.read():
                    exposed.append(f"maps of {pid}")
        except OSError:
            pass
        # Root may list the descriptors' numbers while the process is its own and dumpable (for
        # the write of its OOM score); what they are and what they hold stay out of reach.
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if status(pid).startswith("Name:\tenvd"):
                exposed.append(f"descriptor {fd} of {pid}: {target}")
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            if environ and status(pid).startswith("Name:\tenvd"):
                exposed.append(f"environment of {pid}")
        except OSError:
            pass
print(f"seen_user {seen['1000']} seen_root {seen['0']} exposed {len(exposed)} {exposed[:3]}")
"#;

/// envd starts a command by sharing its memory with the new process until the exec
/// (`clone(CLONE_VM | CLONE_VFORK)`), and that process holds a copy of envd's descriptors (host
/// ones among them) until the exec closes them. Code in the sandbox watching for such processes,
/// as the user and as root, sees them, but never reads their memory map or environment nor
/// follows their descriptors; and envd's own `/proc` entries stay owned by no user of the sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn commands_before_their_exec_expose_nothing_of_envd() {
    require_root!();
    let p = Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base"})).await;
    let (code, out) = p
        .run(&sbx, &format!("cat > /tmp/watch.py <<'EOF'\n{PRE_EXEC_WATCHER}EOF\nchmod 644 /tmp/watch.py"), None)
        .await;
    assert_eq!(code, 0, "{out}");
    for (watcher, commands) in [("user", &["user"][..]), ("root", &["root", "user"][..])] {
        let report = format!("/tmp/watch-{watcher}.out");
        let (code, out) =
            p.run(&sbx, &format!("setsid python3 /tmp/watch.py 6 > {report} 2>&1 < /dev/null &"), Some(watcher)).await;
        assert_eq!(code, 0, "{out}");
        // Commands started while the watcher runs, four at a time.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(6);
        let starts = futures_util::future::join_all((0..4).map(|i| {
            let (p, sbx) = (&p, &sbx);
            let user = commands[i % commands.len()];
            async move {
                let mut n = 0;
                while std::time::Instant::now() < until {
                    assert_eq!(p.run(sbx, "true", Some(user)).await.0, 0);
                    n += 1;
                }
                n
            }
        }))
        .await;
        let mut line = String::new();
        for _ in 0..100 {
            line = p.run(&sbx, &format!("cat {report} 2>/dev/null"), None).await.1;
            if line.starts_with("seen_user") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let figures: Vec<&str> = line.split_whitespace().collect();
        let figure = |name: &str| -> u64 {
            let at = figures.iter().position(|f| *f == name).unwrap_or_else(|| panic!("no {name}: {line}"));
            figures[at + 1].parse().unwrap()
        };
        assert_eq!(figure("exposed"), 0, "{watcher} reached envd through a starting command: {line}");
        // The watcher did see commands between clone and exec (else the test proved nothing).
        for user in commands {
            let seen = figure(if *user == "user" { "seen_user" } else { "seen_root" });
            assert!(seen > 0, "{watcher} never saw a {user} command before its exec in {starts:?} starts: {line}");
        }
    }
    // envd's memory stays non-dumpable after it started commands as root and as the user: its
    // `/proc` entries belong to the host's root, which the sandbox sees as the overflow uid.
    let (code, out) = p.run(&sbx, "stat -c %u /proc/1/status /proc/1/mem", Some("root")).await;
    assert_eq!((code, out.split_whitespace().collect::<Vec<_>>()), (0, vec!["65534", "65534"]), "{out}");
}
