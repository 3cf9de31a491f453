//! Runs [`TaskService`] against the real supervisor script through a local
//! python3 (no sandbox): install on first use, reinstall of a missing or
//! outdated script, start / status / cancel / list, paging and masking.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::service::TaskService;
use super::transport::{ChannelIo, ExecOutput, FileSlice, SendInput, SupervisorTransport, TransportError};
use super::{SUPERVISOR_INSTALLS, TaskId, TaskState, launch::TaskSpec, page::PageRequest};
use crate::masking::Masker;

/// python3 on this host, with HOME pointing at a private temp directory.
pub(super) struct LocalPython {
    home: tempfile::TempDir,
    /// Installs done through this transport (the global counter is shared by parallel tests).
    installs: AtomicUsize,
    /// Processes run through this transport.
    pub(super) execs: AtomicUsize,
    /// The program of the last process run ("python3", "cat").
    last_program: std::sync::Mutex<String>,
    /// PATH for the processes run, when a test sets one.
    path: std::sync::Mutex<Option<String>>,
    /// Every path read through `read_range`, in order.
    pub(super) reads: std::sync::Mutex<Vec<String>>,
    /// Whether `open_channel` starts the supervisor's channel (else it is refused, as by a
    /// transport without one).
    channels: std::sync::atomic::AtomicBool,
}

impl LocalPython {
    pub(super) fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
            installs: AtomicUsize::new(0),
            execs: AtomicUsize::new(0),
            last_program: std::sync::Mutex::default(),
            path: std::sync::Mutex::default(),
            reads: std::sync::Mutex::default(),
            channels: std::sync::atomic::AtomicBool::new(false),
        }
    }
    /// Lets starts open the supervisor's channel (a local process with piped stdio).
    pub(super) fn with_channels(self) -> Self {
        self.channels.store(true, Ordering::SeqCst);
        self
    }
    pub(super) fn last_program(&self) -> String {
        self.last_program.lock().unwrap().clone()
    }
    pub(super) fn installs(&self) -> usize {
        self.installs.load(Ordering::SeqCst)
    }
    pub(super) fn home(&self) -> &std::path::Path {
        self.home.path()
    }
    pub(super) fn script(&self) -> PathBuf {
        self.home.path().join(".sandbox-mcp/supervisor.py")
    }
    pub(super) fn service(&self, secrets: &[&str]) -> TaskService {
        TaskService::with_script_path(self.script().to_str().unwrap(), Masker::new(secrets).unwrap())
    }
    /// The task server's pid file, and the pid it names (if any).
    pub(super) fn server_pid_file(&self) -> PathBuf {
        self.home.path().join(format!(".sandbox-mcp/server-{}.pid", super::supervisor_version()))
    }
    pub(super) fn server_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.server_pid_file()).ok()?;
        text.split_whitespace().next()?.parse().ok()
    }
    /// Puts a `python3` first on the processes' PATH that counts its starts.
    pub(super) fn count_python_starts(&self) {
        let dir = self.home.path().join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let real = std::process::Command::new("/bin/sh").args(["-c", "command -v python3"]).output().unwrap();
        let real = String::from_utf8(real.stdout).unwrap().trim().to_owned();
        let count = self.home.path().join("python3-starts");
        let wrapper = format!("#!/bin/sh\necho >> '{}'\nexec '{real}' \"$@\"\n", count.display());
        std::fs::write(dir.join("python3"), wrapper).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("python3"), std::fs::Permissions::from_mode(0o755)).unwrap();
        *self.path.lock().unwrap() = Some(format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default()));
    }
    pub(super) fn python_starts(&self) -> usize {
        std::fs::read_to_string(self.home.path().join("python3-starts")).map(|s| s.lines().count()).unwrap_or(0)
    }
}

