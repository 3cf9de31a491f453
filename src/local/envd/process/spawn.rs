//! Starting one sandbox process: environment, user switch (setgroups, setgid,
//! setuid in the child), working directory, its own process group, and pipes.
//! The child is started by [`super::clone_exec`] (sharing envd's memory until
//! it execs: no copy of envd's page tables per command; never `tokio::process`,
//! whose SIGCHLD handling would fight the envd reaper); its exit status is
//! collected by [`super::reaper`].

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::clone_exec::{self, ExecPlan};

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
    let nul = |what| move |_| SpawnError::NulByte { what };
    if let Some((key, _)) = spec.env.iter().find(|(k, _)| k.is_empty() || k.contains('=')) {
        return Err(SpawnError::InvalidEnv { key: key.clone(), why: "is not a valid variable name" });
    }
    let mut argv = vec![CString::new(spec.cmd.as_bytes()).map_err(nul("cmd"))?];
    for arg in &spec.args {
        argv.push(CString::new(arg.as_bytes()).map_err(nul("an argument"))?);
    }
    let mut envp = Vec::with_capacity(spec.env.len());
    for (key, value) in &spec.env {
        envp.push(
            CString::new(format!("{key}={value}"))
                .map_err(|_| SpawnError::InvalidEnv { key: key.replace('\0', "\\0"), why: "contains a NUL byte" })?,
        );
    }
    let path = spec.env.iter().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let plan = ExecPlan {
        // PATH holds no NUL (checked with the environment) and the program none (checked in argv).
        candidates: clone_exec::candidates(&spec.cmd, path).map_err(nul("PATH"))?,
        argv,
        envp,
        cwd: CString::new(spec.cwd.as_os_str().as_bytes()).map_err(nul("cwd"))?,
        user: nix::unistd::geteuid().is_root().then(|| (spec.user.uid, spec.user.gid, spec.user.groups.clone())),
    };
    let start_error = |source| SpawnError::Start { cmd: spec.cmd.clone(), source };
    let (stdin_child, stdin) = if spec.pipe_stdin {
        let (read, write) = pipe().map_err(start_error)?;
        (read, Some(write))
    } else {
        (OwnedFd::from(std::fs::File::open("/dev/null").map_err(start_error)?), None)
    };
    let (stdout, stdout_child) = pipe().map_err(start_error)?;
    let (stderr, stderr_child) = pipe().map_err(start_error)?;
    let stdio = clone_exec::Stdio {
        stdin: stdin_child.as_raw_fd(),
        stdout: stdout_child.as_raw_fd(),
        stderr: stderr_child.as_raw_fd(),
    };
    let pid = clone_exec::spawn(&plan, &stdio).map_err(start_error)?;
    Ok(SpawnedChild { pid, stdin, stdout, stderr })
}

/// A close-on-exec pipe (read end, write end), both at descriptors ≥ 3 so that moving them to a
/// child's 0-2 never overwrites another.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    Ok((above_stdio(read)?, above_stdio(write)?))
}

fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor, then owned.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `moved` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
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
