//! Wire types of the E2B-compatible API, shared by the provider client
//! (`e2b`) and the embedded local provider (`local`): control-plane JSON
//! (camelCase, `templateID`-style names) and the envd Connect JSON messages
//! (proto3 canonical JSON: lowerCamelCase, int64 as strings, bytes as base64,
//! defaults omitted). Decoders are lenient the way the SDK's are: snake_case
//! aliases, numbers or strings for int64, unknown fields ignored.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// envd version we advertise (`docs/provider-contract.md#versions-advertised`: unlocks every SDK feature).
pub const ENVD_VERSION: &str = "0.6.13";
/// Port the SDK puts in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;
/// Header that routes a request to a sandbox's envd.
pub const HEADER_SANDBOX_ID: &str = "e2b-sandbox-id";
/// Header carrying the envd port.
pub const HEADER_SANDBOX_PORT: &str = "e2b-sandbox-port";
/// Header carrying the per-sandbox envd access token.
pub const HEADER_ACCESS_TOKEN: &str = "x-access-token";
/// Header carrying a sandbox's traffic access token on requests to its ports (when not public).
pub const HEADER_TRAFFIC_ACCESS_TOKEN: &str = "e2b-traffic-access-token";
/// Header carrying the control-plane API key.
pub const HEADER_API_KEY: &str = "x-api-key";

// ---------------------------------------------------------------- control plane

/// Body of `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID", alias = "templateId", alias = "template_id")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// `lifecycle.on_timeout = "pause"`: the sandbox is paused at its deadline instead of killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// The kind of that pause: `false` is a filesystem-only pause (`mode: "filesystem"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    /// `lifecycle.auto_resume`: a request to a paused sandbox's agent resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HashMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<HashMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
}

/// `autoResume` of a create request (E2B's `SandboxAutoResumeConfig`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

/// `lifecycle` of a sandbox's info (E2B's `SandboxLifecycle`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: String,
}

/// `network` of a create request (E2B's `SandboxNetworkConfig`). Fields the local provider does not
/// implement are kept as raw JSON so it can refuse them by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNetwork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// Accepted for SDK compatibility; resolvers are the provider's (see the README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_ports: Option<serde_json::Value>,
}

impl SandboxNetwork {
    /// The set fields a provider without an egress HTTP proxy cannot honour.
    pub fn unsupported_fields(&self) -> Vec<&'static str> {
        let set = |v: &Option<serde_json::Value>| {
            v.as_ref().is_some_and(|v| {
                !(v.is_null()
                    || v.as_array().is_some_and(|a| a.is_empty())
                    || v.as_object().is_some_and(|o| o.is_empty())
                    || v.as_str().is_some_and(str::is_empty))
            })
        };
        let mut fields = Vec::new();
        for (name, value) in [
            ("maskRequestHost", &self.mask_request_host),
            ("egressProxy", &self.egress_proxy),
            ("rules", &self.rules),
            ("httpsPorts", &self.https_ports),
        ] {
            if set(value) {
                fields.push(name);
            }
        }
        fields
    }
}

/// Body of `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`): replaces the egress
/// rules; a field left out is cleared.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NetworkUpdate {
    #[serde(default, rename = "allowOut", skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, rename = "denyOut", skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "allowInternetAccess")]
    pub allow_internet_access: Option<bool>,
    #[serde(default, rename = "dnsServers", skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(default, rename = "egressProxy", skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
}

/// Response of create / connect.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub traffic_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }
}

/// Response of `GET /sandboxes/{id}`, and (a superset of) the items of `GET /v2/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339: the deadline.
    pub end_at: String,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
}

/// An item of `GET /templates` (E2B's `Template`), plus what the local provider adds: `kind`,
/// `sizeBytes` and `python3` (the version a sandbox of it runs as `python3`). E2B sends none of
/// them: there, nothing is known of python3. Every field defaults, so any provider's answer reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    /// Deprecated by E2B in favour of `names`; both are sent.
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
    pub created_by: Option<serde_json::Value>,
    pub last_spawned_at: Option<String>,
    pub spawn_count: u64,
    pub build_count: u64,
    pub envd_version: String,
    /// building | waiting | ready | error
    pub build_status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Local provider: `"3.11"`, or `"3"` (present, version not told by its file names); absent
    /// (with `kind` set): the template has no python3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python3: Option<String>,
    /// Local provider: `base`, `directory` or `stored`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Body of `POST /v2/sandboxes/{id}/connect` (and the v1 path).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConnectSandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// Body of `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetTimeout {
    pub timeout: u64,
}

/// Control-plane error body: both members are required by the SDK.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: i32,
    pub message: String,
}

/// Query of `GET /v2/sandboxes` (the client builds it; the provider parses it).
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `key=value` pairs that must all match.
    pub metadata: Vec<(String, String)>,
    /// States to include; empty = running and paused.
    pub states: Vec<SandboxState>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

/// Header that tells the client there is another page.
pub const HEADER_NEXT_TOKEN: &str = "x-next-token";