impl Drop for LocalPython {
    /// The task server outlives its calls (as in a sandbox): end it with the test.
    fn drop(&mut self) {
        if let Some(pid) = self.server_pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl SupervisorTransport for LocalPython {
    async fn exec(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        use tokio::io::AsyncWriteExt;
        self.execs.fetch_add(1, Ordering::SeqCst);
        argv[0].clone_into(&mut self.last_program.lock().unwrap());
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).env("HOME", self.home.path()).envs(env).kill_on_drop(true);
        if let Some(path) = self.path.lock().unwrap().clone() {
            cmd.env("PATH", path);
        }
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| TransportError::NotSent(e.to_string()))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // As envd's transport: a process that ended without reading it answers for itself.
            let _ = pipe.write_all(&input).await;
        }
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| TransportError::Uncertain("timed out".into()))?
            .map_err(|e| TransportError::Uncertain(e.to_string()))?;
        Ok(ExecOutput { exit_code: out.status.code().unwrap_or(-1), stdout: out.stdout, stderr: out.stderr })
    }

    async fn open_channel(&self, argv: Vec<String>) -> Result<ChannelIo, TransportError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if !self.channels.load(Ordering::SeqCst) {
            return Err(TransportError::NotSent("no channels in this test".into()));
        }
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).env("HOME", self.home.path());
        if let Some(path) = self.path.lock().unwrap().clone() {
            cmd.env("PATH", path);
        }
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| TransportError::NotSent(e.to_string()))?;
        let stdin = std::sync::Arc::new(tokio::sync::Mutex::new(child.stdin.take().unwrap()));
        let mut stdout = child.stdout.take().unwrap();
        let (forward, output) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut buf = vec![0; 65536];
            while let Ok(n @ 1..) = stdout.read(&mut buf).await {
                if forward.send(buf[..n].to_vec()).await.is_err() {
                    break;
                }
            }
            let _ = child.wait().await;
        });
        let send: SendInput = Box::new(move |data| {
            let stdin = std::sync::Arc::clone(&stdin);
            Box::pin(async move {
                stdin.lock().await.write_all(&data).await.map_err(|e| TransportError::NotSent(e.to_string()))
            })
        });
        Ok(ChannelIo { send, output, forwarder: None })
    }

    async fn install(&self, path: &str, content: &'static [u8]) -> Result<(), TransportError> {
        self.installs.fetch_add(1, Ordering::SeqCst);
        let path = PathBuf::from(path);
        std::fs::create_dir_all(path.parent().unwrap()).map_err(|e| TransportError::NotSent(e.to_string()))?;
        let tmp = path.with_extension(format!("tmp{}", rand::random::<u32>()));
        std::fs::write(&tmp, content).map_err(|e| TransportError::NotSent(e.to_string()))?;
        std::fs::rename(&tmp, &path).map_err(|e| TransportError::NotSent(e.to_string()))
    }

    async fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Option<FileSlice>, TransportError> {
        use std::os::unix::fs::FileExt;
        self.reads.lock().unwrap().push(path.to_owned());
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TransportError::NotSent(e.to_string())),
        };
        let size = file.metadata().map_err(|e| TransportError::NotSent(e.to_string()))?.len();
        let mut data = vec![0; len.min(size.saturating_sub(offset)) as usize];
        file.read_exact_at(&mut data, offset).map_err(|e| TransportError::NotSent(e.to_string()))?;
        Ok(Some(FileSlice { data, size }))
    }
}

pub(super) fn spec(command: &str, envs: &[(&str, &str)], timeout: Option<i64>) -> TaskSpec {
    let envs: BTreeMap<String, String> = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    TaskSpec::new(command.to_owned(), None, envs, timeout).unwrap()
}

/// Starts `command` (no extra environment, the default timeout) as a new task in sandbox "sbx".
pub(super) async fn start(svc: &TaskService, t: &LocalPython, command: &str) -> TaskId {
    let id = TaskId::generate();
    svc.start(t, "sbx", &id, &spec(command, &[], None)).await.unwrap();
    id
}

