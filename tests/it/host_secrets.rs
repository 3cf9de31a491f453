//! What an unprivileged user of the sandbox host, and code inside a sandbox, can learn that they
//! should not (issue 23 §2, §5): a task's secret environment values are in no host process's
//! argv or readable environment (also while a start waits on the sandbox's task server with its
//! spec in its environment) and no readable file of the state directory, and no argv names
//! the sandbox (scanned as `nobody`); inside a sandbox, PID 1's argv, mountinfo, `/proc/net/unix` and fd links do not name the host's
//! state directory and `/proc/config.gz` is masked; the standalone provider limits memory and
//! processes by default, as `serve`'s does. Needs root (skips loudly otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness, tasks_support};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Run as `nobody`: reads the marker (line 1), the state directory (line 2) and the needles (the
/// rest) from stdin, so none of them is in its own argv, then reads every `/proc/*/cmdline`,
/// `/proc/*/environ` and file under the state directory it may, and reports which needles it
/// found (raw, or in a base64-decoded argument or variable value) and whether it saw the marker.
const SCANNER: &str = r#"
import base64, binascii, json, os, sys
lines = sys.stdin.read().split("\n")
marker, state_dir = lines[0].encode(), lines[1]
needles = [n.encode() for n in lines[2:] if n]
seen = {"cmdline": 0, "environ": 0, "files": 0}
hits, marker_seen = [], False
def forms(data):
    out = [data]
    for item in data.split(b"\0"):
        for part in (item, item.split(b"=", 1)[-1]):
            try:
                out.append(base64.b64decode(part, validate=True))
            except (binascii.Error, ValueError):
                pass
    return out
def check(where, data):
    global marker_seen
    fs = forms(data)
    marker_seen = marker_seen or any(marker in f for f in fs)
    for i, n in enumerate(needles):
        if any(n in f for f in fs):
            hits.append({"where": where, "needle": i})
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for kind in ("cmdline", "environ"):
        try:
            with open("/proc/%s/%s" % (pid, kind), "rb") as f:
                data = f.read()
        except OSError:
            continue
        seen[kind] += 1
        check("/proc/%s/%s" % (pid, kind), data)
for root, dirs, files in os.walk(state_dir):
    for name in files:
        path = os.path.join(root, name)
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            continue
        seen["files"] += 1
        check(path, data)
print(json.dumps({"seen": seen, "hits": hits, "marker_seen": marker_seen}))
"#;

/// Runs [`SCANNER`] as uid/gid 65534 without supplementary groups.
fn scan_as_nobody(marker: &str, state_dir: &std::path::Path, needles: &[&str]) -> Value {
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "python3", "-I", "-c", SCANNER])
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) and python3");
    let input = format!("{marker}\n{}\n{}\n", state_dir.display(), needles.join("\n"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "scanner failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn random_hex() -> String {
    (0..16).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn task_secrets_are_in_no_host_argv_environ_or_readable_file() {
    common::require_root!();
    common::require_command!("setpriv");
    let (env, serve, mcp) = tasks_support::Env::local("").await;
    let sandbox_id = mcp.create_sandbox().await;
    let (secret, plain) = (format!("tok-{}", random_hex()), format!("plain-{}", random_hex()));
    let marker = format!("marker{}", random_hex());
    // Two commands, so bash does not exec `sleep` in its place: its own argv (the command, by
    // design, like `ps` shows any command) carries the marker the scanner must see.
    let command = format!("echo started; sleep 300; true {marker}");
    let envs = json!({"envs": {"API_TOKEN": secret, "PLAIN_SETTING": plain}});
    let task = mcp.start_task(&sandbox_id, &command, envs).await;
    let task_id = task["task_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = mcp.get_task(&sandbox_id, &task_id, json!({"wait_seconds": 2})).await;
        assert_eq!(v["state"], "running", "{v}");
        // (Output is held back while it could be the start of a secret: count it instead.)
        if v["stdout_total_bytes"].as_u64().is_some_and(|n| n > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "the task did not start: {v}");
    }

    let report = scan_as_nobody(&marker, &env.state_dir(), &[&secret, &plain, &sandbox_id]);
    assert!(report["seen"]["cmdline"].as_u64().unwrap() > 10, "{report}");
    assert_eq!(report["marker_seen"], true, "the scan saw the task's processes: {report}");
    assert_eq!(
        report["hits"],
        json!([]),
        "a task's env values (needles 0, 1) or the sandbox id (2) are readable to host users: {report}"
    );

    // The task still got them.
    let check = "test \"$API_TOKEN\" = \"$EXPECT_TOKEN\" && test \"$PLAIN_SETTING\" = \"$EXPECT_PLAIN\" && echo same";
    let v = mcp
        .start_task(
            &sandbox_id,
            check,
            json!({"envs": {"API_TOKEN": secret, "PLAIN_SETTING": plain, "EXPECT_TOKEN": secret, "EXPECT_PLAIN": plain}}),
        )
        .await;
    let check_id = v["task_id"].as_str().unwrap();
    mcp.wait_done(&sandbox_id, check_id, Duration::from_secs(30)).await;
    let done = mcp.get_task(&sandbox_id, check_id, json!({})).await;
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("same\n")), "{done}");
    let c = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    assert_eq!(c["state"], "cancelled", "{c}");

    // A supervisor that vanished ends before reading its stdin: the gateway reinstalls it and the
    // launch (spec on stdin again) still runs once.
    let rm = json!({"sandbox_id": sandbox_id, "command": "rm -rf /home/user/.sandbox-mcp/supervisor.py /home/user/.sandbox-mcp/__pycache__"});
    assert_eq!(mcp.call("run_command", rm).await.ok()["exit_code"], 0);
    let v = mcp.start_task(&sandbox_id, "echo again", json!({"envs": {"API_TOKEN": secret}})).await;
    let again = v["task_id"].as_str().unwrap();
    mcp.wait_done(&sandbox_id, again, Duration::from_secs(30)).await;
    let done = mcp.get_task(&sandbox_id, again, json!({})).await;
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("again\n")), "{done}");
    drop(serve);
}