// ---------------------------------------------------------------- envd: process

/// `process.ProcessConfig`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub envs: HashMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.StartRequest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StartRequest {
    pub process: ProcessConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Absent means true (old clients); the SDK always sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

impl StartRequest {
    /// `command` run by a login shell (`/bin/bash -l -c`), without stdin (as `run_command` runs it).
    pub fn login_shell(command: impl Into<String>) -> Self {
        Self {
            process: ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), command.into()],
                ..Default::default()
            },
            stdin: Some(false),
            ..Default::default()
        }
    }
}

/// `process.ProcessSelector` (oneof pid | tag).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl ProcessSelector {
    pub fn pid(pid: u32) -> Self {
        Self { pid: Some(pid), tag: None }
    }
}

/// `process.ConnectRequest`, `CloseStdinRequest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessRequest {
    pub process: ProcessSelector,
}

/// `process.SendSignalRequest`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    /// `SIGNAL_SIGKILL` / `SIGNAL_SIGTERM` (numbers accepted too).
    pub signal: serde_json::Value,
}

/// `process.ProcessInput` (oneof stdin | pty), bytes as base64.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessInput {
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_b64")]
    pub stdin: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_b64")]
    pub pty: Option<Vec<u8>>,
}

/// `process.SendInputRequest`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

/// `process.ProcessInfo`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListProcessesResponse {
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

/// Empty message (`{}`), for unary responses without fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Empty {}

/// `StartResponse` / `ConnectResponse`: `{"event": {...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessEventMessage {
    pub event: ProcessEvent,
}

/// `process.ProcessEvent` (oneof).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start(StartEvent),
    Data(DataEvent),
    End(EndEvent),
    Keepalive(Empty2),
}

/// `{}` that compares equal (keepalive payload).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty2 {}

/// `ProcessEvent.StartEvent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartEvent {
    pub pid: u32,
}

/// `ProcessEvent.DataEvent` (oneof stdout | stderr | pty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataEvent {
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_b64")]
    pub stdout: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_b64")]
    pub stderr: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_b64")]
    pub pty: Option<Vec<u8>>,
}

/// `ProcessEvent.EndEvent` (proto3 JSON: zero / false omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    #[serde(default, skip_serializing_if = "is_zero_i32", alias = "exit_code")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub exited: bool,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// ---------------------------------------------------------------- envd: filesystem

/// `filesystem.FileType` names.
pub const FILE_TYPE_FILE: &str = "FILE_TYPE_FILE";
pub const FILE_TYPE_DIRECTORY: &str = "FILE_TYPE_DIRECTORY";
pub const FILE_TYPE_SYMLINK: &str = "FILE_TYPE_SYMLINK";
pub const FILE_TYPE_UNSPECIFIED: &str = "FILE_TYPE_UNSPECIFIED";

/// `filesystem.EntryInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    /// `FILE_TYPE_*` name.
    #[serde(rename = "type")]
    pub file_type: String,
    pub path: String,
    #[serde(default, with = "int64", skip_serializing_if = "is_zero_i64")]
    pub size: i64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub mode: u32,
    #[serde(default)]
    pub permissions: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub group: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "modified_time")]
    pub modified_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "symlink_target")]
    pub symlink_target: Option<String>,
    #[serde(default, skip_serializing_if = "is_false", alias = "is_symlink")]
    pub is_symlink: bool,
    /// User metadata (`X-Metadata-*` upload headers, kept as `user.e2b.*` extended attributes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PathRequest {
    pub path: String,
}

/// `ListDirRequest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListDirRequest {
    pub path: String,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub depth: u32,
}

/// `MoveRequest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

/// `StatResponse`, `MakeDirResponse`, `MoveResponse`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

/// `ListDirResponse`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListDirResponse {
    #[serde(default)]
    pub entries: Vec<EntryInfo>,
}

/// One item of the `POST /files` response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadedEntry {
    pub path: String,
    pub name: String,
    #[serde(rename = "type")]
    pub entry_type: String,
    /// The metadata stored with the upload, when the request carried some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// envd plain-HTTP error body: `{"code": <http status>, "message": "..."}`.
pub type EnvdHttpError = ErrorBody;

// ---------------------------------------------------------------- serde helpers

fn is_false(v: &bool) -> bool {
    !*v
}
fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// proto3 JSON int64: written as a string, read from a string or a number.
pub mod int64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Num(i64),
            Str(String),
        }
        match Either::deserialize(d)? {
            Either::Num(n) => Ok(n),
            Either::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// proto3 JSON `bytes` in an optional oneof member: standard base64 (URL-safe accepted).
pub mod opt_b64 {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => s.serialize_str(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        STANDARD
            .decode(&text)
            .or_else(|_| URL_SAFE.decode(&text))
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text.trim_end_matches('=')))
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// Maps a `Signal` enum value (name or number) to a POSIX signal number.
pub fn signal_number(value: &serde_json::Value) -> Option<i32> {
    match value {
        serde_json::Value::String(name) => match name.as_str() {
            "SIGNAL_SIGKILL" => Some(9),
            "SIGNAL_SIGTERM" => Some(15),
            _ => None,
        },
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(9) => Some(9),
            Some(15) => Some(15),
            _ => None,
        },
        _ => None,
    }
}

