//! What `start_task` sends into the sandbox: the validated task spec, its
//! base64 JSON encoding (written to the supervisor's stdin, never put in its
//! argv, which every user of the sandbox's host can read), and the supervisor
//! argv. Everything here is checked before any remote connection is made.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;

use super::id::TaskId;

/// Longest command accepted, in characters.
pub const MAX_COMMAND_CHARS: usize = 65_536;
/// Cap on the encoded launch (the supervisor argv and the spec line on its stdin).
pub const MAX_LAUNCH_BYTES: usize = 96 * 1024;
/// Task timeout bounds and default, in seconds.
pub const MIN_TASK_TIMEOUT: u64 = 1;
pub const MAX_TASK_TIMEOUT: u64 = 3600;
pub const DEFAULT_TASK_TIMEOUT: u64 = 300;
/// Longest working directory accepted.
const MAX_CWD_BYTES: usize = 4096;

/// Why a task cannot be launched as given. Each message is an instruction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("command must not be empty")]
    EmptyCommand,
    #[error("command is {0} characters long; the limit is 65,536 (write a script with write_file and run that)")]
    CommandTooLong(usize),
    #[error("command must not contain NUL characters")]
    NulInCommand,
    #[error("timeout must be between 1 and 3600 seconds (got {0})")]
    TimeoutOutOfRange(i64),
    #[error("cwd must be an absolute path without NUL characters, at most 4096 bytes")]
    BadCwd,
    #[error("environment variable name {0:?} is invalid: use letters, digits and '_' and do not start with a digit")]
    BadEnvName(String),
    #[error("environment variable {0} has a value containing a NUL character")]
    NulInEnvValue(String),
    #[error(
        "the encoded task launch is {0} bytes; the limit is 98,304 (shorten the command or envs, or put them in a file with write_file)"
    )]
    LaunchTooLarge(usize),
}

/// A task as the supervisor receives it (base64 JSON, one line on its stdin).
#[derive(Debug, Clone, Serialize)]
pub struct TaskSpec {
    pub command: String,
    pub cwd: Option<String>,
    pub envs: BTreeMap<String, String>,
    pub timeout: u64,
}

impl TaskSpec {
    /// Validates the caller's arguments (all but the encoded size).
    pub fn new(
        command: String,
        cwd: Option<String>,
        envs: BTreeMap<String, String>,
        timeout: Option<i64>,
    ) -> Result<Self, LaunchError> {
        let chars = command.chars().count();
        if chars > MAX_COMMAND_CHARS {
            return Err(LaunchError::CommandTooLong(chars));
        }
        if command.trim().is_empty() {
            return Err(LaunchError::EmptyCommand);
        }
        if command.contains('\0') {
            return Err(LaunchError::NulInCommand);
        }
        let raw = timeout.unwrap_or(DEFAULT_TASK_TIMEOUT as i64);
        let timeout = u64::try_from(raw)
            .ok()
            .filter(|t| (MIN_TASK_TIMEOUT..=MAX_TASK_TIMEOUT).contains(t))
            .ok_or(LaunchError::TimeoutOutOfRange(raw))?;
        if let Some(dir) = &cwd
            && (!dir.starts_with('/') || dir.contains('\0') || dir.len() > MAX_CWD_BYTES)
        {
            return Err(LaunchError::BadCwd);
        }
        for (name, value) in &envs {
            if !valid_env_name(name) {
                return Err(LaunchError::BadEnvName(name.clone()));
            }
            if value.contains('\0') {
                return Err(LaunchError::NulInEnvValue(name.clone()));
            }
        }
        Ok(Self { command, cwd, envs, timeout })
    }

