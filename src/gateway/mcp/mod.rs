//! The MCP surface of the gateway: the `ServerHandler` that serves the
//! tools' routers (`handler`), the two protocol generations and what each
//! reads (`generation`, with portable schemas in `schema`), and the MCP Tasks extension (`mcp_tasks`) with its
//! ids (`mcp_task_id`). The tools themselves live in `tools/`.

pub mod generation;
pub mod handler;
pub mod mcp_task_id;
pub mod mcp_tasks;
pub mod schema;
