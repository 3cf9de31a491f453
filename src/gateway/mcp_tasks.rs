//! The MCP Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) backed
//! by our sandbox tasks. A task-augmented `tools/call` of `run_command` or
//! `start_task` starts a real supervisor task (as `start_task` does) and
//! answers a `CreateTaskResult` at once; `tasks/get` and `tasks/cancel` read
//! and stop that task in its sandbox. The MCP task id carries the sandbox id,
//! the task id and its creation time, bound to the tenant by an HMAC under
//! the gateway's task-id key: no gateway memory is needed, so any replica
//! (and a restarted gateway) answers, and another tenant or a forged id gets
//! "not found" (-32602).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
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
use sha2::{Digest, Sha256};

use super::calls::CallContext;
use super::error::ToolError;
use super::exec_tools::{RUN_OUTPUT_CAP_BYTES, RunCommandArgs};
use super::handler::Gateway;
use super::task_tools::{EnvdTransport, StartTaskArgs};
use crate::config::Config;
use crate::tasks::TaskId;
use crate::tasks::page::PageRequest;
use crate::tasks::protocol::TaskState;
use crate::tasks::view::TaskView;

/// Tools whose task-augmented call becomes a sandbox task.
pub const TASK_TOOLS: [&str; 2] = ["run_command", "start_task"];
/// Suggested `tasks/get` polling interval while a task runs.
pub const POLL_INTERVAL_MS: u64 = 1_000;
/// Version tag of the task-id format.
const ID_PREFIX: &str = "sbx1";
/// Bytes of the HMAC kept in the id (128 bits).
const MAC_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// The key binding MCP task ids to tenants.
#[derive(Clone)]
pub struct TaskIdKey([u8; 32]);

impl std::fmt::Debug for TaskIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskIdKey(***)")
    }
}

impl TaskIdKey {
    /// A key from secret material (hashed, any length).
    pub fn from_secret(secret: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"sandbox-mcp task ids v1\0");
        hasher.update(secret);
        Self(hasher.finalize().into())
    }

    /// The configured key (`tasks.task_id_key`), else one derived from the provider API key and the
    /// deployment (shared by every replica of a deployment), else a random one for this process only
    /// (MCP task ids then do not survive a restart: logged as a warning).
    pub fn resolve(config: &Config, provider_api_key: Option<&str>, embedded: bool) -> Self {
        if !config.tasks.task_id_key.is_empty() {
            return Self::from_secret(config.tasks.task_id_key.as_bytes());
        }
        if let (Some(api_key), false) = (provider_api_key, embedded) {
            let material = format!("{api_key}\0{}", config.provider.deployment);
            return Self::from_secret(material.as_bytes());
        }
        if embedded {
            // The embedded provider's API key is new at each start; its state dir is not.
            let path = config.local.resolved_state_dir().join("mcp-task-id.key");
            match load_or_create_key_file(&path) {
                Ok(secret) => return Self::from_secret(&secret),
                Err(err) => tracing::warn!(path = %path.display(), error = %err, "cannot keep the MCP task-id key"),
            }
        }
        tracing::warn!(
            "no tasks.task_id_key configured (SANDBOX_MCP_TASKS__TASK_ID_KEY) and no provider API key to derive \
             one from: MCP task ids are valid for this process only"
        );
        Self::from_secret(&rand::random::<[u8; 32]>())
    }

    fn mac_state(&self, tenant: &str, handle: &TaskHandle) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.0).ok()?;
        let (created, kind) = (handle.created_ms.to_string(), handle.kind.encode());
        for part in [tenant, handle.sandbox_id.as_str(), handle.task_id.as_str(), &created, &kind] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        Some(mac)
    }

    /// The opaque MCP task id of a sandbox task, bound to `tenant`.
    pub fn encode(&self, tenant: &str, handle: &TaskHandle) -> String {
        let tag = self.mac_state(tenant, handle).map(|m| m.finalize().into_bytes().to_vec()).unwrap_or_default();
        let mac = URL_SAFE_NO_PAD.encode(&tag[..MAC_BYTES.min(tag.len())]);
        format!(
            "{ID_PREFIX}.{}.{}.{}.{}.{mac}",
            handle.sandbox_id,
            handle.task_id,
            handle.created_ms,
            handle.kind.encode()
        )
    }

    /// The task behind an MCP task id, if the id is well formed and was issued to `tenant`.
    pub fn decode(&self, tenant: &str, raw: &str) -> Option<TaskHandle> {
        let mut parts = raw.split('.');
        let (prefix, sandbox, task, created) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let (kind, mac) = (parts.next()?, parts.next()?);
        if prefix != ID_PREFIX || parts.next().is_some() {
            return None;
        }
        super::access::validate_sandbox_id(sandbox).ok()?;
        let handle = TaskHandle {
            sandbox_id: sandbox.to_string(),
            task_id: TaskId::parse(task).ok()?,
            created_ms: created.parse().ok()?,
            kind: TaskKind::decode(kind)?,
        };
        let given = URL_SAFE_NO_PAD.decode(mac).ok()?;
        if given.len() != MAC_BYTES {
            return None;
        }
        // Constant-time comparison of the truncated tag.
        self.mac_state(tenant, &handle)?.verify_truncated_left(&given).ok()?;
        Some(handle)
    }
}

