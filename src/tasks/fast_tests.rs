//! The task fast path against a real supervisor and fork server on this host
//! (no sandbox): later starts and cancels run no python3, a dead or stale
//! server is replaced, a silent one makes a start `unknown` without running it
//! twice, and the spec never reaches a task's environment.

use std::time::{Duration, Instant};

use super::TaskState;
use super::id::TaskId;
use super::local_tests::{
    LocalPython, a_stopped_answerer_runs_a_start_once, after_a_first_start, page, signal, spec, start, wait_terminal,
};
use super::service::TaskService;

/// Waits until the fork server's pid file names a live process; returns its pid.
async fn server_up(t: &LocalPython) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = t.server_pid()
            && std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no task server came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A service whose sandbox (this host) has a task server, forked by a first start; its pid.
async fn with_a_server() -> (LocalPython, TaskService, i32) {
    let (t, svc) = after_a_first_start(LocalPython::new()).await;
    let server = server_up(&t).await;
    (t, svc, server)
}

#[tokio::test]
async fn later_starts_and_cancels_run_no_python3() {
    let t = LocalPython::new();
    t.count_python_starts();
    let svc = t.service(&[]);
    let first = start(&svc, &t, "echo one").await;
    server_up(&t).await;
    let after_first = t.python_starts();
    assert!(after_first >= 1, "the first start runs python3");

    let second = start(&svc, &t, "echo two; echo err >&2").await;
    let sleeper = start(&svc, &t, "trap 'exit 0' TERM; sleep 30 & wait").await;
    let cancelled = svc.cancel(&t, "sbx", &sleeper, &page(0, 0, 100)).await.unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelled, "{cancelled:?}");
    assert_eq!(cancelled.cancel_confirmed, Some(true));
    assert_eq!(t.python_starts(), after_first, "the server served the second start and the cancel");

    for (id, out) in [(&first, "one\n"), (&second, "two\n")] {
        let v = wait_terminal(&svc, &t, id).await;
        assert_eq!((v.state, v.stdout.as_str()), (TaskState::Succeeded, out), "{v:?}");
    }
    // The same id again, through the server: refused ("exists" reads as an uncertain launch), not
    // run twice.
    let before = t.python_starts(); // wait_terminal's waiting reads run python3
    let again = svc.start(&t, "sbx", &second, &spec("echo again", &[], None)).await.unwrap();
    assert_eq!(again.state, TaskState::Unknown, "{again:?}");
    assert!(again.error.as_deref().is_some_and(|e| e.contains("already exists")), "{again:?}");
    assert_eq!(t.python_starts(), before, "the refusal came from the server");
    let v = wait_terminal(&svc, &t, &second).await;
    assert_eq!(v.stdout, "two\n");
}

#[tokio::test]
async fn a_dead_or_stale_server_is_replaced_and_running_tasks_go_on() {
    let t = LocalPython::new();
    t.count_python_starts();
    let svc = t.service(&[]);
    start(&svc, &t, "true").await;
    let server = server_up(&t).await;
    let long = start(&svc, &t, "sleep 1; echo done").await;
    signal(server, nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{server}")).exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = t.python_starts();
    let id = start(&svc, &t, "echo after").await;
    assert_eq!(t.python_starts(), before + 1, "no live server: python3 started the task");
    assert_eq!(wait_terminal(&svc, &t, &id).await.stdout, "after\n");
    let v = wait_terminal(&svc, &t, &long).await;
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Succeeded, "done\n"), "a server's death touches no task");
    let replacement = server_up(&t).await;
    assert_ne!(replacement, server);

    // A pid file naming another process (pid 1, another start time): not used.
    std::fs::write(t.server_pid_file(), "1 0\n").unwrap();
    let before = t.python_starts();
    let id = start(&svc, &t, "echo stale").await;
    assert_eq!(t.python_starts(), before + 1);
    assert_eq!(wait_terminal(&svc, &t, &id).await.stdout, "stale\n");
    signal(replacement, nix::sys::signal::Signal::SIGKILL);
}

