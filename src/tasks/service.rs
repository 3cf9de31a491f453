//! Runs the supervisor inside a sandbox: one short process per tool call
//! (`python3 -I -S -c "import supervisor ..." <subcommand>`), installing the script on
//! first use per sandbox and again when it is missing or of another version.
//! A `start` goes through the sandbox's [`super::channel`] once it has one (no
//! process started); otherwise, and every `cancel`, through [`super::fast`]'s
//! bash client, which hands them to the sandbox's fork server when one is
//! alive (no python3 start).
//! A plain get_task (no wait) first reads the task's files directly
//! ([`super::direct`]) and asks the supervisor only when that cannot answer.
//! The transport ([`super::transport`]: envd's process and files API in
//! production) is a trait so the same logic runs against a local python3 in unit tests.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::channel::Channels;
use super::direct::{self, StatusRecord};
use super::fast;
use super::id::TaskId;
use super::launch::{self, LaunchError, TaskSpec};
use super::page::{self, PageError, PageRequest, Window};
use super::protocol::{self, Refusal, RefusalCode, Reply, SupervisorStatus, TaskList, TaskState, VersionReply};
use super::transport::{FileSlice, SupervisorTransport, TransportError};
use super::view::{StartedTask, TaskListView, TaskSummary, TaskView};
use super::{SUPERVISOR_INSTALLS, SUPERVISOR_PATH, SUPERVISOR_SOURCE, supervisor_version};
use crate::masking::Masker;

/// Why a task tool call failed (tool errors, each actionable).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Page(#[from] PageError),
    #[error("sandbox {0} not found or no longer running; its tasks are gone")]
    SandboxGone(String),
    #[error("task {task_id} not found in sandbox {sandbox_id}; use list_tasks to see the tasks it has")]
    TaskNotFound { sandbox_id: String, task_id: String },
    #[error("the sandbox refused the task: {0}")]
    Refused(String),
    #[error("could not reach the tasks of sandbox {sandbox_id}: {message}; try again")]
    Unavailable { sandbox_id: String, message: String },
    #[error("the task supervisor in sandbox {sandbox_id} failed: {message}")]
    Supervisor { sandbox_id: String, message: String },
    /// Nothing was started: the supervisor needs python3 3.8+. `template` is filled in by the
    /// caller that knows it.
    #[error("{}", no_python_sentence(.sandbox_id, .template.as_deref(), .found.as_deref()))]
    NoPython { sandbox_id: String, template: Option<String>, found: Option<String> },
}

fn no_python_sentence(sandbox_id: &str, template: Option<&str>, found: Option<&str>) -> String {
    let template = template.map(|t| format!(" (template {t:?})")).unwrap_or_default();
    let has = match found {
        Some(version) => format!("its python3 is {version}"),
        None => "it has no python3 on its PATH".to_owned(),
    };
    format!(
        "cannot start a background task in sandbox {sandbox_id}{template}: {has}, and the task supervisor \
         (start_task, get_task, run_command as an MCP task) needs python3 3.8 or newer. Nothing was started. Use \
         run_command, or a template whose tasks field is true (list_templates), or install python3 in this \
         sandbox first (for example run_command \"apt-get install -y python3\" as root)"
    )
}

/// The interpreter's version, printed by [`TaskService::check_python`]'s probe.
const PYTHON_PROBE: &str = "import sys; print('%d.%d' % sys.version_info[:2])";

/// Whether a failed exec of `python3` says the program does not exist (our envd: "failed to start
/// 'python3': No such file or directory"; Go envd: "executable file not found in $PATH").
fn python_missing(message: &str) -> bool {
    message.contains("python3") && (message.contains("No such file") || message.contains("not found"))
}

const VERSION_TIMEOUT: Duration = Duration::from_secs(20);
const START_TIMEOUT: Duration = Duration::from_secs(30);
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Seconds cancel waits for a confirmed end (`docs/architecture.md#reconnectable-tasks`).
const CANCEL_WAIT_SECONDS: u64 = 3;
/// Bound on the install cache (sandbox ids); cleared when reached.
const MAX_CACHED_SANDBOXES: usize = 100_000;
/// Bound on the cache of running tasks' daemons; cleared when reached.
const MAX_CACHED_DAEMONS: usize = 100_000;

