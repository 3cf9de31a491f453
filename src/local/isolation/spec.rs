//! What the provider hands the in-sandbox agent: the spec (`spec.json` in the sandbox's
//! directory, written before the agent starts and read by it before it builds the sandbox), the
//! name of the agent's Unix socket there, and the descriptor at which the agent keeps its data
//! directory, which both sides use.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// File name of the spec envd reads at start.
pub const SPEC_FILE: &str = "spec.json";
/// The lowest descriptor number at which an agent keeps its sandbox's data directory (the disk
/// that holds its overlay upper layer and private directories) open, for the provider to take with
/// `pidfd_getfd(2)` when it no longer has its own handle on it (after a restart). Lower when the
/// descriptor limit is lower; the number taken is on the agent's readiness line ([`ready_line`]).
pub const AGENT_DATA_FD: i32 = 880;

/// What a ready agent writes on its readiness pipe: `ok`, and the number of its data directory
/// descriptor when it keeps one. Anything else is its set-up error.
pub fn ready_line(data_fd: Option<i32>) -> String {
    match data_fd {
        Some(fd) => format!("ok {fd}\n"),
        None => "ok\n".to_owned(),
    }
}

/// Reads a readiness line ([`ready_line`]): `Some(data descriptor)` when the agent is ready (the
/// inner `None` when it keeps none), `None` when the text is not a readiness line.
pub fn parse_ready_line(text: &str) -> Option<Option<i32>> {
    match text.trim().strip_prefix("ok")? {
        "" => Some(None),
        rest => rest.strip_prefix(' ').and_then(|n| n.parse().ok()).map(Some),
    }
}
/// File name of envd's Unix socket inside the sandbox directory.
pub const SOCKET_FILE: &str = "envd.sock";

/// What envd needs to build the sandbox (written by the provider before spawning).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub sandbox_id: String,
    /// Root directory of the template (lower layer of the overlay).
    pub template_root: PathBuf,
    /// The provider's state directory, hidden inside the sandbox.
    pub state_dir: PathBuf,
    #[serde(default)]
    pub env_vars: HashMap<String, String>,
    /// Whether the sandbox was created with internet access (egress is enforced by the provider;
    /// kept for the record).
    pub allow_internet_access: bool,
    pub user_uid: u32,
    pub user_gid: u32,
    /// Extra copy-on-write layers mounted inside the root (the host's `/usr` for `base`).
    #[serde(default)]
    pub template_layers: Vec<crate::local::template::Layer>,
    /// Read-only layers stacked above `template_root`, bottom first (a stored template's
    /// layers after its first); empty for `base` and directory templates.
    #[serde(default)]
    pub template_lowers: Vec<PathBuf>,
    /// Host id range that root and every user inside map to (the sandbox's user namespace).
    #[serde(default)]
    pub id_map: super::userns::IdMap,
    /// The sandbox's disk image (`disk_limit_mb`), mounted at `DIR/disk`; all its writes go there.
    #[serde(default)]
    pub disk_image: Option<PathBuf>,
    /// A stored template's sandbox: `/home` and `/root` come from the template's layers (the
    /// overlay) instead of private empty binds; `/tmp` stays private. False (the default, and
    /// what specs written before it mean) for `base` and directory templates.
    #[serde(default)]
    pub home_from_template: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_line_carries_the_data_descriptor_and_nothing_else_reads_as_ready() {
        assert_eq!(parse_ready_line(&ready_line(Some(512))), Some(Some(512)));
        assert_eq!(parse_ready_line(&ready_line(None)), Some(None));
        for error in ["", "okay", "ok x", "ok 12 more", "mount failed: ok", "ok\tbad"] {
            assert_eq!(parse_ready_line(error), None, "{error:?}");
        }
    }
}
