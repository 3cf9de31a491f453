//! One tool call from start to outcome: who is calling ([`CallContext`]: the
//! tenant and the MCP session), the per-tenant call quota, and the one place
//! where a failed call's [`ToolError`] becomes the sentence the agent reads —
//! masked, logged (one line per call), counted in the metrics, and, when the
//! provider reported its sandbox gone, that sandbox forgotten everywhere.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::request::Parts;
use rmcp::Json;

use super::error::ToolError;
use crate::gateway::http::auth::Tenant;
use crate::gateway::state::Gateway;
use crate::logging::escaped;

/// A tool result: structured value (plus its text copy), or an `isError` sentence.
pub(crate) type ToolResult<T> = Result<Json<T>, String>;

/// Header carrying each HTTP request's id (see `server::edge_layers`).
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// Who is calling: from the request's `Parts` (tenant set by the auth layer, session id header).
#[derive(Debug)]
pub(crate) struct CallContext {
    pub tenant: String,
    /// The MCP session (legacy protocol versions); None for sessionless 2026-07-28 requests.
    pub session_id: Option<String>,
    /// The sandbox this call acted on (for the log line).
    sandbox: Mutex<Option<String>>,
    /// The HTTP request's `x-request-id` (set by the gateway's request-id layer unless the client
    /// sent one; answered in the response's `x-request-id`), for the log line.
    request_id: Option<String>,
}

impl CallContext {
    pub(crate) fn set_sandbox(&self, sandbox_id: &str) {
        *crate::sync::lock(&self.sandbox) = Some(sandbox_id.to_string());
    }

    fn sandbox(&self) -> String {
        crate::sync::lock(&self.sandbox).clone().unwrap_or_default()
    }

    /// The request id for log lines ("-" when there is none, as in the tasks bridge).
    pub(crate) fn request_label(&self) -> &str {
        self.request_id.as_deref().unwrap_or("-")
    }

    /// Attaches the HTTP request's id (see the gateway's request-id layer).
    fn with_request_id(mut self, parts: &Parts) -> Self {
        self.request_id = parts.headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
        self
    }

    /// The session id for log lines ("-" when sessionless).
    pub(crate) fn session_label(&self) -> &str {
        self.session_id.as_deref().unwrap_or("-")
    }

    /// A sessionless context (2026-07-28 requests, the tasks bridge).
    pub(crate) fn stateless(tenant: String) -> Self {
        Self { tenant, session_id: None, sandbox: Mutex::new(None), request_id: None }
    }

    /// A context in a legacy MCP session.
    pub(crate) fn in_session(tenant: String, session_id: String) -> Self {
        Self { tenant, session_id: Some(session_id), sandbox: Mutex::new(None), request_id: None }
    }
}

impl Gateway {
    /// The tenant and session of the current call; refuses calls outside a live session of the tenant
    /// (the refusal already is the agent's sentence, logged).
    pub(crate) fn call_context(&self, tool: &'static str, parts: &Parts) -> Result<CallContext, String> {
        self.caller(parts).map_err(|err| self.fail(tool, None, None, err))
    }

    fn caller(&self, parts: &Parts) -> Result<CallContext, ToolError> {
        let tenant = parts.extensions.get::<Tenant>().map(|t| t.0.clone()).ok_or(ToolError::NoTenant)?;
        if crate::gateway::http::protocol_version::is_stateless_request(parts) {
            return Ok(CallContext::stateless(tenant).with_request_id(parts));
        }
        let session_id = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let session_id = session_id.ok_or(ToolError::NeedsSession)?;
        self.core.sessions.with_session(&session_id, &tenant, |_| ())?;
        Ok(CallContext::in_session(tenant, session_id).with_request_id(parts))
    }

    /// Runs a tool body under the tenant's call quota and logs one line with its outcome.
    pub(crate) async fn logged<T>(
        &self,
        tool: &'static str,
        call: &CallContext,
        body: impl Future<Output = Result<T, ToolError>>,
    ) -> ToolResult<T> {
        let started = Instant::now();
        let result = match self.core.quotas.start_call(&call.tenant) {
            Ok(_permit) => body.await,
            Err(refusal) => Err(refusal.into()),
        };
        let elapsed = started.elapsed();
        match result {
            Ok(value) => {
                self.core.metrics.record_tool_call(tool, true, Some(elapsed)); // ops (metrics)
                let duration_ms = duration_ms(elapsed);
                // Every client-supplied value that reaches the log is masked (a secret pasted as sandbox_id).
                let sandbox = call.sandbox();
                let sandbox = self.core.masker.mask(&sandbox);
                let request = self.core.masker.mask(call.request_label());
                tracing::info!(tool, session = %call.session_label(), tenant = %call.tenant,
                    sandbox = %sandbox, request = %request, duration_ms, outcome = "ok", "tool call");
                Ok(Json(value))
            }
            Err(err) => Err(self.fail(tool, Some(call), Some(elapsed), err)),
        }
    }

    /// [`Gateway::logged`] for a tool that works in a sandbox's agent: when the call fails because
    /// the sandbox seemed gone and the provider says it is there but paused (a session's cached
    /// look-up predates the pause, at its deadline or by another client), it is resumed through
    /// the provider's connect and the call runs once more. The first attempt reached nothing: the
    /// provider refuses a paused sandbox's agent traffic before it is forwarded.
    pub(crate) async fn logged_resuming<A: Clone, T, Body>(
        &self,
        tool: &'static str,
        call: &CallContext,
        args: A,
        body: impl Fn(A) -> Body,
    ) -> ToolResult<T>
    where
        Body: Future<Output = Result<T, ToolError>>,
    {
        let attempts = async {
            match body(args.clone()).await {
                Err(err) => match err.gone_sandbox().map(str::to_owned) {
                    Some(id) if self.resumable(call, &id).await => body(args).await,
                    _ => Err(err),
                },
                done => done,
            }
        };
        self.logged(tool, call, attempts).await
    }

    /// The one place a failed call becomes a sentence: the sandbox the provider reported gone is
    /// forgotten, the failure counted, the sentence masked (it may quote arguments, paths and
    /// provider messages), logged escaped (see [`escaped`]), and returned for the agent.
    pub(crate) fn fail(
        &self,
        tool: &'static str,
        call: Option<&CallContext>,
        elapsed: Option<Duration>,
        err: ToolError,
    ) -> String {
        if let Some(sandbox_id) = err.gone_sandbox() {
            self.core.forget_sandbox(sandbox_id);
        }
        if let Some(op) = err.provider_op() {
            self.core.metrics.record_provider_error(op); // ops (metrics)
        }
        self.core.metrics.record_tool_call(tool, false, elapsed); // ops (metrics)
        let sentence = self.core.masker.mask(&err.to_string()).into_owned();
        match call {
            Some(call) => {
                let sandbox = call.sandbox();
                let sandbox = self.core.masker.mask(&sandbox);
                let duration_ms = elapsed.map_or(0.0, duration_ms);
                let request = self.core.masker.mask(call.request_label());
                tracing::info!(tool, session = %call.session_label(), tenant = %call.tenant,
                    sandbox = %sandbox, request = %request, duration_ms, outcome = "error", error = %escaped(&sentence), "tool call");
            }
            None => tracing::info!(tool, outcome = "error", error = %escaped(&sentence), "tool call"),
        }
        sentence
    }
}

/// Milliseconds with one decimal, for log lines.
fn duration_ms(elapsed: Duration) -> f64 {
    (elapsed.as_secs_f64() * 10_000.0).round() / 10.0
}
