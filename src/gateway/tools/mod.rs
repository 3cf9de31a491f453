//! The MCP tools, one file per family (`sandbox`, `template`, `exec`,
//! `file`, `task`), and what every tool call goes through: who is calling,
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
pub mod task;
pub mod template;
