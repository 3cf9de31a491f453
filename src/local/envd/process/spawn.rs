//! Starting one sandbox process: environment, user switch (setgroups, setgid,
//! setuid in the child), working directory, its own process group, and pipes.
//! Uses `std::process::Command` (never `tokio::process`, whose SIGCHLD
//! handling would fight the envd reaper); the `Child` handle is discarded
//! and the exit status is collected by [`super::reaper`].

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::local::envd::users::UserAccount;

/// Default `PATH` of sandbox processes.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to start.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub cmd: String,
    pub args: Vec<String>,
    /// The complete environment.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub user: UserAccount,
    pub pipe_stdin: bool,
}

/// A started child: its pid (= process-group id) and our ends of its pipes.
#[derive(Debug)]
pub struct SpawnedChild {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Builds the environment: PATH, HOME, USER, LOGNAME, then sandbox env vars, then request envs.
pub fn build_env(
    user: &UserAccount,
    sandbox_env: &HashMap<String, String>,
    request_env: &HashMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), user.home.to_string_lossy().into_owned()),
        ("USER".into(), user.name.clone()),
        ("LOGNAME".into(), user.name.clone()),
    ];
    let mut set = |key: &String, value: &String| {
        if let Some(slot) = env.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value.clone();
        } else {
            env.push((key.clone(), value.clone()));
        }
    };
    let mut sandbox: Vec<_> = sandbox_env.iter().collect();
    sandbox.sort();
    for (k, v) in sandbox {
        set(k, v);
    }
    let mut request: Vec<_> = request_env.iter().collect();
    request.sort();
    for (k, v) in request {
        set(k, v);
    }
    env
}

/// Errors while starting a process.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{what} contains a NUL byte")]
    NulByte { what: &'static str },
    #[error("environment variable '{key}' {why}")]
    InvalidEnv { key: String, why: &'static str },
    #[error("failed to start '{cmd}': {source}")]
    Start { cmd: String, source: std::io::Error },
}

/// Starts the process. Must be called while holding the reaper's registration lock.
pub fn spawn(spec: &SpawnSpec) -> Result<SpawnedChild, SpawnError> {
    let nul = |what| SpawnError::NulByte { what };
    if spec.cmd.contains('\0') {
        return Err(nul("cmd"));
    }
    if spec.args.iter().any(|a| a.contains('\0')) {
        return Err(nul("an argument"));
    }
    if let Some((key, _)) = spec.env.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')) {
        return Err(SpawnError::InvalidEnv { key: key.replace('\0', "\\0"), why: "contains a NUL byte" });
    }
    if let Some((key, _)) = spec.env.iter().find(|(k, _)| k.is_empty() || k.contains('=')) {
        return Err(SpawnError::InvalidEnv { key: key.clone(), why: "is not a valid variable name" });
    }
    let cwd = CString::new(spec.cwd.as_os_str().as_bytes()).map_err(|_| nul("cwd"))?;
    let mut command = Command::new(&spec.cmd);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.pipe_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let switch_user = nix::unistd::geteuid().is_root();
    let (uid, gid) = (spec.user.uid, spec.user.gid);
    let groups: Vec<libc::gid_t> = spec.user.groups.clone();
    let oom_path = c"/proc/self/oom_score_adj";
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe libc functions on data prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            // Only stdin/stdout/stderr cross into the command (std's own exec-error pipe is
            // already close-on-exec), whatever envd inherited or opened.
            crate::local::fds::mark_inherited_fds_cloexec(3);
            // Commands get a raised OOM score (raising needs no privilege; lowering it back does),
            // so the OOM killer picks them, never envd (which also tries -1000 for itself).
            // envd lost dumpability when it entered the sandbox's user namespace, which leaves
            // /proc/self owned by an unmapped uid; the child is about to exec (which restores it)
            // and must be able to write its own oom_score_adj first.
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            reset_oom_score(oom_path);
            if switch_user {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setgid(gid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // After the user switch, so the user must be able to enter the directory.
            if libc::chdir(cwd.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|source| SpawnError::Start { cmd: spec.cmd.clone(), source })?;
    let pid = child.id();
    let stdin = child.stdin.take().map(OwnedFd::from);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        // Cannot happen (both were requested as pipes); never leave the child behind.
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        return Err(SpawnError::Start { cmd: spec.cmd.clone(), source: std::io::Error::other("missing output pipes") });
    };
    // Dropping `child` neither waits nor kills: the reaper owns the exit status.
    drop(child);
    Ok(SpawnedChild { pid, stdin, stdout: OwnedFd::from(stdout), stderr: OwnedFd::from(stderr) })
}

/// `oom_score_adj` of every command envd starts.
pub const COMMAND_OOM_SCORE_ADJ: &[u8] = b"500";

/// Writes [`COMMAND_OOM_SCORE_ADJ`] to `/proc/self/oom_score_adj` (async-signal-safe; best effort).
fn reset_oom_score(path: &std::ffi::CStr) {
    // SAFETY: open/write/close on a constant path and a constant buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, COMMAND_OOM_SCORE_ADJ.as_ptr().cast(), COMMAND_OOM_SCORE_ADJ.len());
            libc::close(fd);
        }
    }
}

/// Sends `signal` to the process group of `pid` (falls back to the process alone).
pub fn signal_group(pid: u32, signal: i32) -> std::io::Result<()> {
    let raw = pid as libc::pid_t;
    // SAFETY: plain syscalls on integer arguments.
    unsafe {
        if libc::kill(-raw, signal) == 0 {
            return Ok(());
        }
        if libc::kill(raw, signal) == 0 {
            return Ok(());
        }
    }
    Err(std::io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_order_request_wins_over_sandbox_over_defaults() {
        let user = UserAccount { name: "u".into(), uid: 1, gid: 1, home: "/home/u".into(), groups: vec![1] };
        let sandbox = HashMap::from([("A".to_string(), "s".to_string()), ("PATH".to_string(), "/x".to_string())]);
        let request = HashMap::from([("A".to_string(), "r".to_string())]);
        let env = build_env(&user, &sandbox, &request);
        let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("A"), Some("r"));
        assert_eq!(get("PATH"), Some("/x"));
        assert_eq!(get("HOME"), Some("/home/u"));
        assert_eq!(get("LOGNAME"), Some("u"));
    }
}
