//! Per-sandbox cgroups: memory and pids limits and the freezer, on cgroup v1
//! (one hierarchy per controller under `/sys/fs/cgroup/<ctrl>`) or cgroup v2
//! (unified, when `/sys/fs/cgroup/cgroup.controllers` exists). Everything is
//! best effort: a controller that is missing or not writable is skipped with a
//! warning, and the sandbox runs without that limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Name of the directory under which sandbox cgroups are created.
const GROUP_NAME: &str = "sandbox-mcp";

/// Which cgroup layout the host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Unified hierarchy: one directory per sandbox, under this base.
    V2 { base: PathBuf },
    /// Legacy hierarchies: base directory per available controller.
    V1 { memory: Option<PathBuf>, pids: Option<PathBuf>, freezer: Option<PathBuf> },
    /// No usable cgroups.
    None,
}

/// Limits applied to each sandbox.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub memory_limit_mb: Option<u64>,
    pub pids_limit: Option<u64>,
}

impl CgroupLayout {
    /// Detects the layout and prepares the base directories.
    pub fn detect() -> CgroupLayout {
        let root = Path::new(CGROUP_ROOT);
        if root.join("cgroup.controllers").exists() {
            let base = root.join(GROUP_NAME);
            if let Err(err) = std::fs::create_dir_all(&base) {
                tracing::warn!(%err, "cgroup v2: cannot create {}; no limits or freezer", base.display());
                return CgroupLayout::None;
            }
            enable_v2_controllers(root);
            if let Err(err) = std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids") {
                tracing::warn!(%err, "cgroup v2: cannot enable memory/pids for sandboxes; no limits");
            }
            return CgroupLayout::V2 { base };
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let base_for = |ctrl: &str| -> Option<PathBuf> {
            let mount = root.join(ctrl);
            if !mount.join("cgroup.procs").exists() {
                return None;
            }
            // Nest under the provider's own cgroup so sandboxes stay inside its limits.
            let own_path = own
                .lines()
                .filter_map(|line| {
                    let mut fields = line.splitn(3, ':').skip(1);
                    fields.next().zip(fields.next())
                })
                .find(|(ctrls, _)| ctrls.split(',').any(|c| c == ctrl))
                .map(|(_, path)| path.trim_start_matches('/').to_owned())
                .unwrap_or_default();
            let nested = mount.join(&own_path).join(GROUP_NAME);
            match std::fs::create_dir_all(&nested) {
                Ok(()) => Some(nested),
                Err(_) => {
                    let top = mount.join(GROUP_NAME);
                    std::fs::create_dir_all(&top).ok().map(|()| top)
                }
            }
        };
        let (memory, pids, freezer) = (base_for("memory"), base_for("pids"), base_for("freezer"));
        if memory.is_none() && pids.is_none() && freezer.is_none() {
            tracing::warn!("no usable cgroup controllers: no memory/pids limits, pause uses SIGSTOP");
            return CgroupLayout::None;
        }
        CgroupLayout::V1 { memory, pids, freezer }
    }

    /// True if pause can use a cgroup freezer.
    pub fn has_freezer(&self) -> bool {
        match self {
            CgroupLayout::V2 { .. } => true,
            CgroupLayout::V1 { freezer, .. } => freezer.is_some(),
            CgroupLayout::None => false,
        }
    }

    /// The cgroup directories a sandbox with this id would have (for cleaning up without a record).
    pub fn paths_for(&self, sandbox_id: &str) -> Vec<PathBuf> {
        match self {
            CgroupLayout::V2 { base } => vec![base.join(sandbox_id)],
            CgroupLayout::V1 { memory, pids, freezer } => {
                [memory, pids, freezer].into_iter().flatten().map(|b| b.join(sandbox_id)).collect()
            }
            CgroupLayout::None => Vec::new(),
        }
    }

