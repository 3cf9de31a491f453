//! get_task's direct read path: a task's `status.json` and output pages read
//! straight from its files through the sandbox's files API (ranged reads),
//! without starting python3 in the sandbox. The supervisor's `unknown` rule
//! (a status that says running while its supervisor process is gone) is
//! applied here from `/proc/PID/stat`, exactly as `load_task` in
//! `supervisor.py` applies it, but only to a record without an `origin`: a
//! record that carries its sandbox's identity (supervisor ≥ 6) and whose
//! daemon is not confirmed alive may be a copy from another sandbox (a
//! snapshot or fork), which only the supervisor can tell, since only it reads
//! the sandbox's identity. Anything this path does not fully understand
//! (no status.json yet, an unfamiliar record, a failed read) is left to the
//! supervisor itself, which stays the authority for every other case.

use serde_json::{Map, Value};

use super::protocol::{SupervisorStatus, TaskState};
use crate::procfs::ProcStat;

/// Largest status.json read directly (a 64 Ki-character command escapes to
/// at most about 800 KiB of JSON); larger ones are left to the supervisor.
pub const MAX_STATUS_BYTES: u64 = 1 << 20;

/// The supervisor's message for a running status whose supervisor is gone
/// (same text as `load_task` in `supervisor.py`).
pub const SUPERVISOR_GONE: &str = "the task's supervisor process is gone; the task's outcome was not recorded (the sandbox may have been restarted, or the supervisor was killed)";

/// A parsed `status.json` the direct path can serve.
#[derive(Debug, Clone)]
pub struct StatusRecord {
    fields: Map<String, Value>,
    pub state: TaskState,
}

impl StatusRecord {
    /// Parses `status.json` of task `task_id`. `None` when the record is not
    /// one this gateway can interpret on its own (the supervisor decides then).
    pub fn parse(raw: &[u8], task_id: &str) -> Option<Self> {
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(raw) else { return None };
        if fields.get("task_id").and_then(Value::as_str) != Some(task_id) {
            return None;
        }
        // The states the daemon records (any other string reads as Unknown: declined).
        let state =
            fields.get("state").filter(|v| v.is_string()).cloned().map(serde_json::from_value::<TaskState>)?.ok()?;
        if state == TaskState::Unknown {
            return None;
        }
        let record = Self { fields, state };
        if state == TaskState::Running && record.supervisor().is_none() {
            return None;
        }
        Some(record)
    }

    /// `(supervisor_pid, supervisor_start_time)` as recorded.
    pub fn supervisor(&self) -> Option<(u32, u64)> {
        let pid = self.fields.get("supervisor_pid")?.as_u64().and_then(|p| u32::try_from(p).ok())?;
        let start = self.fields.get("supervisor_start_time")?.as_u64()?;
        (pid > 0).then_some((pid, start))
    }

    /// The task id the record names (checked equal to the caller's by [`Self::parse`]).
    pub fn task_id(&self) -> &str {
        self.fields.get("task_id").and_then(Value::as_str).unwrap_or("")
    }

    /// Whether the record names the sandbox instance it was started in
    /// (`origin`, supervisor ≥ 6): then only the supervisor may declare its
    /// daemon gone, as it alone tells a task copied from another sandbox apart.
    pub fn has_origin(&self) -> bool {
        self.fields.get("origin").is_some_and(Value::is_object)
    }

    /// Whether the daemon recorded that it lives in its task's directory
    /// (supervisor ≥ 5), so `/proc/PID/cwd/status.json` reaches this record.
    pub fn in_task_dir(&self) -> bool {
        self.fields.get("supervisor_in_task_dir").and_then(Value::as_bool) == Some(true)
    }

    /// Whether pages whose files measured `stdout_size` and `stderr_size` hold all the output this
    /// record says is stored (a terminal record's sizes are final).
    pub fn holds_all_of(&self, stdout_size: u64, stderr_size: u64) -> bool {
        self.number("stdout_size").is_some_and(|n| n <= stdout_size)
            && self.number("stderr_size").is_some_and(|n| n <= stderr_size)
    }

    fn number(&self, name: &str) -> Option<u64> {
        self.fields.get(name).and_then(Value::as_u64)
    }