pub(super) fn page(out: i64, err: i64, limit: i64) -> PageRequest {
    PageRequest::new(Some(out), Some(err), Some(limit)).unwrap()
}

pub(super) async fn wait_terminal(svc: &TaskService, t: &LocalPython, id: &TaskId) -> super::view::TaskView {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = svc.status(t, "sbx", id, &page(0, 0, 65_536), 2.0).await.unwrap();
        if v.state.is_terminal() || Instant::now() > deadline {
            return v;
        }
    }
}

/// The service of `t` after a first start (`true`), which forks the task server and opens the
/// channel when `t` has channels.
pub(super) async fn after_a_first_start(t: LocalPython) -> (LocalPython, TaskService) {
    let svc = t.service(&[]);
    start(&svc, &t, "true").await;
    (t, svc)
}

/// Sends `sig` to `pid`.
pub(super) fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

/// With `answerer` (the task server, or the channel) stopped, a start reads `unknown`; woken, it
/// carries the start out exactly once, and the same id is refused afterwards.
pub(super) async fn a_stopped_answerer_runs_a_start_once(svc: &TaskService, t: &LocalPython, answerer: i32) {
    signal(answerer, nix::sys::signal::Signal::SIGSTOP);
    let id = TaskId::generate();
    let started = svc.start(t, "sbx", &id, &spec("echo once >> ran; echo ran", &[], None)).await.unwrap();
    assert_eq!(started.state, TaskState::Unknown, "{started:?}");
    assert!(started.error.as_deref().is_some_and(|e| e.contains("did not answer within 10 s")), "{started:?}");
    // Woken, it carries the request out once; its answer finds nobody waiting.
    signal(answerer, nix::sys::signal::Signal::SIGCONT);
    let v = wait_terminal(svc, t, &id).await;
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Succeeded, "ran\n"), "{v:?}");
    let again = svc.start(t, "sbx", &id, &spec("echo twice >> ran", &[], None)).await.unwrap();
    assert!(again.error.as_deref().is_some_and(|e| e.contains("already exists")), "{again:?}");
    // The command ran in HOME (the default cwd) exactly once.
    assert_eq!(std::fs::read_to_string(t.home().join("ran")).unwrap(), "once\n");
}

#[tokio::test]
async fn installs_once_then_runs_tasks_and_pages_output() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let before = SUPERVISOR_INSTALLS.load(Ordering::Relaxed);
    let id = TaskId::generate();
    let started =
        svc.start(&t, "sbx", &id, &spec("printf 'hello\\nworld'; echo oops >&2; exit 3", &[], None)).await.unwrap();
    assert_eq!(started.task_id, id.as_str());
    assert!(matches!(started.state, TaskState::Running | TaskState::Failed), "{started:?}");
    assert!(SUPERVISOR_INSTALLS.load(Ordering::Relaxed) > before);
    assert!(t.script().exists());
    assert_eq!(t.installs(), 1);

    let v = wait_terminal(&svc, &t, &id).await;
    assert_eq!(v.state, TaskState::Failed);
    assert_eq!(v.exit_code, Some(3));
    assert_eq!(v.stdout, "hello\nworld");
    assert_eq!(v.stderr, "oops\n");
    assert!(v.finished_at.unwrap() >= v.started_at.unwrap());
    // Odd-sized pages reassemble exactly; replay is identical.
    let p = svc.status(&t, "sbx", &id, &page(3, 1, 4), 0.0).await.unwrap();
    assert_eq!((p.stdout.as_str(), p.stdout_next_offset), ("lo\nw", 7));
    assert_eq!((p.stderr.as_str(), p.stderr_next_offset), ("ops\n", 5));
    let again = svc.status(&t, "sbx", &id, &page(3, 1, 4), 0.0).await.unwrap();
    assert_eq!((again.stdout, again.stderr), (p.stdout, p.stderr));

    let list = svc.list(&t, "sbx").await.unwrap();
    assert_eq!(list.tasks.len(), 1);
    assert_eq!(list.tasks[0].command_first_line.as_deref(), Some("printf 'hello\\nworld'; echo oops >&2; exit 3"));
    // Unknown task: a clear error.
    let err = svc.status(&t, "sbx", &TaskId::generate(), &page(0, 0, 10), 0.0).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test]