/// The host side of tasks, shared by all sessions of a gateway.
#[derive(Debug)]
pub struct TaskService {
    script_path: String,
    /// Sandboxes known to hold the embedded supervisor version.
    installed: Mutex<HashSet<String>>,
    /// One lock per sandbox, so concurrent first calls check and install once.
    install_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `(sandbox, task)` → the running task's daemon `(pid, start time)`, seen alive by a direct
    /// read: the next read takes the record through `/proc/PID/cwd/status.json`.
    daemons: Mutex<HashMap<(String, String), (u32, u64)>>,
    /// Each sandbox's line channel for starts, once open.
    channels: Channels,
    masker: Masker,
}

impl TaskService {
    /// `masker`: the gateway's own secret values, masked in every page.
    pub fn new(masker: Masker) -> Self {
        Self::with_script_path(SUPERVISOR_PATH, masker)
    }

    /// Same, with the supervisor installed at `script_path` (tests).
    pub fn with_script_path(script_path: &str, masker: Masker) -> Self {
        Self {
            script_path: script_path.to_owned(),
            installed: Mutex::new(HashSet::new()),
            install_locks: Mutex::new(HashMap::new()),
            daemons: Mutex::new(HashMap::new()),
            channels: Channels::default(),
            masker,
        }
    }

    /// `python3 -I -S -c 'import supervisor ...' ARGS`: imported rather than run as a script, so
    /// its bytecode is cached in `__pycache__` (about half the CPU time of compiling it on every
    /// call); `-S` skips `site`, `-I` ignores `PYTHON*` variables, the user site and the cwd.
    /// It ends with `os._exit` once its output is flushed: interpreter finalization would cost
    /// about 3 ms more per call (the supervisor's daemon is a separate process and unaffected).
    pub fn argv(&self, args: &[String]) -> Vec<String> {
        let path = std::path::Path::new(&self.script_path);
        let dir = path.parent().and_then(|d| d.to_str()).unwrap_or("/");
        let module = path.file_stem().and_then(|m| m.to_str()).unwrap_or("supervisor");
        let program = format!(
            "import os, sys; sys.path.insert(0, {}); import {module}; rc = {module}.main(sys.argv[1:]); \
             sys.stdout.flush(); sys.stderr.flush(); os._exit(rc)",
            serde_json::Value::from(dir)
        );
        let mut argv = vec!["python3".to_owned(), "-I".to_owned(), "-S".to_owned(), "-c".to_owned(), program];
        argv.extend_from_slice(args);
        argv
    }

    fn is_installed(&self, sandbox_id: &str) -> bool {
        crate::sync::lock(&self.installed).contains(sandbox_id)
    }

    fn mark_installed(&self, sandbox_id: &str, yes: bool) {
        let mut set = crate::sync::lock(&self.installed);
        if yes {
            if set.len() >= MAX_CACHED_SANDBOXES {
                set.clear();
            }
            set.insert(sandbox_id.to_owned());
        } else {
            set.remove(sandbox_id);
        }
    }

