//! What the task tools return to the agent (structured content).

use schemars::JsonSchema;
use serde::Serialize;

use super::page::StreamPage;
use super::protocol::{ListedTask, SupervisorStatus, TaskState};
use crate::masking::Masker;

/// Unix seconds with millisecond precision (the supervisor records floats).
fn unix_seconds(t: Option<f64>) -> Option<f64> {
    t.filter(|v| v.is_finite()).map(|v| (v * 1000.0).round() / 1000.0)
}

/// Result of get_task and cancel_task.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TaskView {
    pub sandbox_id: String,
    pub task_id: String,
    /// running | succeeded | failed | cancelled | timed_out | unknown
    pub state: TaskState,
    /// Exit code once the task has ended (128+N when killed by signal N); null until known.
    pub exit_code: Option<i64>,
    /// Signal that ended the task, if any.
    pub signal: Option<i64>,
    /// Unix seconds; null until known.
    pub started_at: Option<f64>,
    /// Unix seconds; null until the task has ended.
    pub finished_at: Option<f64>,
    /// Page of stdout from stdout_offset (UTF-8; a split character reads as U+FFFD; secrets masked as ***).
    pub stdout: String,
    /// Page of stderr from stderr_offset.
    pub stderr: String,
    /// Pass as stdout_offset to read on.
    pub stdout_next_offset: u64,
    /// Pass as stderr_offset to read on.
    pub stderr_next_offset: u64,
    /// Bytes of stdout saved so far (at most 1 MiB is kept).
    pub stdout_size: u64,
    pub stderr_size: u64,
    /// Bytes the task wrote to stdout in total (saved or not).
    pub stdout_total_bytes: Option<u64>,
    pub stderr_total_bytes: Option<u64>,
    /// True when stdout was longer than what is saved (first 1 MiB kept).
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// cancel_task only: true when the task was observed ending as cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_confirmed: Option<bool>,
}

impl TaskView {
    pub fn new(
        sandbox_id: &str,
        status: SupervisorStatus,
        stdout: StreamPage,
        stderr: StreamPage,
        masker: &Masker,
    ) -> Self {
        Self {
            sandbox_id: sandbox_id.to_owned(),
            task_id: status.task_id,
            state: status.state,
            exit_code: status.exit_code,
            signal: status.signal,
            started_at: unix_seconds(status.started_at),
            finished_at: unix_seconds(status.finished_at),
            stdout: stdout.text,
            stderr: stderr.text,
            stdout_next_offset: stdout.next_offset,
            stderr_next_offset: stderr.next_offset,
            stdout_size: status.stdout_size,
            stderr_size: status.stderr_size,
            stdout_total_bytes: status.stdout_total_bytes,
            stderr_total_bytes: status.stderr_total_bytes,
            stdout_truncated: status.stdout_truncated,
            stderr_truncated: status.stderr_truncated,
            error: status.error.map(|e| masker.mask(&e).into_owned()),
            cancel_confirmed: status.cancel_confirmed,
        }
    }
}

/// Result of start_task.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StartedTask {
    pub sandbox_id: String,
    /// Handle for get_task / cancel_task (keep it with sandbox_id).
    pub task_id: String,
    /// running once the task is recorded (its command starts right after); failed when no
    /// supervisor could be started; unknown when the launch's outcome is uncertain.
    pub state: TaskState,
    pub exit_code: Option<i64>,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    /// Timeout of the task in seconds.
    pub timeout: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What to do next.
    pub hint: String,
}

impl StartedTask {
    pub fn observed(sandbox_id: &str, timeout: u64, status: SupervisorStatus, masker: &Masker) -> Self {
        let hint = match status.state {
            TaskState::Unknown => uncertain_hint(sandbox_id, &status.task_id),
            _ => format!(
                "Read output and state with get_task(sandbox_id=\"{sandbox_id}\", task_id=\"{}\"), using wait_seconds to wait for progress; stop it with cancel_task.",
                status.task_id
            ),
        };
        Self {
            sandbox_id: sandbox_id.to_owned(),
            task_id: status.task_id,
            state: status.state,
            exit_code: status.exit_code,
            started_at: unix_seconds(status.started_at),
            finished_at: unix_seconds(status.finished_at),
            timeout,
            error: status.error.map(|e| masker.mask(&e).into_owned()),
            hint,
        }
    }

    /// The launch may or may not have reached the sandbox.
    pub fn uncertain(sandbox_id: &str, task_id: &str, timeout: u64, error: String) -> Self {
        Self {
            sandbox_id: sandbox_id.to_owned(),
            task_id: task_id.to_owned(),
            state: TaskState::Unknown,
            exit_code: None,
            started_at: None,
            finished_at: None,
            timeout,
            error: Some(error),
            hint: uncertain_hint(sandbox_id, task_id),
        }
    }
}

fn uncertain_hint(sandbox_id: &str, task_id: &str) -> String {
    format!(
        "The launch's outcome is uncertain: the task may or may not be running. Do NOT call start_task again for it; inspect it with get_task(sandbox_id=\"{sandbox_id}\", task_id=\"{task_id}\") (or list_tasks), or destroy the sandbox with kill_sandbox if it must not run."
    )
}

/// One task in list_tasks.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TaskSummary {
    pub task_id: String,
    pub state: TaskState,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    pub exit_code: Option<i64>,
    /// First line of the command (at most 200 characters).
    pub command_first_line: Option<String>,
    /// Why the state is what it is, as get_task's `error` (e.g. why it is unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl TaskSummary {
    pub fn new(task: ListedTask, masker: &Masker) -> Self {
        Self {
            task_id: task.task_id,
            state: task.state,
            started_at: unix_seconds(task.started_at),
            finished_at: unix_seconds(task.finished_at),
            exit_code: task.exit_code,
            command_first_line: task.command_first_line.map(|c| masker.mask(&c).into_owned()),
            error: task.error.map(|e| masker.mask(&e).into_owned()),
        }
    }
}

/// Result of list_tasks.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TaskListView {
    pub sandbox_id: String,
    /// Oldest first.
    pub tasks: Vec<TaskSummary>,
}