async fn missing_or_outdated_script_is_reinstalled() {
    let t = LocalPython::new();
    std::fs::create_dir_all(t.script().parent().unwrap()).unwrap();
    // A working supervisor of another version: only the version comparison can trigger the reinstall.
    std::fs::write(t.script(), "def main(argv):\n    print('{\"version\": \"0\"}')\n    return 0\n").unwrap();
    let svc = t.service(&[]);
    let list = svc.list(&t, "sbx").await.unwrap();
    assert!(list.tasks.is_empty());
    assert_eq!(std::fs::read_to_string(t.script()).unwrap(), super::SUPERVISOR_SOURCE);
    assert_eq!(t.installs(), 1);
    // The current version is not reinstalled (a new service has an empty cache).
    let fresh = t.service(&[]);
    assert!(fresh.list(&t, "sbx").await.unwrap().tasks.is_empty());
    assert_eq!(t.installs(), 1);
    // Cached now; delete the script: the next call notices and reinstalls.
    std::fs::remove_file(t.script()).unwrap();
    assert!(svc.list(&t, "sbx").await.unwrap().tasks.is_empty());
    assert_eq!(t.installs(), 2);
    assert!(t.script().exists());
}

#[tokio::test]
async fn secrets_are_masked_by_supervisor_and_gateway() {
    let t = LocalPython::new();
    let svc = t.service(&["gateway-secret-value"]);
    let id = TaskId::generate();
    let cmd = "printf 'a:%s b:%s c:gateway-secret-valuX d:%s\\n' \"$API_TOKEN\" gateway-secret-value my-token-valuX";
    svc.start(&t, "sbx", &id, &spec(cmd, &[("API_TOKEN", "my-token-value")], None)).await.unwrap();
    let v = wait_terminal(&svc, &t, &id).await;
    assert_eq!(v.state, TaskState::Succeeded, "{v:?}");
    assert_eq!(v.stdout, "a:*** b:*** c:gateway-secret-valuX d:my-token-valuX\n");
    // A page edge inside the gateway secret: both pages show only a mask.
    let p1 = svc.status(&t, "sbx", &id, &page(0, 0, 14), 0.0).await.unwrap();
    assert_eq!(p1.stdout, "a:*** b:***");
    let p2 = svc.status(&t, "sbx", &id, &page(14, 0, 20), 0.0).await.unwrap();
    assert_eq!(p2.stdout, "*** c:gat");
}

#[tokio::test]
async fn cancel_and_timeout_end_tasks() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let id = start(&svc, &t, "echo go; sleep 30").await;
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 5.0).await.unwrap();
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Running, "go\n"));
    let c = svc.cancel(&t, "sbx", &id, &page(0, 0, 100)).await.unwrap();
    assert_eq!(c.state, TaskState::Cancelled);
    assert_eq!(c.cancel_confirmed, Some(true));
    // Cancelling again returns the saved outcome.
    let c2 = svc.cancel(&t, "sbx", &id, &page(0, 0, 100)).await.unwrap();
    assert_eq!((c2.state, c2.finished_at), (TaskState::Cancelled, c.finished_at));

    let id = TaskId::generate();
    svc.start(&t, "sbx", &id, &spec("sleep 30", &[], Some(1))).await.unwrap();
    let v = wait_terminal(&svc, &t, &id).await;
    assert_eq!(v.state, TaskState::TimedOut);
}