/// Reads the 32-byte key file, or creates it (mode 0600) with a random key.
fn load_or_create_key_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read(path) {
        Ok(secret) if secret.len() >= 32 => return Ok(secret),
        Ok(_) => return Err(std::io::Error::other("key file shorter than 32 bytes")),
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        Err(_) => {}
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let secret = rand::random::<[u8; 32]>();
    let tmp = path.with_extension(format!("tmp{:08x}", rand::random::<u32>()));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(&secret)?;
    file.sync_all()?;
    // A concurrent creator may win: keep whichever file is in place.
    if std::fs::hard_link(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return std::fs::read(path);
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(secret.to_vec())
}

/// What an MCP task id stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskHandle {
    pub sandbox_id: String,
    pub task_id: TaskId,
    /// Creation time, Unix milliseconds.
    pub created_ms: u64,
    /// The tool that started it (its result takes that tool's shape).
    pub kind: TaskKind,
}

/// The tool a task-augmented call was made to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskKind {
    RunCommand,
    /// `start_task`, with the task's timeout (part of start_task's result).
    StartTask {
        timeout: u64,
    },
}

impl TaskKind {
    fn encode(self) -> String {
        match self {
            TaskKind::RunCommand => "r".into(),
            TaskKind::StartTask { timeout } => format!("s{timeout}"),
        }
    }

    fn decode(raw: &str) -> Option<Self> {
        match raw.strip_prefix('s') {
            _ if raw == "r" => Some(TaskKind::RunCommand),
            Some(timeout) if !timeout.is_empty() && timeout.len() <= 6 => {
                Some(TaskKind::StartTask { timeout: timeout.parse().ok()? })
            }
            _ => None,
        }
    }
}

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
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
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
        format!("task {} not found: unknown, expired, or not yours", crate::gateway::args::clip(raw, 80)),
        None,
    )
}

/// The caller's request parts (tenant set by the auth layer).
fn request_parts(context: &RequestContext<RoleServer>) -> Result<&Parts, McpError> {
    context.extensions.get::<Parts>().ok_or_else(|| McpError::internal_error("the request carries no HTTP parts", None))
}

