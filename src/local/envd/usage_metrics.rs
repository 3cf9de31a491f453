//! `GET /metrics`: a minimal envd `Metrics` snapshot read from /proc and statvfs.

use std::sync::Mutex;

use serde::Serialize;

/// envd `Metrics` (snake_case, as in envd.yaml).
#[derive(Debug, Clone, Serialize)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f32,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// CPU counters of the previous call, so usage is measured between calls.
#[derive(Debug, Default)]
pub struct CpuSampler {
    last: Mutex<Option<(u64, u64)>>,
}

impl CpuSampler {
    /// Busy percentage since the previous call (since boot on the first call).
    fn used_pct(&self) -> f32 {
        let Some((busy, total)) = read_cpu_counters() else { return 0.0 };
        let mut last = crate::sync::lock(&self.last);
        let (prev_busy, prev_total) = last.unwrap_or((0, 0));
        *last = Some((busy, total));
        let d_total = total.saturating_sub(prev_total);
        if d_total == 0 {
            return 0.0;
        }
        (busy.saturating_sub(prev_busy) as f64 * 100.0 / d_total as f64) as f32
    }
}

fn read_cpu_counters() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: u64 = values.iter().sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

fn meminfo_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|rest| rest.trim_start_matches(':').split_whitespace().next()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Takes a snapshot.
pub fn snapshot(cpu: &CpuSampler) -> Metrics {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total = meminfo_kib(&meminfo, "MemTotal") * 1024;
    let mem_available = meminfo_kib(&meminfo, "MemAvailable") * 1024;
    let mem_cache = (meminfo_kib(&meminfo, "Cached") + meminfo_kib(&meminfo, "Buffers")) * 1024;
    let mem_used = mem_total.saturating_sub(mem_available);
    let (disk_used, disk_total) = match nix::sys::statvfs::statvfs("/") {
        Ok(vfs) => {
            let frag = vfs.fragment_size();
            let total = vfs.blocks() * frag;
            (total.saturating_sub(vfs.blocks_free() * frag), total)
        }
        Err(_) => (0, 0),
    };
    Metrics {
        ts: chrono::Utc::now().timestamp(),
        cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        cpu_used_pct: cpu.used_pct(),
        mem_total,
        mem_used,
        mem_cache,
        mem_total_mib: mem_total / (1024 * 1024),
        mem_used_mib: mem_used / (1024 * 1024),
        disk_used,
        disk_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_proc() {
        let m = snapshot(&CpuSampler::default());
        assert!(m.mem_total > 0 && m.mem_used <= m.mem_total);
        assert!(m.cpu_count >= 1 && m.ts > 0);
        assert_eq!(meminfo_kib("MemTotal:  2048 kB\nCached: 5 kB", "Cached"), 5);
    }
}