    /// Creates the sandbox's cgroups and applies the limits; returns the created directories.
    pub fn create(&self, sandbox_id: &str, limits: Limits) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        let mut make = |base: &Path, settings: &[(&str, Option<String>)]| {
            let dir = base.join(sandbox_id);
            if let Err(err) = std::fs::create_dir(&dir) {
                tracing::warn!(%err, "cannot create cgroup {}", dir.display());
                return;
            }
            for (file, value) in settings {
                if let Some(value) = value
                    && let Err(err) = std::fs::write(dir.join(file), value)
                {
                    tracing::warn!(%err, "cannot set {} in {}", file, dir.display());
                }
            }
            dirs.push(dir);
        };
        let mem_bytes = limits.memory_limit_mb.map(|mb| (mb * 1024 * 1024).to_string());
        let pids = limits.pids_limit.map(|n| n.to_string());
        match self {
            CgroupLayout::V2 { base } => make(
                base,
                &[
                    ("memory.max", mem_bytes.clone()),
                    ("memory.swap.max", mem_bytes.map(|_| "0".into())),
                    ("pids.max", pids),
                ],
            ),
            CgroupLayout::V1 { memory, pids: pids_base, freezer } => {
                if let Some(base) = memory {
                    make(base, &[("memory.limit_in_bytes", mem_bytes)]);
                }
                if let Some(base) = pids_base {
                    make(base, &[("pids.max", pids)]);
                }
                if let Some(base) = freezer {
                    make(base, &[]);
                }
            }
            CgroupLayout::None => {}
        }
        dirs
    }
}

/// Enables the memory and pids controllers below the (possibly namespaced) cgroup v2 root. Inside
/// a container the root holds the container's processes, and the "no internal processes" rule
/// refuses that (EBUSY): then, like other nested runtimes, move those processes into a leaf first.
fn enable_v2_controllers(root: &Path) {
    let control = root.join("cgroup.subtree_control");
    match std::fs::write(&control, "+memory +pids") {
        Ok(()) => return,
        Err(err) if err.raw_os_error() != Some(libc::EBUSY) => {
            tracing::warn!(%err, "cgroup v2: cannot enable memory/pids at {}", root.display());
            return;
        }
        Err(_) => {}
    }
    let leaf = root.join("sandbox-mcp-host");
    if let Err(err) = std::fs::create_dir_all(&leaf) {
        tracing::warn!(%err, "cgroup v2: cannot create {}", leaf.display());
        return;
    }
    let procs = std::fs::read_to_string(root.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines() {
        // Kernel threads cannot move; that is fine.
        let _ = std::fs::write(leaf.join("cgroup.procs"), pid);
    }
    if let Err(err) = std::fs::write(&control, "+memory +pids") {
        tracing::warn!(%err, "cgroup v2: cannot enable memory/pids at {}", root.display());
    }
}

/// The files through which a new agent moves itself into `dirs` before it runs anything: cgroup
/// v1's `tasks`, into which the still single-threaded child writes `0` (itself). Empty when any
/// of `dirs` has none (cgroup v2): the provider then moves the agent with [`attach`].
///
/// Why: a move through `cgroup.procs`, or of another task's pid, takes the kernel's global
/// threadgroup lock for writing, which waits for an RCU grace period unless another move happened
/// just before (5-25 ms for a lone create, about 0.1 ms inside a burst) and meanwhile holds up
/// every fork and exit on the machine. A task moving its own single thread takes no such lock.
pub fn self_move_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = dirs.iter().map(|dir| dir.join("tasks")).collect();
    if files.iter().all(|file| file.is_file()) { files } else { Vec::new() }
}

/// Whether the process `pid` is in every cgroup directory of `dirs` (listed in each one's
/// `cgroup.procs`, whose reading takes no lock that a move would). False when one cannot be read.
pub fn is_member(pid: i32, dirs: &[PathBuf]) -> bool {
    let pid = pid.to_string();
    dirs.iter().all(|dir| {
        std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|procs| procs.lines().any(|line| line == pid))
    })
}

/// Moves `pid` into every cgroup directory in `dirs`.
pub fn attach(dirs: &[PathBuf], pid: i32) {
    for dir in dirs {
        if let Err(err) = std::fs::write(dir.join("cgroup.procs"), pid.to_string()) {
            tracing::warn!(%err, "cannot move pid {pid} into {}", dir.display());
        }
    }
}

/// The freezer directory among a sandbox's cgroups, if any, and whether it is v2.
fn freezer_dir(dirs: &[PathBuf]) -> Option<(&Path, bool)> {
    dirs.iter().find_map(|d| {
        if d.join("cgroup.freeze").exists() {
            Some((d.as_path(), true))
        } else if d.join("freezer.state").exists() {
            Some((d.as_path(), false))
        } else {
            None
        }
    })
}

