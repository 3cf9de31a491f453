//! The MCP client of the tests and benches (rmcp's streamable HTTP client): connect (a legacy
//! session, or stateless MCP 2026-07-28), call a tool, read its text, close. The plain functions
//! panic with the tool and the reason (tests); the `try_` ones return errors (benches).

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

pub type McpClient = RunningService<RoleClient, ClientConfig>;
pub type Peer = rmcp::Peer<RoleClient>;

/// How long a tool call may take before the helpers give up.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Connects with `version` (a legacy session for 2025-11-25, stateless for 2026-07-28) and an optional bearer token.
pub async fn try_connect_as(url: &str, token: Option<&str>, version: ProtocolVersion) -> anyhow::Result<McpClient> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let info = ClientConfig::new(ClientCapabilities::default(), Implementation::new("sandbox-mcp-tests", "0"))
        .with_protocol_version(version);
    Ok(info.serve(transport).await?)
}

/// A legacy MCP session (2025-11-25, initialize done) with an optional bearer token.
pub async fn try_connect(url: &str, token: Option<&str>) -> anyhow::Result<McpClient> {
    try_connect_as(url, token, ProtocolVersion::V_2025_11_25).await
}

/// [`try_connect`], panicking.
pub async fn connect(url: &str, token: Option<&str>) -> McpClient {
    try_connect(url, token).await.unwrap_or_else(|e| panic!("MCP initialize at {url}: {e}"))
}

/// A client of the newest protocol (2026-07-28: no session), panicking.
pub async fn connect_latest(url: &str, token: Option<&str>) -> McpClient {
    try_connect_as(url, token, ProtocolVersion::LATEST).await.unwrap_or_else(|e| panic!("MCP initialize at {url}: {e}"))
}

/// Calls a tool; the raw result, or a protocol error or timeout.
pub async fn try_call(client: &Peer, tool: &str, args: Value) -> anyhow::Result<CallToolResult> {
    let Value::Object(map) = args else { anyhow::bail!("{tool}: arguments must be an object") };
    let request = client.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map));
    match tokio::time::timeout(CALL_TIMEOUT, request).await {
        Ok(result) => Ok(result?),
        Err(_) => anyhow::bail!("{tool}: no answer within {} s", CALL_TIMEOUT.as_secs()),
    }
}

/// Calls a tool that must succeed; its structured content, or an error with the tool's text.
pub async fn tool(client: &Peer, tool: &str, args: Value) -> anyhow::Result<Value> {
    let result = try_call(client, tool, args).await?;
    if result.is_error == Some(true) {
        anyhow::bail!("{tool} failed: {}", text(&result));
    }
    result.structured_content.ok_or_else(|| anyhow::anyhow!("{tool}: no structured content"))
}

/// Calls a tool; the raw result (panics on a protocol error or timeout).
pub async fn call(client: &Peer, tool: &str, args: Value) -> CallToolResult {
    try_call(client, tool, args).await.unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// Text content of a result.
pub fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

/// Calls a tool that must succeed; returns its structured content.
pub async fn ok(client: &Peer, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args).await;
    assert_ne!(result.is_error, Some(true), "{tool} failed: {}", text(&result));
    result.structured_content.clone().unwrap_or_else(|| panic!("{tool}: no structured content"))
}

/// Calls a tool that must fail; returns its error text.
pub async fn err(client: &Peer, tool: &str, args: Value) -> String {
    let result = call(client, tool, args).await;
    assert_eq!(result.is_error, Some(true), "{tool} should have failed: {:?}", result.structured_content);
    text(&result)
}

/// Ends an MCP session (the client sends DELETE).
pub async fn close(mut client: McpClient) {
    let _ = client.close_with_timeout(Duration::from_secs(10)).await;
}

/// `{}`.
pub fn empty() -> Value {
    json!({})
}
