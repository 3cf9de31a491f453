//! Host-side process helpers for sandbox agents: pidfd-based verified kill and
//! wait (works for our children and for agents adopted after a restart),
//! finding the processes of a sandbox's PID namespace, finding agents by the
//! tag in their argv, and checking the host's mount table for leftovers.
//!
//! An agent's argv (readable by every host user and, as PID 1, by everyone in
//! its sandbox) names neither its sandbox nor the state directory: it carries
//! `--agent-tag TAG`, a random name also written to `<sandbox dir>/agent.tag`
//! (see `record::AGENT_TAG_FILE`) before the agent starts. Reading argv needs
//! no privilege over the agent, which runs as an unmapped host uid.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use tokio::io::unix::AsyncFd;

use super::identity::process_is;

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal(2) on a descriptor we own, no siginfo.
    let ret = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::c_void>(), 0)
    };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// A copy of agent `pid`'s descriptor `number` (its data directory, from its readiness line: see
/// `isolation::spec::ready_line`), if `pid` is still the process that started at `start_time`.
/// What it names was checked to be a directory; everything read through it is treated as the
/// sandbox's (untrusted) writing.
pub fn agent_data_dir(pid: i32, start_time: u64, number: i32) -> std::io::Result<OwnedFd> {
    let pidfd = pidfd_open(pid)?;
    if !process_is(pid, start_time) {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    }
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd(2) on a pidfd we own; it returns a new descriptor (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), number, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let stat = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&fd)).map_err(std::io::Error::from)?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(std::io::Error::other("the agent's data descriptor is not a directory"));
    }
    Ok(fd)
}

/// Sends SIGKILL to the agent `pid` if it is still the process that started at `start_time`. As
/// PID 1 of its namespace, its death takes every process of the sandbox with it. Returns a pidfd
/// to wait on, or None if the process is already gone.
pub fn send_kill(pid: i32, start_time: u64) -> Option<OwnedFd> {
    try_send_kill(pid, start_time).unwrap_or_else(|err| {
        tracing::warn!(%err, pid, "cannot open a pidfd for the sandbox agent; it may still run");
        None
    })
}

/// Like [`send_kill`], but an error when the agent could not be signalled for a transient reason
/// (no pidfd for lack of descriptors): the caller must keep tracking it and try again.
pub fn try_send_kill(pid: i32, start_time: u64) -> std::io::Result<Option<OwnedFd>> {
    let pidfd = match pidfd_open(pid) {
        Ok(pidfd) => pidfd,
        Err(err) if err.raw_os_error() == Some(libc::ESRCH) || err.raw_os_error() == Some(libc::EINVAL) => {
            reap_if_child(pid);
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    if super::identity::process_liveness(pid, start_time) == super::identity::Liveness::Unknown {
        return Err(std::io::Error::other("cannot read /proc to verify the agent's identity"));
    }
    if process_is(pid, start_time)
        && let Err(err) = pidfd_send_signal(&pidfd, libc::SIGKILL)
    {
        tracing::warn!(%err, pid, "cannot signal sandbox agent");
    }
    Ok(Some(pidfd))
}

/// Waits up to `timeout` for the process behind `pidfd` to exit, then reaps it if it is our child.
/// Returns true if it is gone.
pub async fn wait_gone(pidfd: Option<OwnedFd>, pid: i32, start_time: u64, timeout: Duration) -> bool {
    let gone = match pidfd {
        None => true,
        // SAFETY: the OwnedFd is moved into the AsyncFd, which neither replaces nor closes it early.
        Some(fd) => match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(async_fd) => tokio::time::timeout(timeout, async_fd.readable()).await.is_ok(),
            Err(_) => {
                let deadline = tokio::time::Instant::now() + timeout;
                while process_is(pid, start_time) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                !process_is(pid, start_time)
            }
        },
    };
    reap_if_child(pid);
    gone
}

/// [`send_kill`] then [`wait_gone`].
pub async fn kill_and_wait(pid: i32, start_time: u64, timeout: Duration) -> bool {
    let pidfd = send_kill(pid, start_time);
    wait_gone(pidfd, pid, start_time, timeout).await
}

/// Collects `pid`'s exit status if it is a child of ours (no-op otherwise).
pub fn reap_if_child(pid: i32) {
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
}

/// Host pids of every process in the PID namespace whose init is `pid`.
pub fn namespace_members(pid: i32) -> Vec<i32> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid")) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == ns))
        .collect()
}

