//! sandbox-mcp: an MCP gateway that gives remote AI agents Linux sandboxes,
//! an E2B-compatible provider client, and an embedded E2B-compatible local
//! provider. See `docs/architecture.md` for the architecture and
//! `docs/provider-contract.md` for what it relies on from E2B's API.
//!
//! Crate rules (checked by the compiler and by `tests/crate_rules.rs`):
//! - `unsafe` is denied everywhere except in the modules of the local provider
//!   that make system calls (each allowed by name in the `mod.rs` of its folder
//!   under `local/`, each `unsafe` block with a `SAFETY:` comment);
//! - every source file opens with a `//!` comment saying what it owns.

#![deny(unsafe_code)]

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
pub mod procfs;
pub mod sync;
pub mod tasks;
pub mod tenant;

/// The integration tests' skip gate for unit tests too (`SANDBOX_MCP_NO_SKIP=1` turns a skip
/// into a failure).
#[cfg(test)]
#[path = "../tests/it/common/gate.rs"]
#[allow(dead_code)]
pub(crate) mod skip_gate;
