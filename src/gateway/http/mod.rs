//! What `/mcp` does at the HTTP level, before (or instead of) MCP: bearer
//! auth and the tenant (`auth`), per-tenant limits (`quotas`), body and
//! request-id checks (`parse_guard`), refusals as JSON-RPC bodies
//! (`error_body`), quick legacy answers as JSON (`legacy_json`), the legacy
//! session `DELETE` answer (`session_delete`), graceful drain (`drain`),
//! metrics and `/metrics` (`metrics`), and which protocol generation a
//! request belongs to (`protocol_version`). None of these knows the MCP
//! handler; `server.rs` stacks them around rmcp's service.

pub mod auth;
pub mod drain;
pub mod error_body;
pub mod legacy_json;
pub mod metrics;
pub mod parse_guard;
pub mod protocol_version;
pub mod quotas;
pub mod session_delete;