/// Sends `signal` to every process of the sandbox whose agent is `pid`.
pub fn signal_namespace(pid: i32, signal: nix::sys::signal::Signal) {
    for member in namespace_members(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(member), signal);
    }
}

/// The tag of the agent for `sandbox_dir`, if it was written.
pub fn read_agent_tag(sandbox_dir: &Path) -> Option<String> {
    let tag = std::fs::read_to_string(sandbox_dir.join(super::record::AGENT_TAG_FILE)).ok()?;
    let tag = tag.trim();
    (!tag.is_empty() && tag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| tag.to_owned())
}

/// How an agent's argv names it.
#[derive(Debug, PartialEq, Eq)]
enum AgentName {
    /// `--agent-tag TAG`.
    Tag(String),
    /// `--sandbox-dir DIR`: an agent started by an earlier version of the provider.
    Dir(std::path::PathBuf),
}

/// The name in an argv (`/proc/PID/cmdline`: NUL-separated), if it is an agent's.
fn agent_name(cmdline: &[u8]) -> Option<AgentName> {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let value = |flag: &str| args.iter().position(|a| *a == flag.as_bytes()).and_then(|i| args.get(i + 1));
    if let Some(tag) = value(crate::local::isolation::agent_spawn::AGENT_TAG_FLAG) {
        return String::from_utf8(tag.to_vec()).ok().map(AgentName::Tag);
    }
    use std::os::unix::ffi::OsStrExt;
    value("--sandbox-dir").map(|dir| AgentName::Dir(Path::new(std::ffi::OsStr::from_bytes(dir)).to_path_buf()))
}

/// Every host process whose argv names it an agent, as (pid, name).
fn named_agents() -> Vec<(i32, AgentName)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, agent_name(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)?)))
        .collect()
}

/// Host pids of the agent of `sandbox_dir` (one whose record was never written, e.g. the provider
/// died mid-create), found by the tag written there before it started.
pub fn agents_for_dir(sandbox_dir: &Path) -> Vec<i32> {
    let tag = read_agent_tag(sandbox_dir);
    named_agents()
        .into_iter()
        .filter(|(_, name)| match name {
            AgentName::Tag(t) => tag.as_ref() == Some(t),
            AgentName::Dir(d) => d == sandbox_dir,
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Agents started from this state directory's `sandboxes_dir` (their tag is in one of its
/// sandbox directories), as (host pid, sandbox id). Best effort: an unreadable `/proc` gives none.
pub fn agents_under(sandboxes_dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir(sandboxes_dir) else {
        return Vec::new();
    };
    let tags: std::collections::HashMap<String, String> = entries
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_str()?.to_owned();
            super::ids::is_valid_sandbox_id(&id).then_some(())?;
            Some((read_agent_tag(&e.path())?, id))
        })
        .collect();
    named_agents()
        .into_iter()
        .filter_map(|(pid, name)| match name {
            AgentName::Tag(tag) => Some((pid, tags.get(&tag)?.clone())),
            AgentName::Dir(dir) if dir.parent() == Some(sandboxes_dir) => {
                let id = dir.file_name()?.to_str()?.to_owned();
                super::ids::is_valid_sandbox_id(&id).then_some((pid, id))
            }
            AgentName::Dir(_) => None,
        })
        .collect()
}

/// Mount points in the host's mount namespace at or under `dir`.
pub fn host_mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_owned))
        .filter(|mp| mp == &prefix || mp.starts_with(&format!("{prefix}/")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_named_by_their_tag_or_by_an_earlier_version_s_directory() {
        let tagged = b"sandbox-mcp\0envd\0--agent-tag\0c0ffee\0--sandbox-dir-fd\0six\0--ready-fd\0three\0";
        assert_eq!(agent_name(tagged), Some(AgentName::Tag("c0ffee".into())));
        let legacy = b"sandbox-mcp\0envd\0--sandbox-dir\0/var/lib/sandbox-mcp/sandboxes/abc\0--ready-fd\0three\0";
        assert_eq!(agent_name(legacy), Some(AgentName::Dir("/var/lib/sandbox-mcp/sandboxes/abc".into())));
        assert_eq!(agent_name(b"python3\0-c\0pass\0"), None);
        assert_eq!(agent_name(b"x\0--agent-tag\0"), Some(AgentName::Tag(String::new())));
        assert_eq!(agent_name(b"x\0--agent-tag"), None, "a flag without a value names nothing");
    }
}
