//! Runs the supervisor inside a sandbox: one short process per tool call
//! (`python3 -I -S -c "import supervisor ..." <subcommand>`), installing the script on
//! first use per sandbox and again when it is missing or of another version.
//! The transport (envd process + files API in production) is a trait so the
//! same logic runs against a local python3 in unit tests.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::id::TaskId;
use super::launch::{self, LaunchError, TaskSpec};
use super::page::{self, PageError, PageRequest, SecretMasker, Window};
use super::protocol::{self, Refusal, Reply, SupervisorStatus, TaskList, TaskState, VersionReply};
use super::view::{StartedTask, TaskListView, TaskSummary, TaskView};
use super::{SUPERVISOR_INSTALLS, SUPERVISOR_PATH, SUPERVISOR_SOURCE, supervisor_version};

/// Output of one process run in the sandbox.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// How a call into the sandbox failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The sandbox does not exist (any more) or is not running.
    #[error("sandbox not found or no longer running")]
    SandboxGone,
    /// The request certainly did not reach the sandbox.
    #[error("{0}")]
    NotSent(String),
    /// The request may have reached the sandbox (timeout, reset, bad answer).
    #[error("{0}")]
    Uncertain(String),
}

/// Runs processes and writes files in one sandbox, as the sandbox user.
pub trait SupervisorTransport: Send + Sync {
    /// Runs `argv` (argv[0] is the program, found on PATH) and collects its output.
    fn exec(
        &self,
        argv: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, TransportError>> + Send;
    /// Replaces `path` with `content` atomically (creating parent directories),
    /// so a concurrent reader sees the old or the new script, never a mix.
    fn install(&self, path: &str, content: &'static [u8]) -> impl Future<Output = Result<(), TransportError>> + Send;
}

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
}

const VERSION_TIMEOUT: Duration = Duration::from_secs(20);
const START_TIMEOUT: Duration = Duration::from_secs(30);
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Seconds cancel waits for a confirmed end (DESIGN.md §4).
const CANCEL_WAIT_SECONDS: u64 = 3;
/// Bound on the install cache (sandbox ids); cleared when reached.
const MAX_CACHED_SANDBOXES: usize = 100_000;

/// The host side of tasks, shared by all sessions of a gateway.
#[derive(Debug)]
pub struct TaskService {
    script_path: String,
    /// Sandboxes known to hold the embedded supervisor version.
    installed: Mutex<HashSet<String>>,
    /// One lock per sandbox, so concurrent first calls check and install once.
    install_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    masker: SecretMasker,
}

impl TaskService {
    /// `secrets`: the gateway's own secret values, masked in every page.
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_script_path(SUPERVISOR_PATH, secrets)
    }

    /// Same, with the supervisor installed at `script_path` (tests).
    pub fn with_script_path<I, S>(script_path: &str, secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self {
            script_path: script_path.to_owned(),
            installed: Mutex::new(HashSet::new()),
            install_locks: Mutex::new(HashMap::new()),
            masker: SecretMasker::new(secrets),
        }
    }

    pub fn masker(&self) -> &SecretMasker {
        &self.masker
    }

    /// `python3 -I -S -c 'import supervisor ...' ARGS`: imported rather than run as a script, so
    /// its bytecode is cached in `__pycache__` (about half the CPU time of compiling it on every
    /// call); `-S` skips `site`, `-I` ignores `PYTHON*` variables, the user site and the cwd.
    fn argv(&self, args: &[String]) -> Vec<String> {
        let path = std::path::Path::new(&self.script_path);
        let dir = path.parent().and_then(|d| d.to_str()).unwrap_or("/");
        let module = path.file_stem().and_then(|m| m.to_str()).unwrap_or("supervisor");
        let program = format!(
            "import sys; sys.path.insert(0, {}); import {module}; sys.exit({module}.main(sys.argv[1:]))",
            serde_json::Value::from(dir)
        );
        let mut argv = vec!["python3".to_owned(), "-I".to_owned(), "-S".to_owned(), "-c".to_owned(), program];
        argv.extend_from_slice(args);
        argv
    }

    fn is_installed(&self, sandbox_id: &str) -> bool {
        self.installed.lock().map(|set| set.contains(sandbox_id)).unwrap_or(false)
    }

