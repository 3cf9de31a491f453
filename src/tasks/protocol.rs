//! The supervisor's command-line protocol as seen from the gateway: the JSON
//! object each invocation prints, its refusals, and how a missing script
//! shows up.

use serde::{Deserialize, Serialize};

/// State of a task, as recorded in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    /// No confirmed record, or running while its supervisor is gone. Also any
    /// state this gateway does not know: never claim an outcome not recorded.
    #[serde(other)]
    Unknown,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled | Self::TimedOut)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::TimedOut => "timed_out",
            Self::Unknown => "unknown",
        }
    }
}

/// The status object printed by `start`, `status` and `cancel`.
#[derive(Debug, Clone, Deserialize)]
pub struct SupervisorStatus {
    pub task_id: String,
    pub state: TaskState,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub signal: Option<i64>,
    #[serde(default)]
    pub started_at: Option<f64>,
    #[serde(default)]
    pub finished_at: Option<f64>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub stdout_b64: String,
    #[serde(default)]
    pub stderr_b64: String,
    #[serde(default)]
    pub stdout_size: u64,
    #[serde(default)]
    pub stderr_size: u64,
    #[serde(default)]
    pub stdout_total_bytes: Option<u64>,
    #[serde(default)]
    pub stderr_total_bytes: Option<u64>,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    #[serde(default)]
    pub cancel_confirmed: Option<bool>,
}

/// One entry of `list`.
#[derive(Debug, Clone, Deserialize)]
pub struct ListedTask {
    pub task_id: String,
    pub state: TaskState,
    #[serde(default)]
    pub started_at: Option<f64>,
    #[serde(default)]
    pub finished_at: Option<f64>,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub command_first_line: Option<String>,
    /// Why the state is what it is, when the supervisor says (as in the status object).
    #[serde(default)]
    pub error: Option<String>,
}

/// Output of `list`.
#[derive(Debug, Clone, Deserialize)]
pub struct TaskList {
    pub tasks: Vec<ListedTask>,
}

/// Output of `version`.
#[derive(Debug, Clone, Deserialize)]
pub struct VersionReply {
    pub version: String,
}

/// A refusal printed as `{"error", "code"}` (exit status 2).
#[derive(Debug, Clone, Deserialize)]
pub struct Refusal {
    pub error: String,
    #[serde(default)]
    pub code: RefusalCode,
}

/// The `code` of a supervisor refusal (`CliError` codes in `supervisor.py`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum RefusalCode {
    /// Bad arguments or task spec, or a cwd that is not a directory: nothing was started.
    Invalid,
    /// The task id is taken: nothing was started.
    Exists,
    /// The sandbox holds the maximum number of task directories: nothing was started.
    Limit,
    /// No such task in this sandbox.
    NotFound,
    /// The supervisor could not use its files.
    Io,
    /// An unexpected exception in the supervisor.
    Internal,
    /// A code this gateway does not know (a newer supervisor), or none.
    Other(String),
}

impl From<String> for RefusalCode {
    fn from(code: String) -> Self {
        match code.as_str() {
            "invalid" => Self::Invalid,
            "exists" => Self::Exists,
            "limit" => Self::Limit,
            "not_found" => Self::NotFound,
            "io" => Self::Io,
            "internal" => Self::Internal,
            _ => Self::Other(code),
        }
    }
}

impl Default for RefusalCode {
    fn default() -> Self {
        Self::Other(String::new())
    }
}

impl RefusalCode {
    /// Whether the refusal says for certain that nothing was started (a launch refused outright).
    pub fn nothing_started(&self) -> bool {
        matches!(self, Self::Invalid | Self::Limit)
    }
}

/// What one supervisor invocation printed.
#[derive(Debug)]
pub enum Reply {
    /// The object on success.
    Ok(serde_json::Map<String, serde_json::Value>),
    /// `{"error", "code"}`.
    Refused(Refusal),
    /// python3 could not open or import the script (it is not installed).
    ScriptMissing,
    /// Anything else: no JSON object, python3 missing, a crash.
    Garbled(String),
}

