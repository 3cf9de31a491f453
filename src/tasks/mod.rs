//! Host side of reconnectable tasks (`docs/architecture.md#reconnectable-tasks`): task ids, launch
//! encoding and validation, the supervisor's CLI protocol, get_task's direct
//! read path, the per-sandbox channel for starts, paging with the gateway's own secret masking, and
//! [`service::TaskService`], which runs the supervisor inside a sandbox
//! through any [`transport::SupervisorTransport`] and installs it on first use.

pub mod channel;
pub mod direct;
pub mod fast;
pub mod id;
pub mod launch;
pub mod page;
pub mod protocol;
pub mod service;
pub mod transport;
pub mod view;

#[cfg(test)]
mod channel_tests;
#[cfg(test)]
mod fast_tests;
#[cfg(test)]
mod local_tests;

use std::sync::atomic::AtomicU64;

/// The supervisor script shipped inside the binary.
pub const SUPERVISOR_SOURCE: &str = include_str!("../../supervisor/supervisor.py");
/// Where the supervisor lives in a sandbox (the sandbox user's private dir;
/// its tasks are in `tasks/` beside it).
pub const SUPERVISOR_PATH: &str = "/home/user/.sandbox-mcp/supervisor.py";

/// Number of supervisor installs into sandboxes since start (metrics read it).
pub static SUPERVISOR_INSTALLS: AtomicU64 = AtomicU64::new(0);

/// `SUPERVISOR_VERSION` as written in the embedded script.
pub fn supervisor_version() -> &'static str {
    SUPERVISOR_SOURCE
        .lines()
        .find_map(|l| l.strip_prefix("SUPERVISOR_VERSION = "))
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''))
        .unwrap_or("")
}

pub use id::TaskId;
pub use protocol::TaskState;

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_supervisor_declares_its_version() {
        assert!(!super::supervisor_version().is_empty());
    }
}
