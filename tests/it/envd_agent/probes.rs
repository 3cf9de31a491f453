//! Tests that need envd in a separate process (RSS, orphan reaping as a
//! subreaper) or an external client (the official E2B Python SDK).

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_mcp::local::envd::{self, EnvdOptions};
use sandbox_mcp::procfs::rss_kib;
use serde_json::json;

use super::support::*;
use crate::common::{ProcessGuard, eventually, require_env, require_root};

/// Helper process for `idle_envd_rss`: serves envd on a current-thread runtime until killed.
#[test]
#[ignore = "helper process started by idle_envd_rss"]
fn rss_probe_child() {
    let Ok(socket) = std::env::var("ENVD_RSS_PROBE_SOCKET") else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // As a child subreaper, orphans are re-parented to us the way they are to PID 1.
    let reap_orphans = std::env::var_os("ENVD_PROBE_REAP_ORPHANS").is_some();
    if reap_orphans {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
    }
    runtime.block_on(async move {
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let opts = EnvdOptions {
            sandbox_id: "rss".into(),
            env_vars: Default::default(),
            default_user: "root".into(),
            reap_orphans,
        };
        envd::serve_std(listener, opts).await.unwrap();
    });
}

/// envd in a process of its own (this test binary running `rss_probe_child`), once it listens, and
/// a client of it.
async fn envd_process(reap_orphans: bool) -> (ProcessGuard, TestEnvd) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("envd.sock");
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["envd_agent::probes::rss_probe_child", "--exact", "--ignored", "--test-threads=1", "--nocapture"])
        .env("ENVD_RSS_PROBE_SOCKET", &socket)
        .stdout(std::process::Stdio::null());
    if reap_orphans {
        command.env("ENVD_PROBE_REAP_ORPHANS", "1");
    }
    let child = ProcessGuard::spawn(&mut command, Duration::ZERO).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, TestEnvd { _dir: dir, socket, server: tokio::spawn(async { Ok(()) }) })
}

/// RSS of an idle envd in its own process (an upper bound: the libtest harness is included).
#[tokio::test]
async fn idle_envd_rss() {
    require_root!();
    let (mut child, envd) = envd_process(false).await;
    let ok = envd.run("echo warm", json!({}), &[]).await;
    assert_eq!(ok.stdout, b"warm\n");
    let rss = |pid: u32| -> u64 { rss_kib(i32::try_from(pid).unwrap()).expect("VmRSS of the envd child") };
    let idle = rss(child.pid());
    // 100 running processes whose clients disconnected.
    let mut pids = Vec::new();
    for _ in 0..100 {
        let request = json!({"process": {"cmd": "sleep", "args": ["30"]}, "stdin": false});
        let mut stream = envd.open_stream("process.Process/Start", request, &[]).await;
        pids.push(stream.next_json().await.1["event"]["start"]["pid"].as_u64().unwrap());
    }
    let busy = rss(child.pid());
    for pid in &pids {
        let kill = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
        assert_eq!(envd.unary("process.Process/SendSignal", kill, None).await.0, http::StatusCode::OK);
    }
    child.terminate(Duration::ZERO);
    println!(
        "envd process RSS (debug build, incl. libtest): idle {idle} KiB, with 100 processes {busy} KiB ({} KiB each)",
        busy.saturating_sub(idle) / 100
    );
    assert!(idle < 64 * 1024, "RSS {idle} KiB");
}

/// With `reap_orphans`, envd collects re-parented orphans (no zombies), and still reports its own exits.
#[tokio::test]
async fn orphans_are_reaped() {
    require_root!();
    let (mut child, envd) = envd_process(true).await;
    let result = envd.run("sleep 0.3 >/dev/null 2>&1 & echo $!; exit 4", json!({}), &[]).await;
    assert_eq!(result.end.unwrap()["exitCode"], 4);
    let orphan: u32 = String::from_utf8_lossy(&result.stdout).trim().parse().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{orphan}/stat")).unwrap_or_default();
    let parent_field = stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().nth(1).unwrap_or("").to_owned());
    let reparented = parent_field.as_deref() == Some(child.pid().to_string().as_str());
    let gone = eventually(Duration::from_secs(10), || async { !Path::new(&format!("/proc/{orphan}")).exists() }).await;
    child.terminate(Duration::ZERO);
    assert!(reparented, "orphan {orphan} was not re-parented to envd: {stat}");
    assert!(gone, "orphan {orphan} was left as a zombie");
}

/// The official E2B Python SDK (debug mode, `sandbox_url` pointed at a TCP
/// port that relays to the envd socket) runs commands and file operations.
/// Needs `E2B_SDK_PYTHON` = a python with `e2b==2.63.0`; skips loudly otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdk_interop() {
    let python = require_env!("E2B_SDK_PYTHON", "a python with e2b==2.63.0");
    require_root!();
    let envd = start_envd().await;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let socket = envd.socket.clone();
    let relay = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = tcp.accept().await else { return };
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::UnixStream::connect(&socket).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let scratch = tempfile::tempdir().unwrap();
    let script = scratch.path().join("sdk_probe.py");
    std::fs::write(&script, include_str!("sdk_probe.py")).unwrap();
    let work = scratch.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}"))
            .arg(&work)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    relay.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && stdout.contains("SDK-PROBE OK"), "SDK probe failed");
}