// ---------------------------------------------------------------- control plane: snapshots and forks

/// Most forks one `POST /sandboxes/{id}/fork` makes (the official SDKs' own limit on `count`).
pub const MAX_FORK_COUNT: u32 = 20;
/// Metadata key the provider sets on a fork: the id of the sandbox it was forked from.
pub const META_FORK_PARENT: &str = "fork.parent";
/// Metadata key the provider sets on a fork: a sentence saying what a fork does not carry.
pub const META_FORK_CARRIES: &str = "fork.carries";

/// Body of `POST /sandboxes/{id}/snapshots` (E2B's). `memory: false` asks for a filesystem
/// snapshot; a full memory snapshot may be refused (the local provider answers 400).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NewSnapshot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// Answer of `POST /sandboxes/{id}/snapshots` (201) and an item of `GET /snapshots`. The
/// `snapshotID` (`NAME:default` for a named one) is opaque: it is what a create passes as
/// `templateID`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID", alias = "snapshotId", alias = "snapshot_id")]
    pub snapshot_id: String,
    #[serde(default)]
    pub names: Vec<String>,
}

/// Query of `GET /snapshots` (the client builds it); more pages while `X-Next-Token` is answered.
#[derive(Debug, Clone, Default)]
pub struct SnapshotQuery {
    /// Only the snapshots taken of this sandbox.
    pub sandbox_id: Option<String>,
    /// Only the snapshots with this name or id.
    pub name: Option<String>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

/// Body of `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ForkSandbox {
    /// Lifetime of each fork, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// Forks to make (1-20; the provider's default is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// One entry of the answer of `POST /sandboxes/{id}/fork` (201, one per fork, each independent):
/// `{"sandbox": <Sandbox as create returns>}` or `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ForkEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_events_use_proto3_json() {
        let start = ProcessEventMessage { event: ProcessEvent::Start(StartEvent { pid: 42 }) };
        assert_eq!(serde_json::to_string(&start).unwrap(), r#"{"event":{"start":{"pid":42}}}"#);
        let data = ProcessEventMessage {
            event: ProcessEvent::Data(DataEvent { stdout: Some(b"hi\n".to_vec()), ..Default::default() }),
        };
        assert_eq!(serde_json::to_string(&data).unwrap(), r#"{"event":{"data":{"stdout":"aGkK"}}}"#);
        let end = ProcessEventMessage {
            event: ProcessEvent::End(EndEvent { exited: true, status: "exit status 0".into(), ..Default::default() }),
        };
        assert_eq!(
            serde_json::to_string(&end).unwrap(),
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
        );
        let ka: ProcessEventMessage = serde_json::from_str(r#"{"event":{"keepalive":{}}}"#).unwrap();
        assert_eq!(ka.event, ProcessEvent::Keepalive(Empty2 {}));
        let end: ProcessEventMessage = serde_json::from_str(
            r#"{"event":{"end":{"exit_code":3,"status":"exit status 3","error":"exit status 3"}}}"#,
        )
        .unwrap();
        assert!(matches!(end.event, ProcessEvent::End(EndEvent { exit_code: 3, .. })));
    }

    #[test]
    fn entry_info_int64_as_string_and_number() {
        let e: EntryInfo =
            serde_json::from_str(r#"{"name":"a","type":"FILE_TYPE_FILE","path":"/a","size":"5"}"#).unwrap();
        assert_eq!(e.size, 5);
        let e2: EntryInfo =
            serde_json::from_str(r#"{"name":"a","type":"FILE_TYPE_FILE","path":"/a","size":5}"#).unwrap();
        assert_eq!(e2.size, 5);
        assert!(serde_json::to_string(&e).unwrap().contains(r#""size":"5""#));
    }

    #[test]
    fn sandbox_uses_e2b_names() {
        let s = Sandbox {
            template_id: "base".into(),
            sandbox_id: "abc".into(),
            client_id: "local".into(),
            envd_version: ENVD_VERSION.into(),
            ..Default::default()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["templateID"], "base");
        assert_eq!(v["sandboxID"], "abc");
        assert_eq!(v["envdVersion"], ENVD_VERSION);
        let n: NewSandbox = serde_json::from_str(
            r#"{"templateID":"base","timeout":5,"envVars":{"A":"1"},"allow_internet_access":false}"#,
        )
        .unwrap();
        assert_eq!(n.allow_internet_access, Some(false));
        assert_eq!(n.env_vars.unwrap()["A"], "1");
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number(&serde_json::json!("SIGNAL_SIGKILL")), Some(9));
        assert_eq!(signal_number(&serde_json::json!(15)), Some(15));
        assert_eq!(signal_number(&serde_json::json!("SIGNAL_SIGHUP")), None);
    }
}
