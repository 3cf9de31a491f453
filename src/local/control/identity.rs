//! A recorded process's identity: its host pid plus its start time from `/proc/<pid>/stat`, so a
//! recycled pid is never taken for the agent that had it, and whether `/proc` says it is alive,
//! gone, or cannot tell.

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
    let stat = crate::procfs::ProcStat::parse(stat.as_bytes())?;
    if matches!(stat.state, b'Z' | b'X') {
        return Some(None);
    }
    Some(Some(stat.start_time?))
}

/// True if `pid` is alive and still the process that had `start_time`.
pub fn process_is(pid: i32, start_time: u64) -> bool {
    pid > 0 && process_start_time(pid) == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