#[tokio::test]
async fn a_silent_server_makes_a_start_unknown_and_it_never_runs_twice() {
    let (t, svc, server) = with_a_server().await;
    a_stopped_answerer_runs_a_start_once(&svc, &t, server).await;
    let queue = t.server_pid_file().with_file_name("queue");
    let left: Vec<_> = std::fs::read_dir(&queue).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".req")), "the request was claimed: {left:?}");
}

#[tokio::test]
async fn the_spec_never_reaches_a_tasks_environment() {
    let t = LocalPython::new();
    t.count_python_starts();
    let svc = t.service(&[]);
    let cmd = "env | grep -c '^SANDBOX_MCP_TASK_SPEC=' || true; echo \"$MY_VAR\"";
    for round in 0..2 {
        // The first through python3, the second through the server.
        let before = t.python_starts();
        let id = TaskId::generate();
        svc.start(&t, "sbx", &id, &spec(cmd, &[("MY_VAR", "visible")], None)).await.unwrap();
        assert_eq!(t.python_starts() == before, round == 1, "round {round}: only the second through the server");
        let v = wait_terminal(&svc, &t, &id).await;
        assert_eq!(v.stdout, "0\nvisible\n", "{v:?}");
        server_up(&t).await;
    }
}

#[tokio::test]
async fn a_running_tasks_known_daemon_answers_get_task_in_one_round_of_reads() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let id = start(&svc, &t, "echo started; sleep 30").await;
    // The daemon is known once a status confirmed it through `/proc/PID/cwd` with no process
    // started, after the command started. Until then (the start answers before the daemon runs, and
    // the daemon leaves its task's directory for the moment of the command's spawn) a status may
    // find it out of its directory and leave the answer to the supervisor.
    let by_path = format!("{id}/status.json");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        t.reads.lock().unwrap().clear();
        let execs = t.execs.load(std::sync::atomic::Ordering::SeqCst);
        let status = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
        assert_eq!(status.state, TaskState::Running);
        let through_daemon = t.reads.lock().unwrap().iter().any(|p| p.starts_with("/proc/"))
            && t.execs.load(std::sync::atomic::Ordering::SeqCst) == execs;
        if through_daemon && status.stdout == "started\n" {
            break;
        }
        assert!(Instant::now() < deadline, "no status confirmed the running command's daemon: {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.reads.lock().unwrap().clear();
    let execs = t.execs.load(std::sync::atomic::Ordering::SeqCst);
    let second = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
    assert_eq!(second.state, TaskState::Running);
    let reads = t.reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 3, "the daemon's record and both pages: {reads:?}");
    assert!(reads.iter().any(|p| p.starts_with("/proc/") && p.ends_with("/cwd/status.json")), "{reads:?}");
    assert!(!reads.iter().any(|p| p.ends_with(&by_path)), "{reads:?}");
    assert_eq!(t.execs.load(std::sync::atomic::Ordering::SeqCst), execs, "no process");
    // Cancelled, the daemon is gone: the next read finds the record again by its path.
    svc.cancel(&t, "sbx", &id, &page(0, 0, 100)).await.unwrap();
    let done = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
    assert_eq!((done.state, done.stdout.as_str()), (TaskState::Cancelled, "started\n"));
}

#[tokio::test]
async fn a_server_that_ends_without_answering_makes_a_start_unknown_at_once() {
    let (t, svc, server) = with_a_server().await;
    // Stopped, the server takes no request; killed once the client waits, it never answers.
    signal(server, nix::sys::signal::Signal::SIGSTOP);
    let id = TaskId::generate();
    let task = spec("echo ran > ran-after-death", &[], None);
    let waiting = svc.start(&t, "sbx", &id, &task);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        signal(server, nix::sys::signal::Signal::SIGKILL);
        Instant::now()
    };
    let (started, killed_at) = tokio::join!(waiting, kill);
    let started = started.unwrap();
    let waited = killed_at.elapsed();
    assert_eq!(started.state, TaskState::Unknown, "{started:?}");
    assert!(started.error.as_deref().is_some_and(|e| e.contains("ended before it answered")), "{started:?}");
    assert!(waited < Duration::from_secs(3), "the client waited {waited:?} after the server's death");
    assert!(!t.home().join("ran-after-death").exists(), "nobody took the request");
}