/// Whether this `tools/call` becomes an MCP task: a task tool, from a client that declared the extension.
pub fn wants_task(request: &CallToolRequestParams, context: &RequestContext<RoleServer>) -> bool {
    TASK_TOOLS.contains(&request.name.as_ref()) && context.client_capabilities().is_some_and(|c| c.supports_tasks())
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
        let tool: &'static str = if request.name == "run_command" { "run_command" } else { "start_task" };
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
        let kind =
            if tool == "run_command" { TaskKind::RunCommand } else { TaskKind::StartTask { timeout: started.timeout } };
        let handle = TaskHandle { sandbox_id: started.sandbox_id.clone(), task_id, created_ms, kind };
        let mcp_id = self.core.task_key.encode(&call.tenant, &handle);
        let ttl_ms = self.task_ttl_ms(&handle, requested_ttl_ms(&request, &context));
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
    fn task_ttl_ms(&self, handle: &TaskHandle, requested: Option<u64>) -> Option<u64> {
        let deadline = self.core.known_deadline(&handle.sandbox_id)?;
        let end_ms = deadline.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        let left = end_ms.saturating_sub(handle.created_ms).max(1);
        Some(requested.map_or(left, |r| r.clamp(1, left)))
    }

    /// Decodes an MCP task id for the caller and reaches its sandbox.
    async fn task_target(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(CallContext, TaskHandle), McpError> {
        let parts = request_parts(context)?;
        let call = self.call_context("tasks", parts).map_err(|m| McpError::invalid_request(m, None))?;
        let call = CallContext::stateless(call.tenant);
        let handle = self.core.task_key.decode(&call.tenant, raw).ok_or_else(|| not_found(raw))?;
        Ok((call, handle))
    }

    /// `tasks/get`: our task states mapped onto the extension's.
    pub(crate) async fn mcp_get_task(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (call, handle) = self.task_target(raw, context).await?;
        let page = PageRequest::new(None, None, Some(RUN_OUTPUT_CAP_BYTES as i64))
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let view = self.task_op(&call, &handle, raw, TaskOp::Status(page)).await?;
        Ok(GetTaskResult::new(self.detailed_task(raw, &handle, view)))
    }

    /// `tasks/cancel`: `cancel_task`'s semantics (TERM, KILL, confirmed within 3 s; a finished task is
    /// left as it was). Answers the empty acknowledgement.
    pub(crate) async fn mcp_cancel_task(
        &self,
        raw: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (call, handle) = self.task_target(raw, context).await?;
        let page = PageRequest::new(None, None, Some(1)).map_err(|e| McpError::internal_error(e.to_string(), None))?;
        self.task_op(&call, &handle, raw, TaskOp::Cancel(page)).await.map(|_| ())
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
        handle: &TaskHandle,
        raw: &str,
        op: TaskOp,
    ) -> Result<TaskView, McpError> {
        // The sandbox is checked to be the caller's tenant's (the MAC already says so) and resumed if paused.
        let method = op.method();
        let result = async {
            let sandbox = self.resolve_sandbox(call, Some(&handle.sandbox_id)).await?;
            let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
            let (id, task) = (sandbox.id.as_str(), &handle.task_id);
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
    fn detailed_task(&self, raw: &str, handle: &TaskHandle, view: TaskView) -> DetailedTask {
        let created = rfc3339_ms(handle.created_ms);
        let updated = view.finished_at.map(|s| rfc3339_ms((s * 1000.0) as u64)).unwrap_or_else(|| rfc3339_ms(now_ms()));
        let mut task = Task::new(raw, TaskStatus::Working, created, updated);
        task.ttl_ms = self.task_ttl_ms(handle, None);
        let payload = match view.state {
            TaskState::Running => {
                task.poll_interval_ms = Some(POLL_INTERVAL_MS);
                TaskPayload::Working
            }
            TaskState::Cancelled => TaskPayload::Cancelled,
            TaskState::Succeeded | TaskState::Failed | TaskState::TimedOut => {
                TaskPayload::Completed { result: completed_result(view, handle.kind) }
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
    if tool == "start_task" {
        return serde_json::from_value(arguments)
            .map_err(|e| ToolError::invalid(format!("invalid arguments for start_task: {e}")));
    }
    let args: RunCommandArgs = serde_json::from_value(arguments)
        .map_err(|e| ToolError::invalid(format!("invalid arguments for run_command: {e}")))?;
    if args.user.is_some_and(|u| u.name() != "user") {
        return Err(ToolError::invalid(
            "a task-run run_command runs as user 'user' only; call it without the tasks extension to run as root",
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
fn completed_result(view: TaskView, kind: TaskKind) -> JsonObject {
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
        TaskKind::StartTask { timeout } => Some(timeout),
        TaskKind::RunCommand => None,
    };
    let result = TaskRunResult {
        timeout: start_task,
        hint: start_task.map(|_| {
            format!(
                "The task has ended; its full saved output stays readable with get_task(sandbox_id=\"{}\", task_id=\"{}\").",
                view.sandbox_id, view.task_id
            )
        }),
        stdout_truncated: view.stdout_truncated || view.stdout_next_offset < view.stdout_size,
        stderr_truncated: view.stderr_truncated || view.stderr_next_offset < view.stderr_size,
        stdout_bytes: view.stdout_total_bytes.unwrap_or(view.stdout_size),
        stderr_bytes: view.stderr_total_bytes.unwrap_or(view.stderr_size),
        sandbox_id: view.sandbox_id,
        task_id: view.task_id,
        state: view.state,
        exit_code: view.exit_code.unwrap_or(-1),
        stdout: view.stdout,
        stderr: view.stderr,
        error,
        duration_ms,
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> TaskHandle {
        TaskHandle {
            sandbox_id: "sbx-1".into(),
            task_id: TaskId::parse("0123456789abcdef0123456789abcdef").expect("valid id"),
            created_ms: 1_700_000_000_000,
            kind: TaskKind::StartTask { timeout: 300 },
        }
    }

    #[test]
    fn ids_round_trip_for_their_tenant_only() {
        let key = TaskIdKey::from_secret(b"k1");
        let id = key.encode("acme", &handle());
        assert_eq!(key.decode("acme", &id), Some(handle()));
        assert_eq!(key.decode("beta", &id), None, "another tenant must not resolve the id");
        assert_eq!(TaskIdKey::from_secret(b"k2").decode("acme", &id), None, "another key must not resolve it");
    }

    #[test]
    fn forged_and_malformed_ids_are_refused() {
        let key = TaskIdKey::from_secret(b"k1");
        let id = key.encode("acme", &handle());
        let forged = id.replace("sbx-1", "sbx-2");
        assert_eq!(key.decode("acme", &forged), None);
        let other_kind = id.replace(".s300.", ".r.");
        assert_ne!(other_kind, id);
        assert_eq!(key.decode("acme", &other_kind), None);
        let mut tampered = id.clone();
        tampered.pop();
        tampered.push(if id.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(key.decode("acme", &tampered), None);
        for bad in
            ["", "sbx1", "sbx1.a.b.c.d", "sbx1.a.b.c.d.e", "tasks-conformance-nonexistent-12345", &format!("{id}.x")]
        {
            assert_eq!(key.decode("acme", bad), None, "{bad}");
        }
    }
}
