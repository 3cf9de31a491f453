//! Reading Linux's `/proc/PID` files, written once: the parser of a `/proc/PID/stat` line (its
//! state and start time), which the local provider's process identity and get_task's
//! supervisor-liveness rule both use, whether a pid is alive, and a process's resident set
//! size from `/proc/PID/status`.

/// The fields of a `/proc/PID/stat` line that tell one process from another and a live one
/// from a dead one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: u8,
    /// Field 22: start time in clock ticks since boot; `None` when the line stops before it.
    pub start_time: Option<u64>,
}

impl ProcStat {
    /// Parses the text of `/proc/PID/stat`; `None` if it is not a stat line. The command name
    /// (field 2) may hold spaces and ')': fields are counted after the last ')'.
    pub fn parse(raw: &[u8]) -> Option<ProcStat> {
        let close = raw.iter().rposition(|b| *b == b')')?;
        let rest = std::str::from_utf8(raw.get(close + 1..)?).ok()?;
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        // fields[0] is field 3 (state); field N is fields[N - 3]; starttime is field 22.
        let state = *fields.first()?.as_bytes().first()?;
        let start_time = fields.get(19).and_then(|f| f.parse().ok());
        Some(ProcStat { state, start_time })
    }
}

/// Whether `pid` names a live process (not gone, not a zombie) in this PID namespace.
pub fn is_alive(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|raw| ProcStat::parse(&raw))
        .is_some_and(|stat| !matches!(stat.state, b'Z' | b'X'))
}

/// Resident set size of `pid` in KiB (`VmRSS`), or `None` if it cannot be read.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_last_paren() {
        let stat = b"4242 (py) thon) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 0";
        assert_eq!(ProcStat::parse(stat), Some(ProcStat { state: b'S', start_time: Some(987_654) }));
        assert_eq!(ProcStat::parse(b"garbage"), None);
        assert_eq!(ProcStat::parse(b"1 (x) S 1 2"), Some(ProcStat { state: b'S', start_time: None }));
        assert_eq!(ProcStat::parse(b"1 (x) "), None);
    }

    #[test]
    fn own_resident_size() {
        assert!(rss_kib(std::process::id() as i32).is_some_and(|kib| kib > 0));
        assert_eq!(rss_kib(i32::MAX), None);
    }
}
