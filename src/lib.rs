//! sandbox-mcp: an MCP gateway that gives remote AI agents Linux sandboxes,
//! an E2B-compatible provider client, and an embedded E2B-compatible local
//! provider. See `docs/architecture.md` for the architecture and
//! `docs/provider-contract.md` for what it relies on from E2B's API.

pub mod config;
pub mod connect_rpc;
pub mod e2b;
pub mod gateway;
pub mod guarded_body;
pub mod healthcheck;
pub mod listen;
pub mod local;
pub mod logging;
pub mod masking;
pub mod tasks;
