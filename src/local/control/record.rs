//! Persistent per-sandbox records (`STATE/sandboxes/<id>/record.json`), written atomically and
//! read back after a provider restart, the names of the files in a sandbox's directory that only
//! the provider uses, and the clock records are stamped with. What the agent reads is
//! `isolation::spec`; ids and tokens are `ids`; whether a recorded process is still alive is
//! `identity`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::e2b::wire::SandboxState;

/// File name of a sandbox's record inside its directory.
pub const RECORD_FILE: &str = "record.json";
/// File name of envd's own log (its stdout/stderr).
pub const LOG_FILE: &str = "envd.log";
/// File name of the sandbox's agent tag: the random name its agent carries in its argv (see
/// `agent_process`), written before the agent starts.
pub const AGENT_TAG_FILE: &str = "agent.tag";

/// What the provider remembers about one sandbox; survives provider restarts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub template: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub env_vars: HashMap<String, String>,
    pub allow_internet_access: bool,
    /// Egress rules and inbound access, as given at create or by the last network update.
    #[serde(default)]
    pub network: crate::local::net::policy::NetworkConfig,
    /// Required on inbound requests when the sandbox is not public (`allowPublicTraffic: false`).
    #[serde(default)]
    pub traffic_access_token: Option<String>,
    /// Unix time in milliseconds.
    pub started_at_ms: i64,
    /// Deadline, Unix time in milliseconds.
    pub end_at_ms: i64,
    pub state: SandboxState,
    /// envd's pid in the host's PID namespace.
    pub envd_pid: i32,
    /// envd's start time (field 22 of `/proc/<pid>/stat`), to tell it from a recycled pid.
    pub envd_start_time: u64,
    pub envd_access_token: String,
    /// Cgroup directories created for this sandbox (removed on kill).
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
    /// How the sandbox is paused: `freezer` (cgroup) or `sigstop`.
    #[serde(default)]
    pub pause_method: Option<String>,
    /// The id of the template build this sandbox runs a step of, set by the build alone (see
    /// `sandbox_table::is_build_step`); nothing a client sends at create reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_step_of: Option<String>,
    /// What the sandbox's root is made of (to snapshot it); `None` for a build step's sandbox
    /// and for sandboxes created before snapshots existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<crate::local::store::Lineage>,
    /// The process configuration of its template (environment, user, start and ready commands),
    /// which a snapshot of it keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_config: Option<crate::local::store::RunConfig>,
    /// The descriptor at which its agent keeps the sandbox's data directory (from its readiness
    /// line), which a provider that restarted takes to snapshot the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_data_fd: Option<i32>,
    /// What happens at the deadline, and whether a request resumes it when paused.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// Paused by its deadline (`lifecycle.on_timeout_pause`): `end_at_ms` is then the end of its
    /// retention, after which it is removed.
    #[serde(default)]
    pub timed_out: bool,
}

/// E2B's `lifecycle` of a sandbox, as given at create.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lifecycle {
    /// `onTimeout: pause` (`autoPause`): paused at the deadline instead of killed.
    pub on_timeout_pause: bool,
    /// `autoResume`: a request to the agent of the paused sandbox resumes it.
    pub auto_resume: bool,
    /// `autoPauseMemory: false` (a filesystem-only pause) was asked for; the local provider
    /// freezes in both modes (see `docs/snapshots.md`).
    pub filesystem_pause: bool,
}

/// Errors of record I/O.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid record: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
}

/// Writes `value` as JSON to `path` atomically (temp file, rename): a reader (the agent, a restarted
/// provider) sees the old content or the new one, never a mix. Deliberately no `fsync`: these files
/// describe live sandboxes, which a provider crash leaves running with the page cache intact, and
/// which a machine crash ends anyway (a record torn by one is treated as "died mid-create" and
/// cleaned up); syncing cost every create a journal commit (milliseconds to tens of them on a busy
/// disk) and bought nothing.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let err = |source| RecordError::Write { path: path.to_owned(), source };
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| err(std::io::Error::other(e)))?;
    let tmp = path.with_extension("json.tmp");
    {
        // Records hold access tokens and env vars: owner-only.
        let mut file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().write(true).create(true).truncate(true),
            0o600,
        )
        .open(&tmp)
        .map_err(err)?;
        file.write_all(&bytes).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}

/// Reads a JSON file written by [`write_json_atomic`].
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, RecordError> {
    let bytes = std::fs::read(path).map_err(|source| RecordError::Read { path: path.to_owned(), source })?;
    serde_json::from_slice(&bytes).map_err(|source| RecordError::Parse { path: path.to_owned(), source })
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// RFC 3339 rendering of a Unix time in milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_json_atomic(&path, &serde_json::json!({"a": 1})).unwrap();
        let back: serde_json::Value = read_json(&path).unwrap();
        assert_eq!(back["a"], 1);
        assert!(!dir.path().join("x.json.tmp").exists());
    }
}
