//! The two MCP protocol generations served on one `/mcp`: what each
//! generation reads (tool descriptions, instructions, `tools/list` cache
//! hints) and the routers built for each (with the portable schemas of
//! `schema`). Which generation a request belongs to, from its headers, is
//! `http::protocol_version`.
//!
//! Legacy clients (2024-11-05 … 2025-11-25) use `initialize` and
//! `Mcp-Session-Id`; 2026-07-28 requests carry their version in `_meta` and
//! the `MCP-Protocol-Version` header and are served without a session.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CacheScope, JsonObject, ListToolsResult, ProtocolVersion, ResultType};
use serde_json::Value;

use super::schema::portable_schema_object;
use crate::gateway::http::protocol_version::is_stateless_version;
use crate::gateway::state::{Gateway, Routers};
use crate::gateway::tools::exec::RUN_COMMAND;
use crate::gateway::tools::file::{LIST_FILES, READ_FILE, WRITE_FILE};
use crate::gateway::tools::sandbox::{CONNECT_SANDBOX, CREATE_SANDBOX, LIST_SANDBOXES};
use crate::gateway::tools::snapshot::FORK_SANDBOX;
use crate::gateway::tools::task::{LIST_TASKS, START_TASK};

/// How long a 2026-07-28 client may cache `tools/list` (the list changes only with a new release).
pub const TOOLS_LIST_TTL_MS: u64 = 300_000;

/// Server instructions for legacy (session) clients.
pub const LEGACY_INSTRUCTIONS: &str = "Linux sandboxes for agents. Call create_sandbox first (it becomes this \
     session's default sandbox), then run_command, write_file, read_file, list_files. Sandboxes you create are \
     killed when this MCP session ends; use connect_sandbox to reuse an existing one.";

/// Server instructions for 2026-07-28 clients (`server/discover`).
pub const STATELESS_INSTRUCTIONS: &str = "Linux sandboxes for agents. Call create_sandbox first and pass its \
     sandbox_id to every other tool (run_command, write_file, read_file, list_files, ...): there is no session \
     and no default sandbox. A sandbox lives until its deadline (extended when you use it) or until kill_sandbox; \
     it is not killed when you disconnect, so kill it when done. With the io.modelcontextprotocol/tasks \
     extension, run_command and start_task run as MCP tasks (poll tasks/get, stop with tasks/cancel).";

/// Whether a negotiated protocol version belongs to the sessionless generation.
pub fn is_stateless_protocol(version: Option<&ProtocolVersion>) -> bool {
    version.is_some_and(|v| is_stateless_version(v.as_str()))
}

/// Descriptions 2026-07-28 clients read instead of the session-worded ones.
fn stateless_description(tool: &str) -> Option<&'static str> {
    Some(match tool {
        CREATE_SANDBOX => {
            "Create a new Linux sandbox and return its sandbox_id: pass it to every other tool (there is no \
             session and no default sandbox). It lives until its deadline (timeout; extended when run_command or \
             the file tools use it) or until kill_sandbox: it is NOT killed when you disconnect, so kill it when \
             done."
        }
        CONNECT_SANDBOX => {
            "Check that a sandbox of yours exists (resuming it if paused) and return its state and deadline. \
             Pass its sandbox_id to the other tools."
        }
        LIST_SANDBOXES => {
            "List your sandboxes (running or paused) with their deadlines, your metadata, and for a fork its parent."
        }
        FORK_SANDBOX => {
            "Fork a sandbox of yours: make count new sandboxes (default 1), each starting with a copy of its files \
             and metadata as they are now (not its running processes, open connections or memory). sandbox_id is \
             required. Each fork counts as one of your sandboxes and lives until its deadline (timeout; extended \
             when run_command or the file tools use it) or until kill_sandbox: it is NOT killed when you \
             disconnect, so kill it when done. Returns each fork's sandbox_id and inbound access, or that fork's \
             own error."
        }
        RUN_COMMAND => {
            "Run a shell command in a sandbox and wait for it (bash -l -c). sandbox_id is required. Returns \
             exit_code, stdout and stderr (each capped at 64 KiB, with a truncation flag). A non-zero exit code is \
             a normal result. Timeout 1-600 s (default 60). Runs as user 'user' unless user is 'root'. A request \
             that declares the io.modelcontextprotocol/tasks extension in its own _meta gets an MCP task instead (a real \
             background task in the sandbox, as start_task; user 'user' only): poll tasks/get for the same \
             result, stop it with tasks/cancel."
        }
        READ_FILE | WRITE_FILE | LIST_FILES => return None,
        START_TASK => {
            "Start a long-running shell command in the background in a sandbox and return at once with a handle \
             (sandbox_id, task_id). sandbox_id is required. The task keeps running after you disconnect or the \
             server restarts; read its output and exit code with get_task (paged, up to 1 MiB per stream is \
             saved), stop it with cancel_task, recover handles with list_tasks. Timeout 1-3600 s (default 300). \
             The sandbox's own deadline still applies. A request that declares the io.modelcontextprotocol/tasks \
             extension in its own _meta gets an MCP task instead (poll tasks/get, stop with tasks/cancel)."
        }
        LIST_TASKS => {
            "List every background task in a sandbox (task_id, state, times, exit code, first line of the \
             command), oldest first. sandbox_id is required."
        }
        _ => return None,
    })
}