#[tokio::test]
async fn concurrent_first_calls_install_once() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let starts = (0..8).map(|_| {
        let (svc, t) = (&svc, &t);
        async move {
            let id = TaskId::generate();
            let s = svc.start(t, "sbx-concurrent", &id, &spec("echo hi", &[], None)).await.unwrap();
            assert_ne!(s.state, TaskState::Unknown, "{s:?}");
            id
        }
    });
    let ids = futures_util::future::join_all(starts).await;
    assert_eq!(t.installs(), 1, "eight concurrent first calls install once");
    for id in &ids {
        let v = wait_terminal(&svc, &t, id).await;
        assert_eq!((v.state, v.stdout.as_str()), (TaskState::Succeeded, "hi\n"));
    }
}

/// Both read paths of get_task, as JSON (what the agent would see).
async fn both_views(
    svc: &TaskService,
    t: &LocalPython,
    id: &TaskId,
    p: PageRequest,
) -> (serde_json::Value, serde_json::Value) {
    let direct = svc.status_direct(t, "sbx", id, &p).await.unwrap().expect("the direct path answers");
    let supervisor = svc.status_via_supervisor(t, "sbx", id, &p, 0.0).await.unwrap();
    (serde_json::to_value(direct).unwrap(), serde_json::to_value(supervisor).unwrap())
}

fn status_json(t: &LocalPython, id: &TaskId) -> serde_json::Value {
    let path = t.home.path().join(format!(".sandbox-mcp/tasks/{id}/status.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test]
async fn direct_reads_match_the_supervisor_in_every_state() {
    let t = LocalPython::new();
    let svc = t.service(&["gateway-secret-value"]);
    let pages = [page(0, 0, 16_384), page(3, 1, 5), page(9, 0, 7), page(4_000, 4_000, 10)];
    let output = "printf 'out gateway-secret-value é-x\\n'; printf 'err\\n' >&2";

    // Running, with output already stored.
    let running = TaskId::generate();
    svc.start(&t, "sbx", &running, &spec(&format!("{output}; sleep 30"), &[], None)).await.unwrap();
    let v = svc.status(&t, "sbx", &running, &page(0, 0, 100), 5.0).await.unwrap();
    assert_eq!((v.state, v.stderr.as_str()), (TaskState::Running, "err\n"));
    for p in pages {
        let (direct, supervisor) = both_views(&svc, &t, &running, p).await;
        assert_eq!(direct, supervisor, "running, {p:?}");
    }

    // Its supervisor killed: both read `unknown`, with the same explanation.
    let record = status_json(&t, &running);
    let (daemon, group) = (record["supervisor_pid"].as_i64().unwrap(), record["pgid"].as_i64().unwrap());
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon as i32), nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(format!("/proc/{daemon}/stat")).is_ok_and(|s| !String::from_utf8_lossy(&s).contains(") Z "))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its record names this sandbox instance (`origin`): the direct path leaves it to the
    // supervisor, the only one that can tell a dead daemon from a copy of another sandbox.
    for p in pages {
        assert!(svc.status_direct(&t, "sbx", &running, &p).await.unwrap().is_none());
        let v = svc.status(&t, "sbx", &running, &p, 0.0).await.unwrap();
        assert_eq!((v.state, v.error.as_deref()), (TaskState::Unknown, Some(super::direct::SUPERVISOR_GONE)));
    }
    // An older supervisor's record (no origin; nothing writes it any more): both paths decide.
    let path = t.home.path().join(format!(".sandbox-mcp/tasks/{running}/status.json"));
    let mut old = status_json(&t, &running);
    old.as_object_mut().unwrap().remove("origin").expect("an origin is recorded");
    std::fs::write(&path, old.to_string()).unwrap();
    for p in pages {
        let (direct, supervisor) = both_views(&svc, &t, &running, p).await;
        assert_eq!(direct["state"], "unknown", "{direct}");
        assert_eq!(direct, supervisor, "supervisor gone, {p:?}");
    }
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group as i32), nix::sys::signal::Signal::SIGKILL);

    // Finished in each terminal state.
    let failed = TaskId::generate();
    svc.start(&t, "sbx", &failed, &spec(&format!("{output}; exit 3"), &[], None)).await.unwrap();
    let succeeded = TaskId::generate();
    svc.start(&t, "sbx", &succeeded, &spec(output, &[], None)).await.unwrap();
    let timed_out = TaskId::generate();
    svc.start(&t, "sbx", &timed_out, &spec(&format!("{output}; sleep 30"), &[], Some(1))).await.unwrap();
    let cancelled = TaskId::generate();
    svc.start(&t, "sbx", &cancelled, &spec(&format!("{output}; sleep 30"), &[], None)).await.unwrap();
    assert_eq!(svc.cancel(&t, "sbx", &cancelled, &page(0, 0, 1)).await.unwrap().state, TaskState::Cancelled);
    for (id, state) in [
        (&failed, TaskState::Failed),
        (&succeeded, TaskState::Succeeded),
        (&timed_out, TaskState::TimedOut),
        (&cancelled, TaskState::Cancelled),
    ] {
        assert_eq!(wait_terminal(&svc, &t, id).await.state, state);
        for p in pages {
            let (direct, supervisor) = both_views(&svc, &t, id, p).await;
            assert_eq!(direct, supervisor, "{state:?}, {p:?}");
        }
    }
}