    /// Standard base64 of the spec's JSON.
    pub fn encode(&self) -> String {
        // Serializing a struct of strings and a BTreeMap cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(json)
    }
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`, at most 256 bytes.
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphabetic() || b == b'_' => {}
        _ => return false,
    }
    name.len() <= 256 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The supervisor invocation for `start`: its arguments (nothing of the spec) and its stdin.
#[derive(Debug, Clone)]
pub struct StartLaunch {
    pub args: Vec<String>,
    /// The spec's base64 JSON and a newline.
    pub stdin: Vec<u8>,
}

/// The supervisor invocation for `start`, checked against the launch cap.
pub fn start_launch(task_id: &TaskId, spec: &TaskSpec) -> Result<StartLaunch, LaunchError> {
    let args = vec!["start".to_owned(), "--task-id".to_owned(), task_id.to_string()];
    let mut stdin = spec.encode().into_bytes();
    stdin.push(b'\n');
    // The arguments travel as a JSON array of strings, the spec line as bytes; base64 needs no
    // escaping, so this is the launch's size to within a few bytes of framing.
    let encoded = serde_json::to_vec(&args).map(|v| v.len()).unwrap_or(usize::MAX).saturating_add(stdin.len());
    if encoded > MAX_LAUNCH_BYTES {
        return Err(LaunchError::LaunchTooLarge(encoded));
    }
    Ok(StartLaunch { args, stdin })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str) -> Result<TaskSpec, LaunchError> {
        TaskSpec::new(command.to_owned(), None, BTreeMap::new(), None)
    }

    #[test]
    fn command_length_is_counted_in_characters() {
        assert!(spec(&"a".repeat(65_536)).is_ok());
        assert_eq!(spec(&"a".repeat(65_537)).unwrap_err(), LaunchError::CommandTooLong(65_537));
        assert!(spec(&"é".repeat(65_536)).is_ok());
    }

    #[test]
    fn max_ascii_command_fits_the_launch_cap_but_wide_characters_do_not() {
        let id = TaskId::generate();
        let ascii = spec(&"a".repeat(65_536)).unwrap();
        let launch = start_launch(&id, &ascii).unwrap();
        assert!(launch.args.iter().all(|a| !a.contains("aaaa")), "the spec is not in the argv");
        assert_eq!(launch.stdin.last(), Some(&b'\n'));
        assert_eq!(launch.stdin.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        let wide = spec(&"\u{1F600}".repeat(40_000)).unwrap();
        assert!(matches!(start_launch(&id, &wide), Err(LaunchError::LaunchTooLarge(_))));
    }

    #[test]
    fn arguments_are_validated() {
        assert_eq!(spec("  ").unwrap_err(), LaunchError::EmptyCommand);
        assert_eq!(spec("a\0b").unwrap_err(), LaunchError::NulInCommand);
        let t = |t| TaskSpec::new("x".into(), None, BTreeMap::new(), Some(t));
        assert_eq!(t(0).unwrap_err(), LaunchError::TimeoutOutOfRange(0));
        assert_eq!(t(3601).unwrap_err(), LaunchError::TimeoutOutOfRange(3601));
        assert_eq!(t(3600).unwrap().timeout, 3600);
        assert_eq!(t(-1).unwrap_err(), LaunchError::TimeoutOutOfRange(-1));
        assert_eq!(spec("x").unwrap().timeout, 300);
        let c = |c: &str| TaskSpec::new("x".into(), Some(c.into()), BTreeMap::new(), None);
        assert_eq!(c("relative").unwrap_err(), LaunchError::BadCwd);
        assert!(c("/tmp").is_ok());
        for bad in ["", "1A", "A-B", "A=B", "A B", "Ä"] {
            let envs = BTreeMap::from([(bad.to_owned(), "v".to_owned())]);
            let err = TaskSpec::new("x".into(), None, envs, None).unwrap_err();
            assert_eq!(err, LaunchError::BadEnvName(bad.to_owned()));
        }
        let envs = BTreeMap::from([("_OK_1".to_owned(), "a\0".to_owned())]);
        assert_eq!(
            TaskSpec::new("x".into(), None, envs, None).unwrap_err(),
            LaunchError::NulInEnvValue("_OK_1".into())
        );
    }

    #[test]
    fn spec_round_trips_through_base64_json() {
        let envs = BTreeMap::from([("API_TOKEN".to_owned(), "s3cr3t \"q\"".to_owned())]);
        let s = TaskSpec::new("echo 'hi'\nexit 3".into(), Some("/tmp".into()), envs, Some(7)).unwrap();
        let raw = base64::engine::general_purpose::STANDARD.decode(s.encode()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(v["command"], "echo 'hi'\nexit 3");
        assert_eq!(v["cwd"], "/tmp");
        assert_eq!(v["envs"]["API_TOKEN"], "s3cr3t \"q\"");
        assert_eq!(v["timeout"], 7);
    }
}
