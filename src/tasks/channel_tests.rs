//! The task channel against the real supervisor on this host (no sandbox): the first start opens
//! it beside the bash path, later starts go through it with no process started, refusals and
//! masking hold, a dead channel sends starts back to the bash path until a new one greets, and a
//! silent one makes a start `unknown` without running it twice.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::TaskState;
use super::id::TaskId;
use super::local_tests::{
    LocalPython, a_stopped_answerer_runs_a_start_once, after_a_first_start, signal, spec, start, wait_terminal,
};
use super::service::TaskService;

/// Waits until sandbox "sbx" has a greeted channel; returns its process's pid.
async fn channel_up(svc: &TaskService) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(pid) = svc.channel_pid("sbx") {
            return pid;
        }
        assert!(Instant::now() < deadline, "no task channel came up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The parent pid of `pid`, from /proc/PID/stat.
fn parent_of(pid: i64) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

#[tokio::test]
async fn later_starts_go_through_the_channel_with_no_process_started() {
    let t = LocalPython::new().with_channels();
    t.count_python_starts();
    let svc = t.service(&["gateway-secret-1"]);
    let first = start(&svc, &t, "echo one").await;
    let channel = channel_up(&svc).await;
    let (execs, pythons) = (t.execs.load(Ordering::SeqCst), t.python_starts());

    let id = TaskId::generate();
    let envs = [("MY_TOKEN", "token-value-2")];
    let cmd = "echo \"two $MY_TOKEN gateway-secret-1\"; env | grep -c '^SANDBOX_MCP_TASK_SPEC=' || true; sleep 1";
    let started = svc.start(&t, "sbx", &id, &spec(cmd, &envs, None)).await.unwrap();
    assert_eq!(started.state, TaskState::Running, "{started:?}");
    assert_eq!(t.execs.load(Ordering::SeqCst), execs, "no process was started for the start");
    assert_eq!(t.python_starts(), pythons);
    // The task is run by the channel's spare daemon.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.home().join(format!(".sandbox-mcp/tasks/{id}/status.json"))).unwrap())
            .unwrap();
    let daemon = record["supervisor_pid"].as_i64().expect("a daemon is named");
    assert_eq!(parent_of(daemon), Some(channel), "{record}");

    let v = wait_terminal(&svc, &t, &id).await;
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Succeeded, "two *** ***\n0\n"), "{v:?}");
    assert_eq!(wait_terminal(&svc, &t, &first).await.stdout, "one\n");

    // The same id again: the channel's refusal, not a second run.
    let execs = t.execs.load(Ordering::SeqCst);
    let again = svc.start(&t, "sbx", &id, &spec("echo again", &[], None)).await.unwrap();
    assert!(again.error.as_deref().is_some_and(|e| e.contains("already exists")), "{again:?}");
    assert_eq!(t.execs.load(Ordering::SeqCst), execs, "the refusal came from the channel");
    signal(channel, nix::sys::signal::Signal::SIGKILL);
}

/// A transport with channels, its service, and the channel the first start opened.
async fn with_channel() -> (LocalPython, TaskService, i32) {
    let (t, svc) = after_a_first_start(LocalPython::new().with_channels()).await;
    let channel = channel_up(&svc).await;
    (t, svc, channel)
}

#[tokio::test]
async fn a_dead_channel_sends_starts_back_to_the_bash_path_until_a_new_one_greets() {
    let (t, svc, channel) = with_channel().await;
    signal(channel, nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while svc.channel_pid("sbx") == Some(channel) {
        assert!(Instant::now() < deadline, "the dead channel is still in use");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let execs = t.execs.load(Ordering::SeqCst);
    let id = start(&svc, &t, "echo after").await;
    assert!(t.execs.load(Ordering::SeqCst) > execs, "the bash path took the start");
    assert_eq!(wait_terminal(&svc, &t, &id).await.stdout, "after\n");
    let replacement = channel_up(&svc).await;
    assert_ne!(replacement, channel, "that start opened a new channel");
    let execs = t.execs.load(Ordering::SeqCst);
    let id = start(&svc, &t, "echo through the new one").await;
    assert_eq!(t.execs.load(Ordering::SeqCst), execs);
    assert_eq!(wait_terminal(&svc, &t, &id).await.stdout, "through the new one\n");
    signal(replacement, nix::sys::signal::Signal::SIGKILL);
}

#[tokio::test]
async fn a_silent_channel_makes_a_start_unknown_and_it_never_runs_twice() {
    let (t, svc, channel) = with_channel().await;
    a_stopped_answerer_runs_a_start_once(&svc, &t, channel).await;
    signal(channel, nix::sys::signal::Signal::SIGKILL);
}