/// The task server's client holds a start's spec (base64 JSON with the task's env values) in its
/// environment while it waits for the server: with the sandbox's task channel killed (so the start
/// takes the bash client) and the server stopped, that client waits, and `nobody` on the host scans
/// every process then (the scanner also decodes base64 values).
#[tokio::test(flavor = "multi_thread")]
async fn a_start_waiting_on_the_task_server_shows_host_users_no_spec() {
    common::require_root!();
    common::require_command!("setpriv");
    let (env, serve, mcp) = tasks_support::Env::local("").await;
    let sandbox_id = mcp.create_sandbox().await;
    let marker = format!("marker{}", random_hex());
    let first = mcp.start_task(&sandbox_id, &format!("sleep 300; true {marker}"), json!({})).await;
    let pid_file = format!("/home/user/.sandbox-mcp/server-{}.pid", sandbox_mcp::tasks::supervisor_version());
    let signal = |sig: &str| {
        json!({"sandbox_id": sandbox_id, "command": format!("while ! test -s {pid_file}; do sleep 0.05; done; \
              kill -{sig} $(cut -d' ' -f1 {pid_file})")})
    };
    // The sandbox's task channel (opened beside the first start) would take the next start:
    // killed (with its spare, a fork of it with the same command line), it leaves that start to
    // the bash client.
    let kill_channel = "for i in $(seq 100); do c=$(for p in /proc/[0-9]*; do \
        tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q ' channel $' && echo ${p#/proc/}; done); \
        test -n \"$c\" && break; sleep 0.05; done; kill -9 $c && for p in $c; do \
        while test -e /proc/$p; do sleep 0.02; done; done";
    let killed = mcp.call("run_command", json!({"sandbox_id": sandbox_id, "command": kill_channel})).await.ok();
    assert_eq!(killed["exit_code"], 0, "{killed}");
    assert_eq!(mcp.call("run_command", signal("STOP")).await.ok()["exit_code"], 0);

    let secret = format!("tok-{}", random_hex());
    let start = mcp.start_task(&sandbox_id, "echo late", json!({"envs": {"API_TOKEN": secret}}));
    let scan = async {
        // The client is waiting: a process whose environment holds the spec (read as root).
        let deadline = Instant::now() + Duration::from_secs(8);
        while !any_environ_holds(b"SANDBOX_MCP_TASK_SPEC=") {
            assert!(Instant::now() < deadline, "no waiting task client was seen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (marker, state_dir, needle) = (marker.clone(), env.state_dir(), secret.clone());
        let report =
            tokio::task::spawn_blocking(move || scan_as_nobody(&marker, &state_dir, &[&needle])).await.unwrap();
        let still_waiting = any_environ_holds(b"SANDBOX_MCP_TASK_SPEC=");
        assert_eq!(mcp.call("run_command", signal("CONT")).await.ok()["exit_code"], 0);
        (report, still_waiting)
    };
    let (started, (report, still_waiting)) = tokio::join!(start, scan);
    assert!(still_waiting, "the scan ran while the client waited");
    assert_eq!(report["marker_seen"], true, "the scan saw the sandbox's processes: {report}");
    assert!(report["seen"]["environ"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["hits"], json!([]), "a waiting start's spec is readable to host users: {report}");
    // Woken, the server carried the start out.
    let task_id = started["task_id"].as_str().unwrap();
    mcp.wait_done(&sandbox_id, task_id, Duration::from_secs(30)).await;
    let done = mcp.get_task(&sandbox_id, task_id, json!({})).await;
    assert_eq!((done["state"].as_str(), done["stdout"].as_str()), (Some("succeeded"), Some("late\n")), "{done}");
    let _ = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": first["task_id"]})).await;
    drop(serve);
}

/// Whether some process's environment (read as root) contains `needle`.
fn any_environ_holds(needle: &[u8]) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("environ")).is_ok_and(|e| e.windows(needle.len()).any(|w| w == needle))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_sees_no_host_state_path_and_no_kernel_config() {
    harness::require_root!();
    let p = harness::Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base", "timeout": 120})).await;
    let id = harness::id_of(&sbx);
    let state = p.state.canonicalize().unwrap();
    let state_text = state.display().to_string();

    let probe = "cat /proc/self/mountinfo; echo ---; cat /proc/net/unix; echo ---; tr '\\0' ' ' < /proc/1/cmdline; \
                 echo; echo ---; \
                 for p in /proc/[0-9]*; do ls -l $p/fd/ $p/cwd $p/root $p/exe 2>/dev/null; done; echo ---; \
                 wc -c < /proc/config.gz; ls /proc/acpi 2>/dev/null | wc -l";
    for user in ["root", "user"] {
        let (code, out) = p.run(&sbx, probe, Some(user)).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("overlay"), "mountinfo was read: {out}");
        assert!(out.contains("envd.sock"), "/proc/net/unix lists the agent's socket by its name: {out}");
        assert!(!out.contains(&state_text), "{user} in the sandbox sees the host state dir {state_text}: {out}");
        assert!(!out.contains("/sandboxes/"), "{user} in the sandbox sees a host sandbox path: {out}");
        let tail: Vec<&str> = out.rsplit("---").next().unwrap().split_whitespace().collect();
        assert_eq!(tail, ["0", "0"], "/proc/config.gz and /proc/acpi are masked: {out}");
    }
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert!(status.is_success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standalone_provider_limits_memory_and_processes_by_default() {
    harness::require_root!();
    let p = harness::Provider::start(&[]);
    let sbx = p.create(json!({"templateID": "base", "timeout": 120})).await;
    let id = harness::id_of(&sbx);
    let cgroups = harness::cgroups_of(&p.record(&id));
    assert!(!cgroups.is_empty(), "the host has no usable cgroups");
    let read =
        |file: &str| cgroups.iter().find_map(|cg| std::fs::read_to_string(std::path::Path::new(cg).join(file)).ok());
    let memory = read("memory.max").or_else(|| read("memory.limit_in_bytes")).expect("a memory cgroup");
    assert_eq!(memory.trim(), (2048u64 * 1024 * 1024).to_string(), "the default memory limit is 2 GiB");
    assert_eq!(read("pids.max").expect("a pids cgroup").trim(), "1024", "the default process limit is 1024");
    // The same defaults as `serve`'s embedded provider, from one place.
    let serve = sandbox_mcp::config::LocalConfig::default();
    assert_eq!((serve.memory_limit_mb, serve.pids_limit), (Some(2048), Some(1024)));
    // And 0 still means no limit.
    let unlimited = harness::Provider::start(&["--memory-limit-mb", "0", "--pids-limit", "0"]);
    let sbx2 = unlimited.create(json!({"templateID": "base", "timeout": 120})).await;
    let cgroups2 = harness::cgroups_of(&unlimited.record(&harness::id_of(&sbx2)));
    for cg in &cgroups2 {
        if let Ok(v) = std::fs::read_to_string(std::path::Path::new(cg).join("pids.max")) {
            assert_eq!(v.trim(), "max");
        }
    }
    for (prov, sid) in [(&p, id), (&unlimited, harness::id_of(&sbx2))] {
        let (status, _) = prov.call(reqwest::Method::DELETE, &format!("/sandboxes/{sid}"), None).await;
        assert!(status.is_success());
    }
}
