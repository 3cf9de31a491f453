//! Persistent per-sandbox records (`STATE/sandboxes/<id>/record.json`), the
//! spec handed to the in-sandbox agent, id and token generation, and process
//! identity checks (host pid + `/proc` start time).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngExt;
use serde::{Deserialize, Serialize};

use crate::e2b::wire::SandboxState;

/// File name of a sandbox's record inside its directory.
pub const RECORD_FILE: &str = "record.json";
/// File name of the spec envd reads at start.
pub const SPEC_FILE: &str = "spec.json";
/// File name of envd's Unix socket inside the sandbox directory.
pub const SOCKET_FILE: &str = "envd.sock";
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
}

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
    pub template_layers: Vec<super::template::Layer>,
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

/// A new sandbox id: 20 lowercase alphanumerics from a CSPRNG.
pub fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..20).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// A new agent tag (see [`AGENT_TAG_FILE`]): 32 hex characters, unrelated to the sandbox id.
pub fn new_agent_tag() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new envd access token: 40 hex characters from a CSPRNG.
pub fn new_access_token() -> String {
    let bytes: [u8; 20] = rand::rng().random();
    hex::encode(bytes)
}

/// True if `id` has the shape of a sandbox id (so it is safe as a path component).
pub fn is_valid_sandbox_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Start time of `pid` (clock ticks since boot), or None if it does not exist or is a zombie.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat).flatten()
}

/// What `/proc` says about a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running (or stopped) and still the process that had the recorded start time.
    Alive,
    /// Positive evidence that it is gone: no `/proc/<pid>`, a zombie, or the pid now belongs to
    /// another process (different start time).
    Gone,
    /// `/proc` could not be read (e.g. EMFILE under descriptor exhaustion): no conclusion.
    Unknown,
}

/// Whether `pid` is still the process that had `start_time`, distinguishing "gone" from "cannot tell".
pub fn process_liveness(pid: i32, start_time: u64) -> Liveness {
    if pid <= 0 {
        return Liveness::Gone;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match parse_start_time(&stat) {
            Some(Some(start)) if start == start_time => Liveness::Alive,
            Some(_) => Liveness::Gone,
            None => Liveness::Unknown,
        },
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => Liveness::Gone,
        Err(_) => Liveness::Unknown,
    }
}

/// Parses `/proc/<pid>/stat`: `Some(None)` for a zombie/dead process, `Some(Some(start))` for a
/// live one, `None` if the text is not a stat line.
fn parse_start_time(stat: &str) -> Option<Option<u64>> {
    // The command name may contain spaces and parentheses: parse after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3 (state); start time is field 22 → index 19.
    if matches!(fields.first().copied(), Some("Z") | Some("X")) {
        return Some(None);
    }
    Some(Some(fields.get(19)?.parse().ok()?))
}

/// True if `pid` is alive and still the process that had `start_time`.
pub fn process_is(pid: i32, start_time: u64) -> bool {
    pid > 0 && process_start_time(pid) == Some(start_time)
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
    fn ids_have_the_e2b_shape() {
        let a = new_sandbox_id();
        assert_eq!(a.len(), 20);
        assert!(is_valid_sandbox_id(&a));
        assert_ne!(a, new_sandbox_id());
        assert!(!is_valid_sandbox_id("../etc"));
        assert!(!is_valid_sandbox_id(""));
        assert_eq!(new_access_token().len(), 40);
    }

    #[test]
    fn own_process_identity() {
        let me = std::process::id() as i32;
        let start = process_start_time(me).unwrap();
        assert!(process_is(me, start));
        assert!(!process_is(me, start + 1));
        assert_eq!(process_liveness(me, start), Liveness::Alive);
        assert_eq!(process_liveness(me, start + 1), Liveness::Gone);
        assert_eq!(process_liveness(i32::MAX, start), Liveness::Gone);
    }

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
