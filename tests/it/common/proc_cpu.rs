//! Where a process tree's CPU time goes: snapshots of `/proc/PID/stat` for a process and all its
//! descendants (their own time, and the time of children they reaped meanwhile), and the per-process
//! difference of two snapshots. Used by the benches to split a throughput run's CPU between the bench
//! client, the gateway, the provider, the sandbox agent and the shells it starts.

use std::collections::HashMap;

/// Clock ticks per second of `/proc/PID/stat` times (`USER_HZ`, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// One process's line of a snapshot.
#[derive(Clone, Debug)]
pub struct ProcTimes {
    pub comm: String,
    pub ppid: u32,
    /// utime + stime, in ticks.
    pub own: u64,
    /// cutime + cstime (children waited for), in ticks.
    pub children: u64,
}

/// `/proc/PID/stat` of `root` and all its descendants, by pid.
pub fn snapshot(root: u32) -> HashMap<u32, ProcTimes> {
    let mut all = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return all };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some(times) = read_stat(pid) {
            all.insert(pid, times);
        }
    }
    let mut tree = HashMap::new();
    for (&pid, times) in &all {
        let mut at = pid;
        // Walk up to pid 1; a process belongs to the tree when `root` is one of its ancestors.
        for _ in 0..64 {
            if at == root {
                tree.insert(pid, times.clone());
                break;
            }
            match all.get(&at) {
                Some(t) if t.ppid != 0 && t.ppid != at => at = t.ppid,
                _ => break,
            }
        }
    }
    tree
}

fn read_stat(pid: u32) -> Option<ProcTimes> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(ProcTimes { comm, ppid: field(1)? as u32, own: field(11)? + field(12)?, children: field(13)? + field(14)? })
}

/// CPU seconds per process between two snapshots: `(pid, comm, own, reaped children)`, largest first. A
/// process born meanwhile counts from zero; one that exited meanwhile is in its parent's children time.
pub fn delta(before: &HashMap<u32, ProcTimes>, after: &HashMap<u32, ProcTimes>) -> Vec<(u32, String, f64, f64)> {
    let mut rows: Vec<_> = after
        .iter()
        .map(|(&pid, now)| {
            let (own0, children0) = before.get(&pid).map_or((0, 0), |b| (b.own, b.children));
            let own = now.own.saturating_sub(own0) as f64 / TICKS_PER_SEC;
            let children = now.children.saturating_sub(children0) as f64 / TICKS_PER_SEC;
            (pid, now.comm.clone(), own, children)
        })
        .filter(|row| row.2 + row.3 > 0.0)
        .collect();
    rows.sort_by(|a, b| (b.2 + b.3).total_cmp(&(a.2 + a.3)));
    rows
}

/// The machine's busy and total CPU seconds so far (all cores), from `/proc/stat`.
pub fn machine_seconds() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().next() else { return (0.0, 0.0) };
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    ((total - idle) as f64 / TICKS_PER_SEC, total as f64 / TICKS_PER_SEC)
}
