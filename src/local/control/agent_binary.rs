//! Which executable runs as each sandbox's agent (envd): the lean `sandbox-mcp-envd` built
//! beside `sandbox-mcp` (it holds only the agent's code, so each sandbox maps and keeps
//! resident far less of it), when it comes from the same sources; otherwise this binary itself,
//! which runs the same agent code as `sandbox-mcp envd`.

use std::path::{Path, PathBuf};

/// File name of the lean agent binary, looked for beside the running executable.
pub const LEAN_AGENT_NAME: &str = "sandbox-mcp-envd";
/// The running binary itself, the default agent.
pub const SELF_EXE: &str = "/proc/self/exe";
/// Hash of the sources this binary was built from (see `build.rs`).
pub const BUILD_ID: &str = env!("SANDBOX_MCP_BUILD_ID");

/// Resolves the configured agent: an explicit path is kept; the default (`/proc/self/exe`)
/// becomes the lean agent beside this executable when that answers `--build-id` with this
/// binary's own id.
pub fn choose(configured: &Path) -> PathBuf {
    if configured != Path::new(SELF_EXE) {
        return configured.to_path_buf();
    }
    let Some(lean) = std::env::current_exe().ok().and_then(|me| Some(me.parent()?.join(LEAN_AGENT_NAME))) else {
        return configured.to_path_buf();
    };
    if !lean.is_file() {
        return configured.to_path_buf();
    }
    match std::process::Command::new(&lean).arg("--build-id").stdin(std::process::Stdio::null()).output() {
        Ok(out) if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == BUILD_ID => lean,
        Ok(_) => {
            tracing::warn!(
                agent = %lean.display(),
                "the lean sandbox agent beside this binary comes from other sources (rebuild both with \
                 `cargo build --release`); sandboxes run this binary as their agent instead"
            );
            configured.to_path_buf()
        }
        Err(err) => {
            tracing::warn!(agent = %lean.display(), %err, "the lean sandbox agent cannot run; sandboxes run this binary as their agent instead");
            configured.to_path_buf()
        }
    }
}
