//! The MCP Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) backed
//! by our sandbox tasks. A task-augmented `tools/call` of `run_command` or
//! `start_task` starts a real supervisor task (as `start_task` does) and
//! answers a `CreateTaskResult` at once; `tasks/get` and `tasks/cancel` read
//! and stop that task in its sandbox. The MCP task id carries the sandbox id,
//! the task id and its creation time, bound to the tenant by an HMAC under
//! the gateway's task-id key: no gateway memory is needed, so any replica
//! (and a restarted gateway) answers, and another tenant or a forged id gets
//! "not found" (-32602). The ids themselves are `task_ids.rs`.

use std::time::{SystemTime, UNIX_EPOCH};

use http::request::Parts;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject,
    TASKS_EXTENSION_ID, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::mcp_task_id::{McpTaskId, McpTaskKind};
use crate::gateway::state::Gateway;
use crate::gateway::tools::args::RUN_OUTPUT_CAP_BYTES;
use crate::gateway::tools::calls::CallContext;
use crate::gateway::tools::envd_transport::EnvdTransport;
use crate::gateway::tools::error::ToolError;
use crate::gateway::tools::exec::{CommandOutcome, RUN_COMMAND, RunCommandArgs};
use crate::gateway::tools::task::{START_TASK, StartTaskArgs};
use crate::tasks::TaskId;
use crate::tasks::page::PageRequest;
use crate::tasks::protocol::TaskState;
use crate::tasks::view::TaskView;