    fn mark_installed(&self, sandbox_id: &str, yes: bool) {
        if let Ok(mut set) = self.installed.lock() {
            if yes {
                if set.len() >= MAX_CACHED_SANDBOXES {
                    set.clear();
                }
                set.insert(sandbox_id.to_owned());
            } else {
                set.remove(sandbox_id);
            }
        }
    }

    fn install_lock(&self, sandbox_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let Ok(mut locks) = self.install_locks.lock() else { return Arc::default() };
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
        let out = t.exec(self.argv(&["version".to_owned()]), VERSION_TIMEOUT).await?;
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
            self.install(t, sandbox_id).await
        }
    }

    /// One supervisor call; reinstalls and retries once if the script vanished.
    async fn call<T: SupervisorTransport>(
        &self,
        t: &T,
        sandbox_id: &str,
        args: Vec<String>,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        self.ensure_installed(t, sandbox_id).await?;
        let argv = self.argv(&args);
        let out = t.exec(argv.clone(), timeout).await?;
        let reply = protocol::parse_reply(out.exit_code, &out.stdout, &out.stderr);
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
        let out = t.exec(argv, timeout).await?;
        Ok(protocol::parse_reply(out.exit_code, &out.stdout, &out.stderr))
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
        let args = launch::start_args(task_id, spec)?;
        let uncertain =
            |message: String| Ok(StartedTask::uncertain(sandbox_id, task_id.as_str(), spec.timeout, message));
        // Installing happens before the launch: failures there are certain.
        self.ensure_installed(t, sandbox_id).await.map_err(|e| self.transport_error(sandbox_id, e))?;
        let reply = match self.call(t, sandbox_id, args, START_TIMEOUT).await {
            Ok(reply) => reply,
            Err(TransportError::SandboxGone) => return Err(TaskError::SandboxGone(sandbox_id.to_owned())),
            Err(TransportError::NotSent(m)) => {
                return Err(TaskError::Unavailable { sandbox_id: sandbox_id.to_owned(), message: m });
            }
            Err(TransportError::Uncertain(m)) => return uncertain(m),
        };
        match reply {
            Reply::Ok(obj) => match serde_json::from_value::<SupervisorStatus>(obj.into()) {
                Ok(status) if status.task_id == task_id.as_str() => {
                    Ok(StartedTask::observed(sandbox_id, spec.timeout, status, &self.masker))
                }
                _ => uncertain("the task supervisor's answer to the launch was not understood".to_owned()),
            },
            Reply::Refused(r) if r.code == "limit" || r.code == "invalid" => Err(TaskError::Refused(r.error)),
            Reply::Refused(r) => uncertain(r.error),
            Reply::ScriptMissing => uncertain("the task supervisor could not be installed".to_owned()),
            Reply::Garbled(m) => uncertain(m),
        }
    }

    /// Reads a task's state and one page of each stream (get_task).
    pub async fn status<T: SupervisorTransport>(
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
        let reply = self.call(t, sandbox_id, args, timeout).await.map_err(|e| self.transport_error(sandbox_id, e))?;
        self.view(sandbox_id, task_id, page, &window, reply)
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
        let reply = self.call(t, sandbox_id, args, timeout).await.map_err(|e| self.transport_error(sandbox_id, e))?;
        let mut view = self.view(sandbox_id, task_id, page, &window, reply)?;
        // Never claim a cancel that was not observed.
        view.cancel_confirmed = Some(view.cancel_confirmed == Some(true) && view.state == TaskState::Cancelled);
        Ok(view)
    }

    /// Every task in the sandbox (list_tasks).
    pub async fn list<T: SupervisorTransport>(&self, t: &T, sandbox_id: &str) -> Result<TaskListView, TaskError> {
        let reply = self
            .call(t, sandbox_id, vec!["list".to_owned()], CALL_TIMEOUT)
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

    fn view(
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
        let cut = |b64: &str, win_off, off| {
            page::cut_page(b64, win_off, off, page.limit, &self.masker).map_err(|e| malformed(e.to_string()))
        };
        let stdout = cut(&status.stdout_b64, window.stdout_offset, page.stdout_offset)?;
        let stderr = cut(&status.stderr_b64, window.stderr_offset, page.stderr_offset)?;
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
            Reply::Refused(Refusal { code, .. }) if code == "not_found" => Err(TaskError::TaskNotFound {
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
                TaskError::Unavailable { sandbox_id: sandbox_id.to_owned(), message: self.masker.mask_text(&m) }
            }
        }
    }
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