/// Builds both generations' routers: portable schemas everywhere, sessionless wording for 2026-07-28.
pub fn build_routers(base: ToolRouter<Gateway>) -> Routers {
    let mut legacy = base;
    for route in legacy.map.values_mut() {
        route.attr.input_schema = Arc::new(portable_schema_object(&route.attr.input_schema));
        if let Some(output) = &route.attr.output_schema {
            route.attr.output_schema = Some(Arc::new(portable_schema_object(output)));
        }
    }
    let mut modern = legacy.clone();
    for route in modern.map.values_mut() {
        let name = route.attr.name.to_string();
        if let Some(text) = stateless_description(&name) {
            route.attr.description = Some(text.into());
        } else if let Some(text) = route.attr.description.as_ref() {
            let reworded = text
                .replace("Omit sandbox_id to use the session's default sandbox.", "sandbox_id is required.")
                .replace("omit to use this session's default sandbox", "required (there is no session)");
            route.attr.description = Some(reworded.into());
        }
        reword_sandbox_id_property(&mut route.attr.input_schema);
    }
    Routers { legacy, modern }
}

/// The `sandbox_id` property description in 2026-07-28 schemas (it is still optional in the schema so
/// that one argument type serves both generations; the tool answers with `ToolError::MissingSandboxId`).
fn reword_sandbox_id_property(schema: &mut Arc<JsonObject>) {
    let mut object = (**schema).clone();
    if let Some(Value::Object(props)) = object.get_mut("properties")
        && let Some(Value::Object(prop)) = props.get_mut("sandbox_id")
        && let Some(Value::String(text)) = prop.get_mut("description")
        && text.contains("default sandbox")
    {
        *text = "Sandbox to act on (required: the sandbox_id returned by create_sandbox).".into();
    }
    *schema = Arc::new(object);
}

/// The `tools/list` answer for a generation (2026-07-28 gets cache hints).
pub fn list_tools(routers: &Routers, stateless: bool) -> ListToolsResult {
    let router = if stateless { &routers.modern } else { &routers.legacy };
    let mut result = ListToolsResult::with_all_items(router.list_all());
    result.result_type = Some(ResultType::COMPLETE);
    if stateless {
        result.ttl_ms = Some(TOOLS_LIST_TTL_MS);
        result.cache_scope = Some(CacheScope::Public);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_schema_is_portable() {
        let routers = Gateway::routers();
        for router in [&routers.legacy, &routers.modern] {
            for tool in router.list_all() {
                let mut text = serde_json::to_string(&*tool.input_schema).unwrap_or_default();
                if let Some(output) = &tool.output_schema {
                    text.push_str(&serde_json::to_string(&**output).unwrap_or_default());
                }
                for bad in ["\"uint", "\"int64\"", "\"int32\"", "\"double\"", "\"float\"", "\"type\":["] {
                    assert!(!text.contains(bad), "{}: {bad} in {text}", tool.name);
                }
            }
        }
    }

    #[test]
    fn stateless_descriptions_do_not_mention_sessions() {
        let routers = Gateway::routers();
        for tool in routers.modern.list_all() {
            let text = tool.description.as_deref().unwrap_or_default().to_lowercase().replace("no session", "");
            assert!(!text.contains("session"), "{}: {text}", tool.name);
            assert!(!text.contains("default sandbox") || text.contains("no default sandbox"), "{}: {text}", tool.name);
        }
        let legacy = routers.legacy.get(CREATE_SANDBOX).and_then(|t| t.description.clone()).unwrap_or_default();
        assert!(legacy.contains("session"));
    }
}