#[tokio::test]
async fn direct_reads_leave_unfamiliar_records_to_the_supervisor() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let id = start(&svc, &t, "echo hi").await;
    assert_eq!(wait_terminal(&svc, &t, &id).await.state, TaskState::Succeeded);
    let path = t.home.path().join(format!(".sandbox-mcp/tasks/{id}/status.json"));
    let p = page(0, 0, 100);
    assert!(svc.status_direct(&t, "sbx", &id, &p).await.unwrap().is_some());
    // A state this gateway does not know, an unreadable record, no record
    // yet, no task at all: the direct path declines and get_task still
    // answers through the supervisor.
    let mut record = status_json(&t, &id);
    record["state"] = "exploded".into();
    std::fs::write(&path, record.to_string()).unwrap();
    assert!(svc.status_direct(&t, "sbx", &id, &p).await.unwrap().is_none());
    assert_eq!(svc.status(&t, "sbx", &id, &p, 0.0).await.unwrap().state, TaskState::Unknown);
    std::fs::write(&path, b"{\"task_id\": ").unwrap();
    assert!(svc.status_direct(&t, "sbx", &id, &p).await.unwrap().is_none());
    assert_eq!(svc.status(&t, "sbx", &id, &p, 0.0).await.unwrap().state, TaskState::Unknown);
    std::fs::remove_file(&path).unwrap();
    assert!(svc.status_direct(&t, "sbx", &id, &p).await.unwrap().is_none());
    let v = svc.status(&t, "sbx", &id, &p, 0.0).await.unwrap();
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Unknown, "hi\n"));
    let missing = TaskId::generate();
    assert!(svc.status_direct(&t, "sbx", &missing, &p).await.unwrap().is_none());
    assert!(matches!(
        svc.status(&t, "sbx", &missing, &p, 0.0).await.unwrap_err(),
        super::service::TaskError::TaskNotFound { .. }
    ));
}