    /// The object `status_view` in `supervisor.py` prints for this record in
    /// `state`, given the stored sizes of both streams (pages are passed
    /// separately, so the `*_b64` fields stay empty). `None` if a field has
    /// a type the view cannot carry (the supervisor answers then).
    pub fn status(
        &self,
        state: TaskState,
        error: Option<String>,
        stdout_size: u64,
        stderr_size: u64,
    ) -> Option<SupervisorStatus> {
        let get = |name: &str| self.fields.get(name).cloned().unwrap_or(Value::Null);
        let terminal = state.is_terminal();
        let when_terminal = |name: &str| if terminal { get(name) } else { Value::Null };
        let error = match error {
            Some(e) => Value::String(e),
            None => get("error"),
        };
        let object = serde_json::json!({
            "task_id": get("task_id"),
            "state": state.as_str(),
            "exit_code": when_terminal("exit_code"),
            "signal": when_terminal("signal"),
            "started_at": get("started_at"),
            "finished_at": when_terminal("finished_at"),
            "error": error,
            "stdout_size": stdout_size,
            "stderr_size": stderr_size,
            // Refreshed about once a second while running: lower bounds
            // (masking never lengthens, so a total is at least what is stored).
            "stdout_total_bytes": self.number("stdout_total_bytes").unwrap_or(0).max(stdout_size),
            "stderr_total_bytes": self.number("stderr_total_bytes").unwrap_or(0).max(stderr_size),
            "stdout_truncated": truthy(self.fields.get("stdout_truncated")),
            "stderr_truncated": truthy(self.fields.get("stderr_truncated")),
        });
        serde_json::from_value(object).ok()
    }
}

/// Python's truth value of a JSON field, as `bool(r.get(name))`.
fn truthy(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// The supervisor's `process_alive`: the process exists, is not a zombie and
/// has the recorded start time (so it is the same process, not a reused pid).
pub fn supervisor_alive(proc_stat: Option<&[u8]>, start_time: u64) -> bool {
    match proc_stat.and_then(ProcStat::parse) {
        Some(ProcStat { state, start_time: Some(start) }) => {
            start == start_time && !matches!(state, b'Z' | b'X' | b'x')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn proc_stat_fields_are_counted_after_the_last_paren() {
        let stat = b"4242 (py) thon) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 0";
        assert!(supervisor_alive(Some(stat), 987_654));
        assert!(!supervisor_alive(Some(stat), 987_655), "another process reusing the pid");
        let zombie = b"4242 (python3) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 0 0 0";
        assert!(!supervisor_alive(Some(zombie), 987_654));
        assert!(!supervisor_alive(None, 987_654));
        assert!(!supervisor_alive(Some(b"garbage"), 987_654));
        assert!(!supervisor_alive(Some(b"1 (x) S 1 2"), 987_654), "a line without a start time");
    }

    #[test]
    fn records_are_served_only_when_fully_understood() {
        let running =
            format!(r#"{{"task_id":"{ID}","state":"running","supervisor_pid":7,"supervisor_start_time":99}}"#);
        let record = StatusRecord::parse(running.as_bytes(), ID).unwrap();
        assert_eq!((record.state, record.supervisor()), (TaskState::Running, Some((7, 99))));
        // Another task's record, an unknown state, a running record without
        // a supervisor identity, or no JSON object: left to the supervisor.
        assert!(StatusRecord::parse(running.as_bytes(), "ffffffffffffffffffffffffffffffff").is_none());
        let odd = format!(r#"{{"task_id":"{ID}","state":"exploded"}}"#);
        assert!(StatusRecord::parse(odd.as_bytes(), ID).is_none());
        let anonymous = format!(r#"{{"task_id":"{ID}","state":"running","supervisor_pid":null}}"#);
        assert!(StatusRecord::parse(anonymous.as_bytes(), ID).is_none());
        assert!(StatusRecord::parse(b"[1]", ID).is_none());
        assert!(StatusRecord::parse(b"{\"task_id\":", ID).is_none());
    }

    #[test]
    fn status_hides_outcomes_until_terminal_and_bounds_totals() {
        let raw = format!(
            r#"{{"task_id":"{ID}","state":"running","supervisor_pid":7,"supervisor_start_time":99,
               "exit_code":3,"finished_at":5.0,"started_at":1.5,"stdout_total_bytes":10,
               "stdout_truncated":1,"stderr_truncated":0,"command":"echo","timeout":30}}"#
        );
        let record = StatusRecord::parse(raw.as_bytes(), ID).unwrap();
        let gone = record.status(TaskState::Unknown, Some(SUPERVISOR_GONE.into()), 40, 2).unwrap();
        assert_eq!(gone.state, TaskState::Unknown);
        assert_eq!((gone.exit_code, gone.finished_at, gone.started_at), (None, None, Some(1.5)));
        assert_eq!((gone.stdout_total_bytes, gone.stderr_total_bytes), (Some(40), Some(2)));
        assert!(gone.stdout_truncated && !gone.stderr_truncated);
        assert_eq!(gone.error.as_deref(), Some(SUPERVISOR_GONE));
        let done = record.status(TaskState::Failed, None, 4, 0).unwrap();
        assert_eq!((done.exit_code, done.finished_at, done.stdout_total_bytes), (Some(3), Some(5.0), Some(10)));
        // An exit code of the wrong type: not served directly.
        let odd = raw.replace(r#""exit_code":3"#, r#""exit_code":"3""#);
        let record = StatusRecord::parse(odd.as_bytes(), ID).unwrap();
        assert!(record.status(TaskState::Failed, None, 4, 0).is_none());
    }
}