    fn install_lock(&self, sandbox_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = crate::sync::lock(&self.install_locks);
        if locks.len() >= MAX_CACHED_SANDBOXES {
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        Arc::clone(locks.entry(sandbox_id.to_owned()).or_default())
    }

    async fn install<T: SupervisorTransport>(&self, t: &T, sandbox_id: &str) -> Result<(), TransportError> {
        t.install(&self.script_path, SUPERVISOR_SOURCE.as_bytes()).await?;
        SUPERVISOR_INSTALLS.fetch_add(1, Ordering::Relaxed);
        tracing::info!(sandbox_id, version = supervisor_version(), "installed the task supervisor");
        self.mark_installed(sandbox_id, true);
        Ok(())
    }

    /// Makes sure this sandbox runs the embedded supervisor version (one
    /// `version` call per sandbox per gateway process; cached afterwards).
    async fn ensure_installed<T: SupervisorTransport>(&self, t: &T, sandbox_id: &str) -> Result<(), TransportError> {
        if self.is_installed(sandbox_id) {
            return Ok(());
        }
        let lock = self.install_lock(sandbox_id);
        let _guard = lock.lock().await;
        if self.is_installed(sandbox_id) {
            return Ok(());
        }
        let out = match t.exec(self.argv(&["version".to_owned()]), Vec::new(), None, VERSION_TIMEOUT).await {
            Err(TransportError::NotSent(m) | TransportError::Uncertain(m)) if python_missing(&m) => {
                return Err(TransportError::NoPython { found: None });
            }
            other => other?,
        };
        let current = match protocol::parse_reply(out.exit_code, &out.stdout, &out.stderr) {
            Reply::Ok(obj) => serde_json::from_value::<VersionReply>(obj.into())
                .map(|v| v.version == supervisor_version())
                .unwrap_or(false),
            _ => false,
        };
        if current {
            self.mark_installed(sandbox_id, true);
            Ok(())
        } else {
            self.check_python(t).await?;
            self.install(t, sandbox_id).await
        }
    }

    /// Before the first install in a sandbox: is there a python3 3.8+ to run the supervisor? One
    /// short process; an answer that is not understood lets the install go on (and fail as it will).
    async fn check_python<T: SupervisorTransport>(&self, t: &T) -> Result<(), TransportError> {
        let argv = ["python3", "-I", "-S", "-c", PYTHON_PROBE].map(str::to_owned).to_vec();
        let out = match t.exec(argv, Vec::new(), None, VERSION_TIMEOUT).await {
            Ok(out) => out,
            Err(TransportError::NotSent(m) | TransportError::Uncertain(m)) if python_missing(&m) => {
                return Err(TransportError::NoPython { found: None });
            }
            Err(err) => return Err(err),
        };
        if out.exit_code == 127 {
            return Err(TransportError::NoPython { found: None });
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.trim();
        let minor = version.strip_prefix("3.").and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(minor) if minor < 8 => Err(TransportError::NoPython { found: Some(version.to_owned()) }),
            None if out.exit_code == 0 && version.starts_with('2') => {
                Err(TransportError::NoPython { found: Some(version.to_owned()) })
            }
            _ => Ok(()),
        }
    }

    /// One supervisor call; reinstalls and retries once if the script vanished.
    async fn call<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        args: Vec<String>,
        input: Input,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        self.ensure_installed(t, sandbox_id).await?;
        let reply = self.exec_once(t, &args, &input, timeout).await?;
        if !matches!(reply, Reply::ScriptMissing) {
            return Ok(reply);
        }
        self.mark_installed(sandbox_id, false);
        {
            let lock = self.install_lock(sandbox_id);
            let _guard = lock.lock().await;
            if !self.is_installed(sandbox_id) {
                self.install(t, sandbox_id).await?;
            }
        }
        self.exec_once(t, &args, &input, timeout).await
    }

    /// Runs the supervisor once: through the fast path's client when `input` asks for it (python3
    /// itself when the sandbox has no bash), else python3 directly.
    async fn exec_once<T: SupervisorTransport>(
        &self,
        t: &T,
        args: &[String],
        input: &Input,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        let out = match input {
            Input::Stdin(stdin) => t.exec(self.argv(args), Vec::new(), stdin.clone(), timeout).await?,
            Input::Fast { spec } => {
                let env: Vec<_> = spec.iter().map(|s| (fast::SPEC_ENV.to_owned(), s.clone())).collect();
                let argv = fast::client_argv(self.base_dir(), supervisor_version(), self.argv(args));
                match t.exec(argv, env, None, timeout).await {
                    Err(TransportError::NotSent(m) | TransportError::Uncertain(m)) if fast::shell_missing(&m) => {
                        let stdin = spec.as_ref().map(|s| format!("{s}\n").into_bytes());
                        t.exec(self.argv(args), Vec::new(), stdin, timeout).await?
                    }
                    other => other?,
                }
            }
        };
        Ok(protocol::parse_reply(out.exit_code, &out.stdout, &out.stderr))
    }