/// Tools whose task-augmented call becomes a sandbox task.
pub const TASK_TOOLS: [&str; 2] = [RUN_COMMAND, START_TASK];
/// Suggested `tasks/get` polling interval while a task runs.
pub const POLL_INTERVAL_MS: u64 = 1_000;
/// The completed result of a task-run command: `run_command`'s fields plus the task's own (and, for
/// `start_task`, the rest of `start_task`'s result, so each matches its tool's output schema).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskRunResult {
    /// start_task only: the task's timeout, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// start_task only: what to do next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    pub sandbox_id: String,
    /// The sandbox task behind the MCP task (usable with get_task / cancel_task too).
    pub task_id: String,
    /// succeeded | failed | timed_out
    pub state: TaskState,
    /// Exit code (non-zero is a normal result); -1 if unknown.
    pub exit_code: i64,
    #[serde(flatten)]
    pub outcome: CommandOutcome,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn rfc3339_ms(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn not_found(raw: &str) -> McpError {
    McpError::invalid_params(
        format!("task {} not found: unknown, expired, or not yours", crate::gateway::tools::args::clip(raw, 80)),
        None,
    )
}

/// The caller's request parts (tenant set by the auth layer).
fn request_parts(context: &RequestContext<RoleServer>) -> Result<&Parts, McpError> {
    context.extensions.get::<Parts>().ok_or_else(|| McpError::internal_error("the request carries no HTTP parts", None))
}

/// Whether this `tools/call` becomes an MCP task (SEP-2663 lets the server choose per request): a task
/// tool, and the request itself asks for one, with its own `_meta` declaring the extension (the
/// per-request client capabilities of 2026-07-28, as `ext-tasks` and the Python v2 extension send them)
/// or carrying `_meta["io.modelcontextprotocol/tasks"]` (a task's `ttlMs`). A client that declared the
/// extension only at `initialize` and calls a tool plainly (the Inspector's legacy CLI) gets the plain
/// result its tool's output schema promises.
pub fn wants_task(request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> bool {
    let asks = |meta: &rmcp::model::RequestMetaObject| {
        meta.contains_key(TASKS_EXTENSION_ID) || meta.client_capabilities().is_some_and(|c| c.supports_tasks())
    };
    TASK_TOOLS.contains(&request.name.as_ref()) && (request.meta.as_ref().is_some_and(asks) || asks(&context.meta))
}

/// A `ttlMs` the client asked for in the request's `_meta["io.modelcontextprotocol/tasks"]`.
fn requested_ttl_ms(request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> Option<u64> {
    let from = |meta: &rmcp::model::RequestMetaObject| meta.get(TASKS_EXTENSION_ID)?.get("ttlMs")?.as_u64();
    request.meta.as_ref().and_then(from).or_else(|| from(&context.meta))
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

impl Gateway {
    /// A task-augmented `tools/call`: starts the sandbox task and answers `CreateTaskResult`, or a tool
    /// error (no task) when the arguments are bad or the task could not be started.
    pub(crate) async fn call_tool_as_task(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, McpError> {
        let tool: &'static str = if request.name == RUN_COMMAND { RUN_COMMAND } else { START_TASK };
        let parts = request_parts(&context)?;
        let call = match self.call_context(tool, parts) {
            Ok(call) => call,
            Err(message) => return Ok(tool_error(message).into()),
        };
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let args = match task_args(tool, arguments) {
            Ok(args) => args,
            Err(err) => return Ok(tool_error(self.fail(tool, Some(&call), None, err)).into()),
        };
        let created_ms = now_ms();
        let started = self.logged(tool, &call, self.start_task_impl(&call, args)).await;
        let started = match started {
            Ok(rmcp::Json(started)) => started,
            Err(message) => return Ok(tool_error(message).into()),
        };
        let task_id = match TaskId::parse(&started.task_id) {
            Ok(id) => id,
            Err(err) => return Err(McpError::internal_error(err.to_string(), None)),
        };
        let kind = if tool == RUN_COMMAND {
            McpTaskKind::RunCommand
        } else {
            McpTaskKind::StartTask { timeout: started.timeout }
        };
        let mcp_task = McpTaskId { sandbox_id: started.sandbox_id.clone(), task_id, created_ms, kind };
        let mcp_id = mcp_task.encode(&self.core.task_key, &call.tenant);
        let ttl_ms = self.task_ttl_ms(&mcp_task, requested_ttl_ms(&request, &context));
        let created = rfc3339_ms(created_ms);
        let mut task = Task::new(mcp_id, TaskStatus::Working, created.clone(), created);
        task.ttl_ms = ttl_ms;
        task.poll_interval_ms = Some(POLL_INTERVAL_MS);
        if started.state == TaskState::Unknown {
            task.status_message = started.error.clone().or_else(|| Some(started.hint.clone()));
        }
        Ok(rmcp::model::CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    /// The task stays observable while its sandbox lives: ttlMs is the time left to the sandbox deadline,
    /// or the client's requested ttlMs when shorter.
    fn task_ttl_ms(&self, mcp_task: &McpTaskId, requested: Option<u64>) -> Option<u64> {
        let deadline = self.core.known_deadline(&mcp_task.sandbox_id)?;
        let end_ms = deadline.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        let left = end_ms.saturating_sub(mcp_task.created_ms).max(1);
        Some(requested.map_or(left, |r| r.clamp(1, left)))
    }

    /// Decodes an MCP task id for the caller and reaches its sandbox.
    async fn task_target(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(CallContext, McpTaskId), McpError> {
        let parts = request_parts(context)?;
        let call = self.call_context("tasks", parts).map_err(|m| McpError::invalid_request(m, None))?;
        let call = CallContext::stateless(call.tenant);
        let mcp_task = McpTaskId::decode(&self.core.task_key, &call.tenant, raw).ok_or_else(|| not_found(raw))?;
        Ok((call, mcp_task))
    }

    /// `tasks/get`: our task states mapped onto the extension's.
    pub(crate) async fn mcp_get_task(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (call, mcp_task) = self.task_target(raw, context).await?;
        let page = PageRequest::new(None, None, Some(RUN_OUTPUT_CAP_BYTES as i64))
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let view = self.task_op(&call, &mcp_task, raw, TaskOp::Status(page)).await?;
        Ok(GetTaskResult::new(self.detailed_task(raw, &mcp_task, view)))
    }

    /// `tasks/cancel`: `cancel_task`'s semantics (TERM, KILL, confirmed within 3 s; a finished task is
    /// left as it was). Answers the empty acknowledgement.
    pub(crate) async fn mcp_cancel_task(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (call, mcp_task) = self.task_target(raw, context).await?;
        let page = PageRequest::new(None, None, Some(1)).map_err(|e| McpError::internal_error(e.to_string(), None))?;
        self.task_op(&call, &mcp_task, raw, TaskOp::Cancel(page)).await.map(|_| ())
    }

    /// `tasks/update`: our tasks never ask for input; a known task acknowledges (responses are ignored).
    pub(crate) async fn mcp_update_task(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.task_target(raw, context).await.map(|_| ())
    }

    /// Runs one task-service operation against the task's sandbox, mapping errors to JSON-RPC ones.
    async fn task_op(
        &self,
        call: &CallContext,
        mcp_task: &McpTaskId,
        raw: &str,
        op: TaskOp,
    ) -> Result<TaskView, McpError> {
        // The sandbox is checked to be the caller's tenant's (the MAC already says so) and resumed if paused.
        let method = op.method();
        let result = async {
            // Under the tenant's call quota like a tool call: each holds a connection and a provider call.
            let _permit = self.core.quotas.start_call(&call.tenant)?;
            let sandbox = self.resolve_sandbox(call, Some(&mcp_task.sandbox_id)).await?;
            let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
            let (id, task) = (sandbox.id.as_str(), &mcp_task.task_id);
            let view = match op {
                TaskOp::Status(page) => self.tasks().status(&transport, id, task, &page, 0.0).await?,
                TaskOp::Cancel(page) => self.tasks().cancel(&transport, id, task, &page).await?,
            };
            Ok::<_, ToolError>(view)
        };
        result.await.map_err(|err| {
            let not_found_error = err.is_not_found();
            let sentence = self.fail(method, Some(call), None, err);
            if not_found_error { not_found(raw) } else { McpError::internal_error(sentence, None) }
        })
    }

    /// Maps a task view to the extension's detailed task.
    fn detailed_task(&self, raw: &str, mcp_task: &McpTaskId, view: TaskView) -> DetailedTask {
        let created = rfc3339_ms(mcp_task.created_ms);
        let updated = view.finished_at.map(|s| rfc3339_ms((s * 1000.0) as u64)).unwrap_or_else(|| rfc3339_ms(now_ms()));
        let mut task = Task::new(raw, TaskStatus::Working, created, updated);
        task.ttl_ms = self.task_ttl_ms(mcp_task, None);
        let payload = match view.state {
            TaskState::Running => {
                task.poll_interval_ms = Some(POLL_INTERVAL_MS);
                TaskPayload::Working
            }
            TaskState::Cancelled => TaskPayload::Cancelled,
            TaskState::Succeeded | TaskState::Failed | TaskState::TimedOut => {
                TaskPayload::Completed { result: completed_result(view, mcp_task.kind) }
            }
            TaskState::Unknown => {
                let reason = view.error.clone().unwrap_or_else(|| {
                    "the task's outcome is unknown: no confirmed record (its supervisor is gone)".to_string()
                });
                let mut error = JsonObject::new();
                error.insert("code".into(), Value::from(-32603));
                error.insert("message".into(), Value::from(reason));
                TaskPayload::Failed { error }
            }
        };
        DetailedTask::new(task, payload)
    }
}

/// The arguments of the sandbox task a task-augmented call starts.
fn task_args(tool: &str, arguments: Value) -> Result<StartTaskArgs, ToolError> {
    if tool == START_TASK {
        return serde_json::from_value(arguments)
            .map_err(|e| ToolError::invalid(format!("invalid arguments for start_task: {e}")));
    }
    let args: RunCommandArgs = serde_json::from_value(arguments)
        .map_err(|e| ToolError::invalid(format!("invalid arguments for run_command: {e}")))?;
    if args.user.is_some_and(|u| u.name() != "user") {
        return Err(ToolError::invalid(
            "a task-run run_command runs as user 'user' only; call it as a plain tool call (no task) to run as root",
        ));
    }
    Ok(StartTaskArgs {
        command: args.command,
        sandbox_id: args.sandbox_id,
        cwd: args.cwd,
        timeout: args.timeout.map(|t| t.min(i64::MAX as u64) as i64),
        envs: args.envs,
    })
}

/// The completed task's result: run_command-shaped structured content (a non-zero exit is data).
fn completed_result(view: TaskView, kind: McpTaskKind) -> JsonObject {
    let duration_ms = match (view.started_at, view.finished_at) {
        (Some(start), Some(end)) if end >= start => ((end - start) * 1000.0) as u64,
        _ => 0,
    };
    let error = match view.state {
        TaskState::TimedOut => Some("timed out: the task ran past its timeout and was stopped".to_string()),
        _ => view.signal.map(|s| format!("signal: {s}")).or(view.error.clone()),
    };
    let view_times = (view.started_at, view.finished_at);
    let start_task = match kind {
        McpTaskKind::StartTask { timeout } => Some(timeout),
        McpTaskKind::RunCommand => None,
    };
    let mut result = TaskRunResult {
        timeout: start_task,
        hint: start_task.map(|_| {
            format!(
                "The task has ended; its full saved output stays readable with get_task(sandbox_id=\"{}\", task_id=\"{}\").",
                view.sandbox_id, view.task_id
            )
        }),
        outcome: CommandOutcome {
            stdout_truncated: view.stdout_truncated || view.stdout_next_offset < view.stdout_size,
            stderr_truncated: view.stderr_truncated || view.stderr_next_offset < view.stderr_size,
            stdout_bytes: view.stdout_total_bytes.unwrap_or(view.stdout_size),
            stderr_bytes: view.stderr_total_bytes.unwrap_or(view.stderr_size),
            stdout: view.stdout,
            stderr: view.stderr,
            error,
            duration_ms,
        },
        sandbox_id: view.sandbox_id,
        task_id: view.task_id,
        state: view.state,
        exit_code: view.exit_code.unwrap_or(-1),
    };
    result.outcome.fit(crate::gateway::tools::result_size::encoded_size(&result) + 64);
    let (started_at, finished_at) = (view_times.0, view_times.1);
    let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
    if let (Some(_), Value::Object(object)) = (start_task, &mut value) {
        // start_task's result always carries both times (null while unknown).
        object.insert("started_at".into(), started_at.map_or(Value::Null, Value::from));
        object.insert("finished_at".into(), finished_at.map_or(Value::Null, Value::from));
    }
    let tool_result = CallToolResult::structured(value);
    match serde_json::to_value(&tool_result) {
        Ok(Value::Object(object)) => object,
        _ => JsonObject::new(),
    }
}

/// One operation on a sandbox task.
enum TaskOp {
    Status(PageRequest),
    Cancel(PageRequest),
}

impl TaskOp {
    /// The MCP method, as the log line's and metric's `tool`.
    fn method(&self) -> &'static str {
        match self {
            Self::Status(_) => "tasks/get",
            Self::Cancel(_) => "tasks/cancel",
        }
    }
}