/// Freezes (or thaws) the sandbox's cgroup. Returns false if it has no freezer.
pub async fn set_frozen(dirs: &[PathBuf], frozen: bool) -> std::io::Result<bool> {
    let Some((dir, v2)) = freezer_dir(dirs) else {
        return Ok(false);
    };
    let (file, value, done) = if v2 {
        ("cgroup.freeze", if frozen { "1" } else { "0" }, None)
    } else {
        ("freezer.state", if frozen { "FROZEN" } else { "THAWED" }, Some(if frozen { "FROZEN" } else { "THAWED" }))
    };
    std::fs::write(dir.join(file), value)?;
    // Wait until the transition completes (v1 passes through FREEZING; v2 reports in cgroup.events).
    for _ in 0..200 {
        let settled = match done {
            Some(want) => std::fs::read_to_string(dir.join("freezer.state")).map(|s| s.trim() == want)?,
            None => std::fs::read_to_string(dir.join("cgroup.events"))
                .map(|s| s.lines().any(|l| l == format!("frozen {}", if frozen { 1 } else { 0 })))?,
        };
        if settled {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(std::io::Error::other("the cgroup freezer did not settle within 1 s"))
}

/// Removes the sandbox's cgroup directories (retrying while the last tasks exit).
pub async fn remove(dirs: &[PathBuf]) {
    for dir in dirs {
        for attempt in 0..100 {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => break,
                Err(err) => {
                    if attempt == 99 {
                        tracing::warn!(%err, "cannot remove cgroup {}", dir.display());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// Page cache charged to the sandbox, in bytes: `memory.stat` `file` (v2) or
/// `total_cache` / `cache` (v1).
pub fn memory_cache(dirs: &[PathBuf]) -> Option<u64> {
    dirs.iter().find_map(|d| {
        let stat = std::fs::read_to_string(d.join("memory.stat")).ok()?;
        ["file", "total_cache", "cache"].iter().find_map(|key| stat_value(&stat, key))
    })
}

/// The value of `key` in a `KEY VALUE` per line cgroup file.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Memory usage of the sandbox in bytes (`memory.current` (v2) or
/// `memory.usage_in_bytes` (v1)), if a memory cgroup exists.
pub fn memory_usage(dirs: &[PathBuf]) -> Option<u64> {
    dirs.iter().find_map(|d| {
        ["memory.current", "memory.usage_in_bytes"]
            .iter()
            .find_map(|f| std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    /// Two empty cgroup-like directories in a temporary root (kept alive by the first value).
    fn two_hierarchies() -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<std::path::PathBuf> = ["memory", "pids"].map(|h| root.path().join(h)).to_vec();
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap();
        }
        (root, dirs)
    }

    #[test]
    fn membership_is_read_from_each_directorys_procs() {
        let (_root, dirs) = two_hierarchies();
        std::fs::write(dirs[0].join("cgroup.procs"), "7\n42\n").unwrap();
        std::fs::write(dirs[1].join("cgroup.procs"), "420\n").unwrap();
        assert!(!super::is_member(42, &dirs), "missing from one hierarchy");
        std::fs::write(dirs[1].join("cgroup.procs"), "420\n42\n").unwrap();
        assert!(super::is_member(42, &dirs));
        assert!(!super::is_member(4, &dirs), "whole pids only");
        std::fs::remove_file(dirs[1].join("cgroup.procs")).unwrap();
        assert!(!super::is_member(42, &dirs), "unreadable counts as not a member");
    }

    #[test]
    fn a_self_move_needs_a_tasks_file_in_every_directory() {
        let (_root, dirs) = two_hierarchies();
        std::fs::write(dirs[0].join("tasks"), "").unwrap();
        assert!(super::self_move_files(&dirs).is_empty(), "cgroup v2 (no tasks file): the provider moves it");
        std::fs::write(dirs[1].join("tasks"), "").unwrap();
        assert_eq!(super::self_move_files(&dirs), dirs.iter().map(|d| d.join("tasks")).collect::<Vec<_>>());
    }

    #[test]
    fn stat_values_are_found_by_exact_key() {
        let v1 = "cache 4096\nrss 8192\ntotal_cache 12288\n";
        assert_eq!(super::stat_value(v1, "total_cache"), Some(12288));
        assert_eq!(super::stat_value(v1, "cache"), Some(4096));
        assert_eq!(super::stat_value("anon 1\nfile 77\n", "file"), Some(77));
        assert_eq!(super::stat_value("file_mapped 5\n", "file"), None);
    }
}
