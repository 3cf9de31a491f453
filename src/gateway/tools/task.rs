//! Reconnectable background tasks: `start_task`, `get_task`, `cancel_task`,
//! `list_tasks`. The task's truth lives in the sandbox (see `crate::tasks`);
//! these tools only reach a sandbox through the normal connect path (which
//! resumes a paused sandbox), never extend its deadline, and never make it
//! owned. `start_task` retains the sandbox for the session before launching.
//! The task service reaches the sandbox through `envd_transport`.

use std::collections::{BTreeMap, HashMap};

use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::access::ResolvedSandbox;
use super::args::validate_envs;
use super::calls::CallContext;
use super::envd_transport::EnvdTransport;
use super::error::ToolError;
use super::result_size;
use crate::gateway::state::Gateway;
use crate::tasks::TaskId;
use crate::tasks::launch::{self, TaskSpec};
use crate::tasks::page::{self, PageRequest};
use crate::tasks::service::{TaskError, TaskService};
use crate::tasks::view::{StartedTask, TaskListView, TaskView};

/// `list_tasks`' answer: the sandbox's tasks, oldest first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListTasksResult {
    #[serde(flatten)]
    pub view: TaskListView,
    /// True if the list was cut (newest tasks left off) to keep the answer under the 1 MiB message limit.
    pub truncated: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartTaskArgs {
    /// Shell command line, run as `bash -c COMMAND` in the background (at most 65,536 characters).
    pub command: String,
    /// Sandbox to run in; omit to use this session's default sandbox. A task never creates a sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Working directory, an absolute path (default: /home/user).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Seconds after which the task is stopped (TERM, then KILL) and ends as timed_out: 1-3600, default 300.
    /// The sandbox's own deadline still applies and is not extended by task tools.
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Extra environment variables. Values of variables whose names contain KEY, TOKEN, SECRET or PASSWORD are
    /// masked in the saved output.
    #[serde(default)]
    pub envs: Option<HashMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetTaskArgs {
    /// Sandbox holding the task (as returned by start_task).
    pub sandbox_id: String,
    /// The task's id: 32 lowercase hex characters (as returned by start_task or list_tasks).
    pub task_id: String,
    /// Byte offset into the saved stdout to read from (0-1,048,576; default 0). Pass the previous
    /// stdout_next_offset to read on.
    #[serde(default)]
    pub stdout_offset: Option<i64>,
    /// Byte offset into the saved stderr (0-1,048,576; default 0).
    #[serde(default)]
    pub stderr_offset: Option<i64>,
    /// Most bytes returned per stream (1-65,536; default 16,384).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Wait up to this many seconds (0-30, default 0) for new output past the offsets or a state change
    /// before answering.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelTaskArgs {
    /// Sandbox holding the task.
    pub sandbox_id: String,
    /// The task's id: 32 lowercase hex characters.
    pub task_id: String,
    /// Byte offset into the saved stdout for the returned page (0-1,048,576; default 0).
    #[serde(default)]
    pub stdout_offset: Option<i64>,
    /// Byte offset into the saved stderr for the returned page (0-1,048,576; default 0).
    #[serde(default)]
    pub stderr_offset: Option<i64>,
    /// Most bytes returned per stream (1-65,536; default 16,384).
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksArgs {
    /// Sandbox whose tasks to list; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

/// The `start_task` tool's name (its function below must have this name: `tools::tests` checks).
pub const START_TASK: &str = "start_task";
/// The `get_task` tool's name (its function below must have this name: `tools::tests` checks).
pub const GET_TASK: &str = "get_task";
/// The `cancel_task` tool's name (its function below must have this name: `tools::tests` checks).
pub const CANCEL_TASK: &str = "cancel_task";
/// The `list_tasks` tool's name (its function below must have this name: `tools::tests` checks).
pub const LIST_TASKS: &str = "list_tasks";

#[tool_router(router = task_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "Start a long-running shell command in the background in a sandbox and return at once with \
        a handle (sandbox_id, task_id). The task keeps running after this MCP session ends or the server \
        restarts; read its output and exit code with get_task (paged, up to 1 MiB per stream is saved), stop \
        it with cancel_task, and recover handles with list_tasks. Timeout 1-3600 s (default 300). The sandbox \
        is kept alive when this session ends. If state is \"unknown\", do not start it again: inspect it with \
        get_task.")]
    pub async fn start_task(
        &self,
        Parameters(args): Parameters<StartTaskArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<StartedTask>, String> {
        let call = self.call_context(START_TASK, &parts)?;
        self.logged_resuming(START_TASK, &call, args, |args| self.start_task_impl(&call, args)).await
    }

    #[tool(description = "Read a background task's state, exit code and one page of its saved stdout/stderr. Needs \
        sandbox_id and task_id. Page with stdout_offset/stderr_offset (pass back the *_next_offset values) and \
        limit; wait_seconds (0-30) waits for new output or a state change. States: running, succeeded, failed, \
        cancelled, timed_out, unknown. A non-zero exit code is a normal result. Reading the same offsets again \
        returns the same page.")]
    pub async fn get_task(
        &self,
        Parameters(args): Parameters<GetTaskArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<TaskView>, String> {
        let call = self.call_context(GET_TASK, &parts)?;
        self.logged_resuming(GET_TASK, &call, args, |args| self.get_task_impl(&call, args)).await
    }

    #[tool(
        description = "Stop a background task: TERM, then KILL, to the task's own process group, waiting up to 3 s \
        for it to end. Returns the same fields as get_task plus cancel_confirmed (true only when the task was \
        seen ending as cancelled). A task that already finished is left as it was and its saved outcome returned."
    )]
    pub async fn cancel_task(
        &self,
        Parameters(args): Parameters<CancelTaskArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<TaskView>, String> {
        let call = self.call_context(CANCEL_TASK, &parts)?;
        self.logged_resuming(CANCEL_TASK, &call, args, |args| self.cancel_task_impl(&call, args)).await
    }

    #[tool(description = "List every background task in a sandbox (task_id, state, times, exit code, first line of \
        the command), oldest first. Use it to recover task handles. Omit sandbox_id to use the session's default \
        sandbox.")]
    pub async fn list_tasks(
        &self,
        Parameters(args): Parameters<ListTasksArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ListTasksResult>, String> {
        let call = self.call_context(LIST_TASKS, &parts)?;
        self.logged_resuming(LIST_TASKS, &call, args, |args| self.list_tasks_impl(&call, args)).await
    }
}

impl Gateway {
    /// The gateway's task service (its install cache is shared by every session).
    pub(crate) fn tasks(&self) -> &TaskService {
        &self.core.tasks
    }

    /// Resolves the sandbox (tenant check; a paused one is resumed) without renewing its deadline.
    async fn task_sandbox(&self, call: &CallContext, sandbox_id: Option<&str>) -> Result<ResolvedSandbox, ToolError> {
        self.resolve_sandbox(call, sandbox_id).await.map_err(ToolError::for_tasks)
    }

    pub(crate) async fn start_task_impl(
        &self,
        call: &CallContext,
        args: StartTaskArgs,
    ) -> Result<StartedTask, ToolError> {
        // Everything is validated, and the id chosen, before any remote connection.
        let envs_map = args.envs.unwrap_or_default();
        validate_envs(&envs_map)?;
        let envs: BTreeMap<String, String> = envs_map.into_iter().collect();
        let spec = TaskSpec::new(args.command, args.cwd, envs, args.timeout)?;
        let task_id = TaskId::generate();
        launch::start_launch(&task_id, &spec)?;

        let sandbox = self.task_sandbox(call, args.sandbox_id.as_deref()).await?;
        // Retain before launching: even an uncertain launch keeps the sandbox past the session.
        let mut newly_retained = false;
        if let Some(session_id) = call.session_id.as_deref() {
            let id = sandbox.id.clone();
            newly_retained =
                self.core.sessions.update(session_id, &call.tenant, move |s| s.retained.insert(id)).await?;
        }
        let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
        match self.tasks().start(&transport, &sandbox.id, &task_id, &spec).await {
            Err(TaskError::NoPython { sandbox_id, found, .. }) => {
                // Nothing started: the sandbox is not kept for a task it never ran.
                if let (true, Some(session_id)) = (newly_retained, call.session_id.as_deref()) {
                    let id = sandbox.id.clone();
                    let _ = self.core.sessions.update(session_id, &call.tenant, move |s| s.retained.remove(&id)).await;
                }
                let template = self.core.provider.get_sandbox(&sandbox_id).await.ok().map(|d| d.template_id);
                Err(TaskError::NoPython { sandbox_id, template, found }.into())
            }
            other => other.map_err(ToolError::from),
        }
    }

    async fn get_task_impl(&self, call: &CallContext, args: GetTaskArgs) -> Result<TaskView, ToolError> {
        let task_id = TaskId::parse(&args.task_id)?;
        let page = PageRequest::new(args.stdout_offset, args.stderr_offset, args.limit)?;
        let wait = page::check_wait(args.wait_seconds)?;
        let sandbox = self.task_sandbox(call, Some(&args.sandbox_id)).await?;
        let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
        let view = self.tasks().status(&transport, &sandbox.id, &task_id, &page, wait).await?;
        self.fit_task_page(&transport, &task_id, page, view).await
    }

    /// A page whose result would pass the message bound ([`result_size::MAX_RESULT_BYTES`]: escape-heavy
    /// output costs up to 13 bytes a byte) is read again with a smaller `limit`, so the `*_next_offset`
    /// values still page through every byte.
    pub(crate) async fn fit_task_page(
        &self,
        transport: &EnvdTransport<'_>,
        task_id: &TaskId,
        mut page: PageRequest,
        mut view: TaskView,
    ) -> Result<TaskView, ToolError> {
        for _ in 0..4 {
            let size = result_size::encoded_size(&view);
            if size <= result_size::MAX_RESULT_BYTES || page.limit <= 1 {
                break;
            }
            let scaled = (page.limit as u128 * result_size::MAX_RESULT_BYTES as u128 * 9 / 10 / size as u128) as u64;
            page.limit = scaled.clamp(1, page.limit - 1);
            let confirmed = view.cancel_confirmed;
            view = self.tasks().status(transport, &transport.sandbox.id, task_id, &page, 0.0).await?;
            view.cancel_confirmed = confirmed;
        }
        Ok(view)
    }

    async fn cancel_task_impl(&self, call: &CallContext, args: CancelTaskArgs) -> Result<TaskView, ToolError> {
        let task_id = TaskId::parse(&args.task_id)?;
        let page = PageRequest::new(args.stdout_offset, args.stderr_offset, args.limit)?;
        let sandbox = self.task_sandbox(call, Some(&args.sandbox_id)).await?;
        let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
        let view = self.tasks().cancel(&transport, &sandbox.id, &task_id, &page).await?;
        self.fit_task_page(&transport, &task_id, page, view).await
    }

    async fn list_tasks_impl(&self, call: &CallContext, args: ListTasksArgs) -> Result<ListTasksResult, ToolError> {
        let sandbox = self.task_sandbox(call, args.sandbox_id.as_deref()).await?;
        let transport = EnvdTransport { gateway: self, sandbox: &sandbox };
        let mut result = ListTasksResult { view: self.tasks().list(&transport, &sandbox.id).await?, truncated: false };
        result.truncated = result_size::fit_list(&mut result, |r| &mut r.view.tasks);
        Ok(result)
    }
}