#[tokio::test]
async fn get_task_of_a_running_task_starts_no_process() {
    let t = LocalPython::new();
    let svc = t.service(&[]);
    let id = TaskId::generate();
    svc.start(&t, "sbx", &id, &spec("echo ready; sleep 30", &[], None)).await.unwrap();
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 5.0).await.unwrap();
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Running, "ready\n"));
    let before = t.execs.load(Ordering::SeqCst);
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Running, "ready\n"));
    assert_eq!(t.execs.load(Ordering::SeqCst), before, "liveness came from /proc/PID/cwd/status.json");
    // A daemon the probe cannot reach (not in its task dir) whose record has an origin: the
    // supervisor decides. (After the daemon's next progress tick, which records the totals of
    // "ready" and then nothing more.)
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let path = t.home.path().join(format!(".sandbox-mcp/tasks/{id}/status.json"));
    let mut record = status_json(&t, &id);
    record.as_object_mut().unwrap().remove("supervisor_in_task_dir");
    std::fs::write(&path, record.to_string()).unwrap();
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
    assert_eq!(v.state, TaskState::Running);
    assert_eq!((t.execs.load(Ordering::SeqCst), t.last_program()), (before + 1, "python3".into()));
    // A daemon of an older supervisor (not in its task dir, no origin): /proc/PID/stat decides.
    record.as_object_mut().unwrap().remove("origin");
    std::fs::write(&path, record.to_string()).unwrap();
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 0.0).await.unwrap();
    assert_eq!(v.state, TaskState::Running);
    assert_eq!(
        (t.execs.load(Ordering::SeqCst), t.last_program()),
        (before + 2, "cat".into()),
        "one cat of /proc/PID/stat"
    );
    assert_eq!(svc.cancel(&t, "sbx", &id, &page(0, 0, 1)).await.unwrap().state, TaskState::Cancelled);
}

/// A task directory copied into another sandbox (a snapshot or fork) without its processes,
/// where its recorded daemon pid names an unrelated live process with the same start time (a
/// recycled pid): get_task, list_tasks and cancel_task read `unknown` with the supervisor's
/// reason, and nothing is signalled.
#[tokio::test]
async fn a_task_copied_from_another_sandbox_reads_unknown_with_the_reason() {
    const COPIED: &str = "this task was copied from another sandbox (a snapshot or fork) without its process";
    let (t, copy) = (LocalPython::new(), LocalPython::new());
    let (svc, svc_copy) = (t.service(&[]), copy.service(&[]));
    let id = TaskId::generate();
    svc.start(&t, "sbx", &id, &spec("echo ready; sleep 30", &[], None)).await.unwrap();
    let v = svc.status(&t, "sbx", &id, &page(0, 0, 100), 5.0).await.unwrap();
    assert_eq!((v.state, v.stdout.as_str()), (TaskState::Running, "ready\n"));

    // The impostor: alive, not in a task directory, its own start time recorded as the daemon's.
    let elsewhere = tempfile::tempdir().unwrap();
    let mut impostor = std::process::Command::new("sleep").arg("30").current_dir(elsewhere.path()).spawn().unwrap();
    let stat = std::fs::read(format!("/proc/{}/stat", impostor.id())).unwrap();
    let start = crate::procfs::ProcStat::parse(&stat).unwrap().start_time.unwrap();
    let (from, to) = (t.home.path().join(".sandbox-mcp/tasks"), copy.home.path().join(".sandbox-mcp/tasks"));
    std::fs::create_dir_all(to.join(id.as_str())).unwrap();
    for name in ["spec.json", "status.json", "stdout", "stderr"] {
        std::fs::copy(from.join(id.as_str()).join(name), to.join(id.as_str()).join(name)).unwrap();
    }
    let path = to.join(id.as_str()).join("status.json");
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["origin"]["boot_id"] = "the boot of another machine".into();
    record["supervisor_pid"] = impostor.id().into();
    record["supervisor_start_time"] = start.into();
    std::fs::write(&path, record.to_string()).unwrap();

    let p = page(0, 0, 100);
    let v = svc_copy.status(&copy, "sbx-copy", &id, &p, 0.0).await.unwrap();
    assert_eq!((v.state, v.exit_code, v.stdout.as_str()), (TaskState::Unknown, None, "ready\n"));
    assert!(v.error.as_deref().is_some_and(|e| e.starts_with(COPIED)), "{v:?}");
    let json = serde_json::to_value(&v).unwrap();
    assert!(json["error"].as_str().is_some_and(|e| e.starts_with(COPIED)), "{json}");
    let list = svc_copy.list(&copy, "sbx-copy").await.unwrap();
    assert_eq!(list.tasks.len(), 1);
    assert_eq!((list.tasks[0].state, list.tasks[0].exit_code), (TaskState::Unknown, None));
    let json = serde_json::to_value(&list).unwrap();
    assert!(json["tasks"][0]["error"].as_str().is_some_and(|e| e.starts_with(COPIED)), "{json}");
    let c = svc_copy.cancel(&copy, "sbx-copy", &id, &p).await.unwrap();
    assert_eq!((c.state, c.cancel_confirmed), (TaskState::Unknown, Some(false)));
    assert!(c.error.as_deref().is_some_and(|e| e.starts_with(COPIED)), "{c:?}");
    // Nothing was signalled: neither the impostor nor the original task.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(impostor.try_wait().unwrap().is_none(), "the impostor was signalled");
    assert_eq!(svc.status(&t, "sbx", &id, &p, 0.0).await.unwrap().state, TaskState::Running);
    // A finished task keeps its outcome in a copy (the list of the original sandbox has no error).
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert_eq!(svc.cancel(&t, "sbx", &id, &p).await.unwrap().state, TaskState::Cancelled);
    assert_eq!(svc.list(&t, "sbx").await.unwrap().tasks[0].error, None);
    std::fs::copy(from.join(id.as_str()).join("status.json"), &path).unwrap();
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["origin"]["boot_id"] = "the boot of another machine".into();
    std::fs::write(&path, record.to_string()).unwrap();
    let v = svc_copy.status(&copy, "sbx-copy", &id, &p, 0.0).await.unwrap();
    assert_eq!((v.state, v.error), (TaskState::Cancelled, None));
}

