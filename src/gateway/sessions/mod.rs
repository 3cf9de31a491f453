//! Legacy MCP sessions (protocol versions up to 2025-11-25, with
//! `Mcp-Session-Id`): the registry of each session's state and the
//! session-manager wrapper that learns when a session ends (`registry`), and
//! the Redis store that lets any replica serve any session (`redis_store`,
//! its SSE event log in `event_log`, both on the connections of
//! `redis_pool`). What happens when a session ends needs the provider and
//! lives with the shared state (`state::session_end`, `state::shared_sessions`).

pub mod event_log;
pub mod redis_pool;
pub mod redis_store;
pub mod registry;

pub use registry::{EndReason, SessionEndHook, SessionError, SessionRegistry, SessionState, TrackingSessionManager};