    /// The supervisor's directory in the sandbox.
    fn base_dir(&self) -> &str {
        std::path::Path::new(&self.script_path).parent().and_then(|d| d.to_str()).unwrap_or("/")
    }

    /// Launches a task. The id is chosen before anything is sent, and an
    /// uncertain launch still returns it (state `unknown`).
    pub async fn start<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        task_id: &TaskId,
        spec: &TaskSpec,
    ) -> Result<StartedTask, TaskError> {
        let launch = launch::start_launch(task_id, spec)?;
        let uncertain =
            |message: String| Ok(StartedTask::uncertain(sandbox_id, task_id.as_str(), spec.timeout, message));
        // Installing happens before the launch: failures there are certain.
        self.ensure_installed(t, sandbox_id).await.map_err(|e| self.transport_error(sandbox_id, e))?;
        // The spec goes in the client's environment (no stdin round trip); `--serve` has a start
        // run by python3 fork the sandbox's task server for the next calls.
        let spec_line = String::from_utf8_lossy(launch.stdin.trim_ascii_end()).into_owned();
        let mut args = launch.args;
        args.extend(["--serve".to_owned(), "1".to_owned()]);
        let reply = match self.start_through_channel(sandbox_id, &args, &spec_line).await {
            Some(reply) => reply,
            None => {
                let input = Input::Fast { spec: Some(spec_line) };
                let bash_path = self.call(t, sandbox_id, args, input, START_TIMEOUT);
                match self.channels.claim_open(sandbox_id) {
                    // The sandbox's channel is opened beside this start, for the next ones.
                    Some(generation) => tokio::join!(bash_path, self.open_channel(t, sandbox_id, generation)).0,
                    None => bash_path.await,
                }
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(TransportError::SandboxGone) => return Err(TaskError::SandboxGone(sandbox_id.to_owned())),
            Err(TransportError::NotSent(m)) => {
                return Err(TaskError::Unavailable { sandbox_id: sandbox_id.to_owned(), message: m });
            }
            Err(TransportError::Uncertain(m)) => return uncertain(m),
            Err(TransportError::NoPython { found }) => {
                return Err(TaskError::NoPython { sandbox_id: sandbox_id.to_owned(), template: None, found });
            }
        };
        match reply {
            Reply::Ok(obj) => match serde_json::from_value::<SupervisorStatus>(obj.into()) {
                Ok(status) if status.task_id == task_id.as_str() => {
                    Ok(StartedTask::observed(sandbox_id, spec.timeout, status, &self.masker))
                }
                _ => uncertain("the task supervisor's answer to the launch was not understood".to_owned()),
            },
            Reply::Refused(r) if r.code.nothing_started() => Err(TaskError::Refused(r.error)),
            Reply::Refused(r) => uncertain(r.error),
            Reply::ScriptMissing => uncertain("the task supervisor could not be installed".to_owned()),
            Reply::Garbled(m) => uncertain(m),
        }
    }

    /// A start through the sandbox's channel, if it has one: `None` when there is none or the
    /// request certainly did not reach it (the caller takes the bash client's path).
    async fn start_through_channel(
        &self,
        sandbox_id: &str,
        args: &[String],
        spec_line: &str,
    ) -> Option<Result<Reply, TransportError>> {
        let channel = self.channels.ready(sandbox_id)?;
        if args.iter().map(String::as_str).chain([spec_line]).any(|w| w.is_empty() || w.contains(char::is_whitespace)) {
            return None; // not one word each: the line could not carry them
        }
        let words = format!("{} -- {spec_line}", args.join(" "));
        match channel.call(&words, Duration::from_secs(fast::NO_ANSWER_SECONDS.into())).await {
            Ok(out) => Some(Ok(protocol::parse_reply(out.exit_code, &out.stdout, &out.stderr))),
            Err(TransportError::NotSent(m)) => {
                tracing::debug!(sandbox_id, error = %m, "the task channel took no request; using the bash client");
                self.channels.drop_channel(sandbox_id, &channel);
                None
            }
            Err(err) => Some(Err(err)),
        }
    }

    /// The pid of the sandbox's greeted channel process (tests).
    #[cfg(test)]
    pub(crate) fn channel_pid(&self, sandbox_id: &str) -> Option<i32> {
        self.channels.ready(sandbox_id).and_then(|c| i32::try_from(c.pid()).ok())
    }

    /// Gives up every task channel of this gateway (their processes end), waiting up to `within`:
    /// at shutdown, so none lingers in a sandbox that outlives the gateway.
    pub async fn close_channels(&self, within: Duration) {
        self.channels.close_all(within).await;
    }

    /// Opens the sandbox's channel (claimed as `generation`); a failure leaves starts on the bash
    /// client's path for a while.
    async fn open_channel<T: SupervisorTransport>(&self, t: &T, sandbox_id: &str, generation: u64) {
        match t.open_channel(self.argv(&["channel".to_owned()])).await {
            Ok(io) => self.channels.attach(sandbox_id, generation, io, supervisor_version()),
            Err(err) => self.channels.open_failed(sandbox_id, generation, &err.to_string()),
        }
    }

    /// Reads a task's state and one page of each stream (get_task): from
    /// its files directly when there is no wait, else (or when that path
    /// cannot answer) through the supervisor.
    pub async fn status<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        task_id: &TaskId,
        page: &PageRequest,
        wait_seconds: f64,
    ) -> Result<TaskView, TaskError> {
        if wait_seconds <= 0.0 {
            match self.status_direct(t, sandbox_id, task_id, page).await {
                Ok(Some(view)) => return Ok(view),
                Ok(None) => {}
                Err(TransportError::SandboxGone) => return Err(TaskError::SandboxGone(sandbox_id.to_owned())),
                Err(err) => tracing::debug!(sandbox_id, error = %err, "direct task read failed; asking the supervisor"),
            }
        }
        self.status_via_supervisor(t, sandbox_id, task_id, page, wait_seconds).await
    }

    /// The task's directory in the sandbox (beside the supervisor script).
    fn task_dir(&self, task_id: &TaskId) -> String {
        format!("{}/tasks/{task_id}", self.base_dir().trim_end_matches('/'))
    }

    async fn read_record<T: SupervisorTransport>(
        &self,
        t: &T,
        dir: &str,
        task_id: &TaskId,
    ) -> Result<Option<StatusRecord>, TransportError> {
        self.read_record_at(t, &format!("{dir}/status.json"), task_id).await
    }

    /// The record at `path` (a task's `status.json`, or its daemon's view of it).
    async fn read_record_at<T: SupervisorTransport>(
        &self,
        t: &T,
        path: &str,
        task_id: &TaskId,
    ) -> Result<Option<StatusRecord>, TransportError> {
        let Some(file) = t.read_range(path, 0, direct::MAX_STATUS_BYTES).await? else { return Ok(None) };
        if file.size != file.data.len() as u64 {
            return Ok(None); // larger than the cap, or growing: let the supervisor read it
        }
        Ok(StatusRecord::parse(&file.data, task_id.as_str()))
    }

    /// Is the recorded supervisor still that process? A daemon that lives in
    /// its task's directory is probed through the files API alone:
    /// `/proc/PID/cwd/status.json` resolves only while that pid exists and is
    /// not a zombie, and must name this task and this daemon. Anything else
    /// (an older daemon, an envd that refuses the path, the daemon gone) is
    /// decided by `cat /proc/PID/stat` (the files API cannot serve /proc
    /// files themselves, whose size reads as zero), as `load_task` does;
    /// except for a record with an `origin`, answered `false` without a
    /// process: [`Self::status_direct`] leaves it to the supervisor, since a
    /// pid copied from another sandbox may name an unrelated live process here.
    async fn supervisor_alive<T: SupervisorTransport>(
        &self,
        t: &T,
        record: &StatusRecord,
        pid: u32,
        start_time: u64,
    ) -> Result<bool, TransportError> {
        if record.in_task_dir() {
            let probe = format!("/proc/{pid}/cwd/status.json");
            if let Ok(Some(file)) = t.read_range(&probe, 0, direct::MAX_STATUS_BYTES).await
                && file.size == file.data.len() as u64
                && StatusRecord::parse(&file.data, record.task_id()).and_then(|r| r.supervisor())
                    == Some((pid, start_time))
            {
                return Ok(true);
            }
        }
        if record.has_origin() {
            return Ok(false);
        }
        let out = t.exec(vec!["cat".to_owned(), format!("/proc/{pid}/stat")], Vec::new(), None, CALL_TIMEOUT).await?;
        let stat = (out.exit_code == 0).then_some(out.stdout.as_slice());
        Ok(direct::supervisor_alive(stat, start_time))
    }

    async fn read_pages<T: SupervisorTransport>(
        &self,
        t: &T,
        dir: &str,
        window: &Window,
    ) -> Result<(FileSlice, FileSlice), TransportError> {
        let (stdout, stderr) = (format!("{dir}/stdout"), format!("{dir}/stderr"));
        let (out, err) = tokio::join!(
            t.read_range(&stdout, window.stdout_offset, window.limit),
            t.read_range(&stderr, window.stderr_offset, window.limit),
        );
        Ok((out?.unwrap_or_default(), err?.unwrap_or_default()))
    }

    /// get_task without python, in one round of parallel reads when it can: the record and both
    /// pages side by side. A running task's record is read through its daemon's
    /// `/proc/PID/cwd/status.json` when the daemon is known from an earlier read (the record and
    /// the daemon's liveness in one read); a terminal record is taken with pages read beside it
    /// only if they hold all of its stored output (else they are read again). `Ok(None)` leaves
    /// the answer to the supervisor (no status yet, unfamiliar record, a record with an `origin`
    /// whose daemon is not confirmed alive).
    pub(crate) async fn status_direct<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        task_id: &TaskId,
        page: &PageRequest,
    ) -> Result<Option<TaskView>, TransportError> {
        let window = Window::for_page(page, &self.masker);
        let dir = self.task_dir(task_id);
        let known = self.known_daemon(sandbox_id, task_id);
        let record_read = async {
            if let Some((pid, start)) = known {
                let path = format!("/proc/{pid}/cwd/status.json");
                if let Ok(Some(record)) = self.read_record_at(t, &path, task_id).await
                    && record.in_task_dir()
                    && record.supervisor() == Some((pid, start))
                {
                    return Ok((Some(record), true));
                }
            }
            self.read_record(t, &dir, task_id).await.map(|r| (r, false))
        };
        let (read, pages) = tokio::join!(record_read, self.read_pages(t, &dir, &window));
        let (record, daemon_confirmed) = read?;
        let Some(mut record) = record else {
            self.forget_daemon(sandbox_id, task_id);
            return Ok(None);
        };
        let (mut stdout, mut stderr) = pages?;
        if record.state.is_terminal() && !record.holds_all_of(stdout.size, stderr.size) {
            (stdout, stderr) = self.read_pages(t, &dir, &window).await?;
        }
        let mut state = record.state;
        let mut error = None;
        let alive = match record.supervisor() {
            Some(_) if record.state != TaskState::Running => None,
            Some(_) if daemon_confirmed => Some(true),
            Some((pid, start)) => Some(self.supervisor_alive(t, &record, pid, start).await?),
            None => None,
        };
        match (alive, record.supervisor()) {
            (Some(true), Some(daemon)) if record.in_task_dir() => self.remember_daemon(sandbox_id, task_id, daemon),
            _ => self.forget_daemon(sandbox_id, task_id),
        }
        if alive == Some(false) {
            if record.has_origin() {
                // Gone, or copied from another sandbox (a snapshot or fork):
                // only the supervisor reads the sandbox's identity.
                return Ok(None);
            }
            // The daemon may have recorded its end and exited between the two
            // reads: read again before declaring it unknown.
            match self.read_record(t, &dir, task_id).await? {
                Some(again) if again.state.is_terminal() => {
                    record = again;
                    state = record.state;
                    (stdout, stderr) = self.read_pages(t, &dir, &window).await?;
                }
                _ => {
                    state = TaskState::Unknown;
                    error = Some(direct::SUPERVISOR_GONE.to_owned());
                }
            }
        }
        let Some(status) = record.status(state, error, stdout.size, stderr.size) else { return Ok(None) };
        Ok(self.view(sandbox_id, page, &window, status, &stdout.data, &stderr.data).ok())
    }

    /// The daemon of a running task seen alive by an earlier direct read in this sandbox.
    fn known_daemon(&self, sandbox_id: &str, task_id: &TaskId) -> Option<(u32, u64)> {
        crate::sync::lock(&self.daemons).get(&(sandbox_id.to_owned(), task_id.to_string())).copied()
    }

    fn remember_daemon(&self, sandbox_id: &str, task_id: &TaskId, daemon: (u32, u64)) {
        let mut daemons = crate::sync::lock(&self.daemons);
        if daemons.len() >= MAX_CACHED_DAEMONS {
            daemons.clear();
        }
        daemons.insert((sandbox_id.to_owned(), task_id.to_string()), daemon);
    }

    fn forget_daemon(&self, sandbox_id: &str, task_id: &TaskId) {
        crate::sync::lock(&self.daemons).remove(&(sandbox_id.to_owned(), task_id.to_string()));
    }

    /// get_task through the supervisor's `status` (also waits).
    pub(crate) async fn status_via_supervisor<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        task_id: &TaskId,
        page: &PageRequest,
        wait_seconds: f64,
    ) -> Result<TaskView, TaskError> {
        let window = Window::for_page(page, &self.masker);
        let mut args = paging_args("status", task_id, &window);
        if wait_seconds > 0.0 {
            // Wait for output past the caller's offsets, not the widened window's.
            args.extend([
                "--wait".to_owned(),
                format!("{wait_seconds}"),
                "--wait-stdout-offset".to_owned(),
                page.stdout_offset.to_string(),
                "--wait-stderr-offset".to_owned(),
                page.stderr_offset.to_string(),
            ]);
        }
        let timeout = CALL_TIMEOUT + Duration::from_secs_f64(wait_seconds);
        let reply = self
            .call(t, sandbox_id, args, Input::Stdin(None), timeout)
            .await
            .map_err(|e| self.transport_error(sandbox_id, e))?;
        self.view_reply(sandbox_id, task_id, page, &window, reply)
    }

    /// Cancels a task (TERM, then KILL, of its own process group) and waits
    /// up to 3 s for a confirmed end; a finished task is left untouched.
    pub async fn cancel<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        task_id: &TaskId,
        page: &PageRequest,
    ) -> Result<TaskView, TaskError> {
        let window = Window::for_page(page, &self.masker);
        let mut args = paging_args("cancel", task_id, &window);
        args.push("--wait".to_owned());
        args.push(CANCEL_WAIT_SECONDS.to_string());
        let timeout = CALL_TIMEOUT + Duration::from_secs(CANCEL_WAIT_SECONDS + 3);
        let reply = self
            .call(t, sandbox_id, args, Input::Fast { spec: None }, timeout)
            .await
            .map_err(|e| self.transport_error(sandbox_id, e))?;
        let mut view = self.view_reply(sandbox_id, task_id, page, &window, reply)?;
        // Never claim a cancel that was not observed.
        view.cancel_confirmed = Some(view.cancel_confirmed == Some(true) && view.state == TaskState::Cancelled);
        Ok(view)
    }

    /// Every task in the sandbox (list_tasks).
    pub async fn list<T: SupervisorTransport>(&self, t: &T, sandbox_id: &str) -> Result<TaskListView, TaskError> {
        let reply = self
            .call(t, sandbox_id, vec!["list".to_owned()], Input::Stdin(None), CALL_TIMEOUT)
            .await
            .map_err(|e| self.transport_error(sandbox_id, e))?;
        let obj = self.ok_object(sandbox_id, None, reply)?;
        let list: TaskList = serde_json::from_value(obj.into()).map_err(|e| TaskError::Supervisor {
            sandbox_id: sandbox_id.to_owned(),
            message: format!("malformed task list: {e}"),
        })?;
        let tasks = list.tasks.into_iter().map(|t| TaskSummary::new(t, &self.masker)).collect();
        Ok(TaskListView { sandbox_id: sandbox_id.to_owned(), tasks })
    }

    /// The view of a supervisor reply (status or cancel).
    fn view_reply(
        &self,
        sandbox_id: &str,
        task_id: &TaskId,
        page: &PageRequest,
        window: &Window,
        reply: Reply,
    ) -> Result<TaskView, TaskError> {
        let obj = self.ok_object(sandbox_id, Some(task_id), reply)?;
        let malformed = |m: String| TaskError::Supervisor { sandbox_id: sandbox_id.to_owned(), message: m };
        let status: SupervisorStatus =
            serde_json::from_value(obj.into()).map_err(|e| malformed(format!("malformed status: {e}")))?;
        let stdout = page::decode_window(&status.stdout_b64).map_err(|e| malformed(e.to_string()))?;
        let stderr = page::decode_window(&status.stderr_b64).map_err(|e| malformed(e.to_string()))?;
        self.view(sandbox_id, page, window, status, &stdout, &stderr)
    }

    /// Cuts the caller's pages out of the windows read and builds the view.
    fn view(
        &self,
        sandbox_id: &str,
        page: &PageRequest,
        window: &Window,
        status: SupervisorStatus,
        stdout_window: &[u8],
        stderr_window: &[u8],
    ) -> Result<TaskView, TaskError> {
        let malformed = |m: String| TaskError::Supervisor { sandbox_id: sandbox_id.to_owned(), message: m };
        let cut = |data: &[u8], win_off, off| {
            page::cut_page(data, win_off, off, page.limit, &self.masker).map_err(|e| malformed(e.to_string()))
        };
        let stdout = cut(stdout_window, window.stdout_offset, page.stdout_offset)?;
        let stderr = cut(stderr_window, window.stderr_offset, page.stderr_offset)?;
        Ok(TaskView::new(sandbox_id, status, stdout, stderr, &self.masker))
    }

    fn ok_object(
        &self,
        sandbox_id: &str,
        task_id: Option<&TaskId>,
        reply: Reply,
    ) -> Result<serde_json::Map<String, serde_json::Value>, TaskError> {
        match reply {
            Reply::Ok(obj) => Ok(obj),
            Reply::Refused(Refusal { code: RefusalCode::NotFound, .. }) => Err(TaskError::TaskNotFound {
                sandbox_id: sandbox_id.to_owned(),
                task_id: task_id.map(ToString::to_string).unwrap_or_default(),
            }),
            Reply::Refused(r) => Err(TaskError::Supervisor { sandbox_id: sandbox_id.to_owned(), message: r.error }),
            Reply::ScriptMissing => Err(TaskError::Supervisor {
                sandbox_id: sandbox_id.to_owned(),
                message: "the supervisor script is missing and could not be installed".to_owned(),
            }),
            Reply::Garbled(m) => Err(TaskError::Supervisor { sandbox_id: sandbox_id.to_owned(), message: m }),
        }
    }

    fn transport_error(&self, sandbox_id: &str, err: TransportError) -> TaskError {
        match err {
            TransportError::SandboxGone => TaskError::SandboxGone(sandbox_id.to_owned()),
            TransportError::NotSent(m) | TransportError::Uncertain(m) => {
                TaskError::Unavailable { sandbox_id: sandbox_id.to_owned(), message: self.masker.mask(&m).into_owned() }
            }
            TransportError::NoPython { found } => {
                TaskError::NoPython { sandbox_id: sandbox_id.to_owned(), template: None, found }
            }
        }
    }
}

/// How one supervisor call is run.
enum Input {
    /// python3 directly, with this on its stdin (or an empty stdin).
    Stdin(Option<Vec<u8>>),
    /// Through the fast path's client ([`fast::CLIENT`]), with the spec (of a start) in its
    /// environment.
    Fast { spec: Option<String> },
}

fn paging_args(sub: &str, task_id: &TaskId, window: &Window) -> Vec<String> {
    vec![
        sub.to_owned(),
        "--task-id".to_owned(),
        task_id.to_string(),
        "--stdout-offset".to_owned(),
        window.stdout_offset.to_string(),
        "--stderr-offset".to_owned(),
        window.stderr_offset.to_string(),
        "--limit".to_owned(),
        window.limit.to_string(),
    ]
}