/// A sandbox without python3 (`None`), or whose python3 is this version.
struct PythonLess {
    version: Option<&'static str>,
    installs: AtomicUsize,
}

impl SupervisorTransport for PythonLess {
    async fn exec(
        &self,
        argv: Vec<String>,
        _: Vec<(String, String)>,
        _: Option<Vec<u8>>,
        _: Duration,
    ) -> Result<ExecOutput, TransportError> {
        let Some(version) = self.version else {
            // What envd answers when the program does not exist.
            return Err(TransportError::Uncertain(format!(
                "process.Start: invalid_argument: failed to start '{}': No such file or directory (os error 2)",
                argv[0]
            )));
        };
        let probe = argv.iter().any(|a| a.contains("version_info"));
        Ok(ExecOutput {
            exit_code: if probe { 0 } else { 1 },
            stdout: if probe { format!("{version}\n").into_bytes() } else { Vec::new() },
            stderr: if probe { Vec::new() } else { b"SyntaxError: invalid syntax".to_vec() },
        })
    }

    async fn install(&self, _: &str, _: &'static [u8]) -> Result<(), TransportError> {
        self.installs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn read_range(&self, _: &str, _: u64, _: u64) -> Result<Option<FileSlice>, TransportError> {
        Ok(None)
    }
}

#[tokio::test]
async fn start_without_python3_3_8_is_refused_before_anything_is_installed() {
    let spec = TaskSpec::new("echo hi".into(), None, BTreeMap::new(), None).unwrap();
    for (version, found) in [(None, None), (Some("3.7"), Some("3.7"))] {
        let t = PythonLess { version, installs: AtomicUsize::new(0) };
        let service = TaskService::new(Masker::new(&[] as &[&str]).unwrap());
        let err = service.start(&t, "sbx1", &TaskId::generate(), &spec).await.unwrap_err();
        match &err {
            super::service::TaskError::NoPython { sandbox_id, found: f, .. } => {
                assert_eq!((sandbox_id.as_str(), f.as_deref()), ("sbx1", found));
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("3.8 or newer") && err.to_string().contains("Nothing was started"), "{err}");
        assert_eq!(t.installs.load(Ordering::SeqCst), 0, "nothing installed");
    }
}