/// Interprets a supervisor run's exit code and output.
pub fn parse_reply(exit_code: i32, stdout: &[u8], stderr: &[u8]) -> Reply {
    let last_line = stdout.split(|b| *b == b'\n').rev().find(|l| !l.iter().all(u8::is_ascii_whitespace));
    if let Some(line) = last_line
        && let Ok(serde_json::Value::Object(obj)) = serde_json::from_slice::<serde_json::Value>(line)
    {
        if obj.contains_key("error")
            && obj.contains_key("code")
            && !obj.contains_key("state")
            && let Ok(refusal) = serde_json::from_value::<Refusal>(serde_json::Value::Object(obj.clone()))
        {
            return Reply::Refused(refusal);
        }
        if exit_code == 0 {
            return Reply::Ok(obj);
        }
    }
    let err_text = String::from_utf8_lossy(stderr);
    let script_missing = (exit_code == 2 && err_text.contains("can't open file"))
        || (exit_code == 1 && err_text.contains("ModuleNotFoundError: No module named 'supervisor'"));
    if script_missing {
        return Reply::ScriptMissing;
    }
    let mut detail: String = err_text.trim().chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
    if detail.is_empty() {
        detail = String::from_utf8_lossy(stdout).trim().chars().take(300).collect();
    }
    Reply::Garbled(format!("the task supervisor exited with code {exit_code}: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_classified() {
        let ok = br#"{"task_id":"x","state":"running"}
"#;
        assert!(matches!(parse_reply(0, ok, b""), Reply::Ok(_)));
        let refused = br#"{"error":"task exists","code":"exists"}"#;
        match parse_reply(2, refused, b"") {
            Reply::Refused(r) => assert_eq!(r.code, RefusalCode::Exists),
            other => panic!("{other:?}"),
        }
        let missing = b"python3: can't open file '/home/user/.sandbox-mcp/supervisor.py': [Errno 2] No such file";
        assert!(matches!(parse_reply(2, b"", missing), Reply::ScriptMissing));
        let missing = b"Traceback (most recent call last):\n  File \"<string>\", line 1\nModuleNotFoundError: No module named 'supervisor'\n";
        assert!(matches!(parse_reply(1, b"", missing), Reply::ScriptMissing));
        assert!(matches!(parse_reply(1, b"", b"Traceback ... boom"), Reply::Garbled(m) if m.contains("boom")));
        assert!(matches!(parse_reply(0, b"not json", b""), Reply::Garbled(_)));
    }

    #[test]
    fn refusal_codes_are_typed_with_a_catch_all() {
        let code = |json: &str| serde_json::from_str::<Refusal>(json).unwrap().code;
        assert_eq!(code(r#"{"error":"x","code":"not_found"}"#), RefusalCode::NotFound);
        assert_eq!(code(r#"{"error":"x","code":"limit"}"#), RefusalCode::Limit);
        assert_eq!(code(r#"{"error":"x","code":"exploded"}"#), RefusalCode::Other("exploded".into()));
        assert_eq!(code(r#"{"error":"x"}"#), RefusalCode::Other(String::new()));
        // Every code the embedded supervisor can print is a known one.
        let source = crate::tasks::SUPERVISOR_SOURCE;
        let mut seen = 0;
        for part in source.split("CliError(\"").skip(1).chain(source.split("\"code\": \"").skip(1)) {
            let name: String = part.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if name.is_empty() {
                continue;
            }
            seen += 1;
            assert!(!matches!(RefusalCode::from(name.clone()), RefusalCode::Other(_)), "unknown code {name:?}");
        }
        assert!(seen >= 6, "found {seen} codes in supervisor.py");
    }

    #[test]
    fn unknown_states_read_as_unknown() {
        let s: SupervisorStatus = serde_json::from_str(r#"{"task_id":"x","state":"exploded"}"#).unwrap();
        assert_eq!(s.state, TaskState::Unknown);
        let s: SupervisorStatus = serde_json::from_str(r#"{"task_id":"x","state":"timed_out"}"#).unwrap();
        assert!(s.state.is_terminal());
    }
}
