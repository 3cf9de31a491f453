//! The MCP tools, one file per family (`sandbox`, `snapshot`, `template`,
//! `exec`, `file`, `task`), and what every tool call goes through: who is calling,
//! the call quota and the one log line (`calls`), the typed errors and their
//! sentences (`error`), sandbox resolution and the tenant check (`access`),
//! argument limits (`args`) and the bound on a result's size
//! (`result_size`). See `docs/architecture.md`, "Add a tool".

pub mod access;
pub mod args;
pub mod calls;
pub mod envd_transport;
pub mod error;
pub mod exec;
pub mod file;
pub mod result_size;
pub mod sandbox;
pub mod snapshot;
pub mod task;
pub mod template;

/// Every tool's name, in the order of `tools/list` families. Each is defined once, beside its tool; this
/// list and the router are checked against each other below.
pub const ALL: &[&str] = &[
    sandbox::CREATE_SANDBOX,
    sandbox::CONNECT_SANDBOX,
    sandbox::KILL_SANDBOX,
    sandbox::LIST_SANDBOXES,
    snapshot::SNAPSHOT_SANDBOX,
    snapshot::FORK_SANDBOX,
    snapshot::LIST_SNAPSHOTS,
    snapshot::DELETE_SNAPSHOT,
    template::LIST_TEMPLATES,
    exec::RUN_COMMAND,
    file::READ_FILE,
    file::WRITE_FILE,
    file::LIST_FILES,
    task::START_TASK,
    task::GET_TASK,
    task::CANCEL_TASK,
    task::LIST_TASKS,
];

impl crate::gateway::state::Gateway {
    /// Every tool family, combined once (raw schemars schemas, legacy descriptions). A new family adds its
    /// router here.
    pub fn tool_router() -> rmcp::handler::server::router::tool::ToolRouter<crate::gateway::state::Gateway> {
        Self::sandbox_router()
            + Self::snapshot_router()
            + Self::template_router()
            + Self::exec_router()
            + Self::file_router()
            + Self::task_router()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tool_name_is_defined_once_and_routed() {
        let router = crate::gateway::state::Gateway::tool_router();
        let mut routed: Vec<String> = router.list_all().into_iter().map(|t| t.name.into_owned()).collect();
        let mut named: Vec<String> = ALL.iter().map(|n| n.to_string()).collect();
        routed.sort();
        named.sort();
        assert_eq!(routed, named, "every #[tool] needs its name constant in ALL, and every constant a tool");
    }
}
