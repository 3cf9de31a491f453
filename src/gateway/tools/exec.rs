//! Foreground command execution: `run_command`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::{
    MAX_COMMAND_BYTES, RUN_DEFAULT_TIMEOUT_SECS, RUN_MAX_TIMEOUT_SECS, RUN_OUTPUT_CAP_BYTES, RunAs, validate_envs,
    validate_path, validate_range,
};
use super::calls::CallContext;
use super::error::ToolError;
use super::result_size;
use crate::e2b::{CallOptions, E2bError, OutputLimits, wire};
use crate::gateway::state::Gateway;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// Shell command line, run as `/bin/bash -l -c COMMAND` (at most 65,536 bytes).
    pub command: String,
    /// Sandbox to run in; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Working directory (default: the user's home, /home/user).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub envs: Option<HashMap<String, String>>,
    /// Seconds to wait for the command to finish (1-600, default 60). A command still running then is
    /// killed; use start_task for longer work.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// "user" (default, unprivileged) or "root".
    #[serde(default)]
    pub user: Option<RunAs>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RunCommandResult {
    pub sandbox_id: String,
    /// Exit code of the command (non-zero is a normal result, not a tool error); -1 if killed by a signal.
    pub exit_code: i32,
    #[serde(flatten)]
    pub outcome: CommandOutcome,
}

/// What a command wrote and how it ended besides its exit code: part of `run_command`'s result, and
/// of an MCP task's (`mcp_tasks`), which has the same shape.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CommandOutcome {
    /// Standard output (first 64 KiB, decoded as UTF-8 with invalid bytes replaced).
    pub stdout: String,
    /// Standard error (first 64 KiB).
    pub stderr: String,
    /// True if stdout was cut: past 64 KiB, or to keep the result under the 1 MiB message limit.
    pub stdout_truncated: bool,
    /// True if stderr was cut (as stdout_truncated).
    pub stderr_truncated: bool,
    /// Total bytes the command wrote to stdout / stderr.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// How the process ended, when not a plain exit (e.g. "signal: killed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl CommandOutcome {
    /// Cuts stdout and stderr (setting their truncation flags) so that the result they are part of,
    /// `size` bytes as sent ([`result_size::encoded_size`]), fits [`result_size::MAX_RESULT_BYTES`].
    pub fn fit(&mut self, size: usize) {
        if size <= result_size::MAX_RESULT_BYTES {
            return;
        }
        let (out, err) = (result_size::cost(&self.stdout), result_size::cost(&self.stderr));
        let fixed = size.saturating_sub(out + err);
        let budget = result_size::MAX_RESULT_BYTES.saturating_sub(fixed);
        let (out_budget, err_budget) = result_size::split_budget(out, err, budget);
        for (text, truncated, budget) in [
            (&mut self.stdout, &mut self.stdout_truncated, out_budget),
            (&mut self.stderr, &mut self.stderr_truncated, err_budget),
        ] {
            let (kept, cut) = result_size::clip(text, budget);
            if cut {
                *text = kept.to_string();
                *truncated = true;
            }
        }
    }
}

/// The `run_command` tool's name (its function below must have this name: `tools::tests` checks).
pub const RUN_COMMAND: &str = "run_command";

#[tool_router(router = exec_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "Run a shell command in a sandbox and wait for it (bash -l -c). Returns exit_code, \
        stdout and stderr (each capped at 64 KiB, with a truncation flag). A non-zero exit code is a normal \
        result. Timeout 1-600 s (default 60); for longer work use start_task. Runs as user 'user' unless \
        user is 'root'. Omit sandbox_id to use the session's default sandbox.")]
    pub async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommandArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<RunCommandResult>, String> {
        let call = self.call_context(RUN_COMMAND, &parts)?;
        self.logged_resuming(RUN_COMMAND, &call, args, |args| self.run_command_impl(&call, args)).await
    }
}

impl Gateway {
    async fn run_command_impl(&self, call: &CallContext, args: RunCommandArgs) -> Result<RunCommandResult, ToolError> {
        if args.command.trim().is_empty() {
            return Err(ToolError::invalid("command must not be empty"));
        }
        if args.command.len() > MAX_COMMAND_BYTES {
            return Err(ToolError::invalid(format!(
                "command is {} bytes long; the limit is {MAX_COMMAND_BYTES}: write a script with write_file and run it",
                args.command.len()
            )));
        }
        if args.command.contains('\0') {
            return Err(ToolError::invalid("command must not contain NUL characters"));
        }
        if let Some(cwd) = &args.cwd {
            validate_path("cwd", cwd)?;
        }
        let envs = args.envs.unwrap_or_default();
        validate_envs(&envs)?;
        let timeout = args.timeout.unwrap_or(RUN_DEFAULT_TIMEOUT_SECS);
        validate_range("timeout", timeout, 1, RUN_MAX_TIMEOUT_SECS)?;
        let user = args.user.unwrap_or_default();

        let sandbox = self.resolve_sandbox(call, args.sandbox_id.as_deref()).await?;
        self.renew_on_use(&sandbox.id);
        let mut request = wire::StartRequest::login_shell(args.command);
        request.process.envs = envs;
        request.process.cwd = args.cwd;
        let options = CallOptions::user(user.name()).with_timeout(Duration::from_secs(timeout));
        let limits = OutputLimits { max_stdout: RUN_OUTPUT_CAP_BYTES, max_stderr: RUN_OUTPUT_CAP_BYTES };
        let started = Instant::now();
        let output = match sandbox.envd.run(&request, &options, limits).await {
            Ok(output) => output,
            Err(E2bError::Timeout { .. }) => {
                return Err(ToolError::CommandTimedOut { timeout, sandbox_id: sandbox.id });
            }
            Err(err) => return Err(ToolError::sandbox_call("run a command in", &sandbox.id, err)),
        };
        let outcome = CommandOutcome {
            stdout: self.core.masker.mask_clipped(&String::from_utf8_lossy(&output.stdout), output.stdout_truncated),
            stderr: self.core.masker.mask_clipped(&String::from_utf8_lossy(&output.stderr), output.stderr_truncated),
            stdout_truncated: output.stdout_truncated,
            stderr_truncated: output.stderr_truncated,
            stdout_bytes: output.stdout_total,
            stderr_bytes: output.stderr_total,
            error: if output.exited { None } else { Some(output.status.clone()).filter(|s| !s.is_empty()) },
            duration_ms: started.elapsed().as_millis() as u64,
        };
        let mut result = RunCommandResult { sandbox_id: sandbox.id, exit_code: output.exit_code, outcome };
        result.outcome.fit(result_size::encoded_size(&result));
        Ok(result)
    }
}
