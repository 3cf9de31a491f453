//! What the per-session MCP handler ([`Gateway`], defined in `state`) serves:
//! every tool family's router combined, the routers of both protocol
//! generations, and the `ServerHandler` methods (tools, MCP tasks). What a
//! tool call needs lives beside it: the caller and the error-to-sentence step
//! in `calls`, sandbox resolution in `access`, shared state in `state`, the
//! errors in `error`. The tool families import `state`, never this module.

use std::borrow::Cow;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, DiscoverResult, GetTaskParams, GetTaskResult,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, tool_handler};

use super::generation;
use super::mcp_tasks;

use crate::gateway::state::{Gateway, Routers};

impl Gateway {
    /// Both generations' routers, built once and shared by every session and request.
    pub fn routers() -> Routers {
        generation::build_routers(Self::tool_router())
    }
}

// The MCP-task paths below are boxed: rmcp spawns one task per request whose future holds the
// largest of these methods' futures, and the task paths' were large (the spawned task was 17.7 KB,
// allocated, and moved, on every plain tool call too; under 2 KB once they are boxed).
#[tool_handler(router = self.routers.legacy)]
impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(generation::LEGACY_INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // Legacy versions keep sessions; 2026-07-28 requests are served without one.
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, McpError> {
        let info = self.get_info().with_instructions(generation::STATELESS_INSTRUCTIONS);
        Ok(DiscoverResult::from_server_info(self.supported_protocol_versions().into_owned(), info))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let stateless = generation::is_stateless_protocol(context.protocol_version().as_ref());
        Ok(generation::list_tools(&self.routers, stateless))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if mcp_tasks::wants_task(&request, &context) {
            return Box::pin(self.call_tool_as_task(request, context)).await;
        }
        let stateless = generation::is_stateless_protocol(context.protocol_version().as_ref());
        let router = if stateless { &self.routers.modern } else { &self.routers.legacy };
        if !router.has_route(&request.name) {
            return Err(unknown_tool(router, &request.name));
        }
        router.call(ToolCallContext::new(self, request, context)).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        Box::pin(self.mcp_get_task(&request.task_id, &context)).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(self.mcp_update_task(&request.task_id, &context)).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Box::pin(self.mcp_cancel_task(&request.task_id, &context)).await
    }
}

/// An unknown tool's error names the tools that exist (a bare "tool not found" leaves an agent guessing).
fn unknown_tool(router: &ToolRouter<Gateway>, name: &str) -> McpError {
    let mut names: Vec<String> = router.list_all().into_iter().map(|t| t.name.into_owned()).collect();
    names.sort();
    McpError::invalid_params(
        format!(
            "tool not found: {:?}; this server's tools are: {}",
            crate::gateway::tools::args::clip(name, 80),
            names.join(", ")
        ),
        None,
    )
}
