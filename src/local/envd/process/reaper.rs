//! The one place that collects child exit statuses. On SIGCHLD it calls
//! `waitpid`; statuses of registered pids go to their [`ExitCell`]s. As PID 1
//! of a sandbox (`reap_orphans`) it waits for any child and silently reaps
//! orphans; otherwise (tests on a host) it only waits for registered pids so
//! it never steals statuses from its host process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

/// Where one process's wait status lands.
#[derive(Debug, Default)]
pub struct ExitCell {
    status: OnceLock<i32>,
    notify: Notify,
}

impl ExitCell {
    /// The raw wait status, once reaped.
    pub fn status(&self) -> Option<i32> {
        self.status.get().copied()
    }

    /// Waits for the raw wait status.
    pub async fn wait(&self) -> i32 {
        loop {
            let notified = self.notify.notified();
            if let Some(status) = self.status() {
                return status;
            }
            notified.await;
        }
    }

    fn set(&self, status: i32) {
        let _ = self.status.set(status);
        self.notify.notify_waiters();
    }
}

/// The reaper of one envd.
pub struct Reaper {
    waiting: Mutex<HashMap<u32, Arc<ExitCell>>>,
    reap_orphans: bool,
}

impl Reaper {
    /// Installs the SIGCHLD listener and starts the reaping task. Must run inside a tokio runtime.
    pub fn start(reap_orphans: bool) -> std::io::Result<Arc<Reaper>> {
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let reaper = Arc::new(Reaper { waiting: Mutex::new(HashMap::new()), reap_orphans });
        let weak = Arc::downgrade(&reaper);
        tokio::spawn(async move {
            loop {
                // The periodic sweep is a safety net; SIGCHLD normally wakes us at once.
                let _ = tokio::time::timeout(Duration::from_secs(2), sigchld.recv()).await;
                let Some(reaper) = weak.upgrade() else { return };
                reaper.sweep();
            }
        });
        Ok(reaper)
    }

    /// Spawns a child through `spawn` while holding the registration lock, so
    /// the reaper cannot collect its status before it is registered.
    pub fn spawn_registered<T, E>(
        &self,
        spawn: impl FnOnce() -> Result<T, E>,
        pid_of: impl FnOnce(&T) -> u32,
    ) -> Result<(T, Arc<ExitCell>), E> {
        let mut waiting = crate::sync::lock(&self.waiting);
        let child = spawn()?;
        let cell = Arc::new(ExitCell::default());
        waiting.insert(pid_of(&child), cell.clone());
        drop(waiting);
        // A child that exited instantly may have raised SIGCHLD before it was registered.
        self.sweep();
        Ok((child, cell))
    }

    /// Collects every available exit status.
    pub fn sweep(&self) {
        let mut waiting = crate::sync::lock(&self.waiting);
        if self.reap_orphans {
            loop {
                let mut status = 0;
                // SAFETY: plain syscall.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                match waiting.remove(&(pid as u32)) {
                    Some(cell) => cell.set(status),
                    None => tracing::debug!(pid, "reaped an orphaned process"),
                }
            }
        } else {
            let mut done = Vec::new();
            for (&pid, cell) in waiting.iter() {
                let mut status = 0;
                // SAFETY: plain syscall.
                let got = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
                if got == pid as libc::pid_t {
                    cell.set(status);
                    done.push(pid);
                } else if got < 0 {
                    // ECHILD: somebody else reaped it; report a generic failure rather than hang.
                    cell.set(255 << 8);
                    done.push(pid);
                }
            }
            for pid in done {
                waiting.remove(&pid);
            }
        }
    }
}

/// An exit status in Go `os.ProcessState` terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitOutcome {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
}

impl ExitOutcome {
    /// Decodes a raw wait status.
    pub fn from_wait_status(status: i32) -> ExitOutcome {
        if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            ExitOutcome { exit_code: code, exited: true, status: format!("exit status {code}") }
        } else if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            let mut text = format!("signal: {}", go_signal_name(sig));
            if libc::WCOREDUMP(status) {
                text.push_str(" (core dumped)");
            }
            ExitOutcome { exit_code: -1, exited: false, status: text }
        } else {
            ExitOutcome { exit_code: -1, exited: false, status: format!("unknown wait status {status:#x}") }
        }
    }

    /// The `error` member of the end event: set unless the process exited with 0.
    pub fn error(&self) -> Option<String> {
        if self.exited && self.exit_code == 0 { None } else { Some(self.status.clone()) }
    }
}

/// Go's `syscall.Signal.String()` on Linux.
fn go_signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        16 => "stack fault",
        17 => "child exited",
        18 => "continued",
        19 => "stopped (signal)",
        20 => "stopped",
        21 => "stopped (tty input)",
        22 => "stopped (tty output)",
        23 => "urgent I/O condition",
        24 => "CPU time limit exceeded",
        25 => "file size limit exceeded",
        26 => "virtual timer expired",
        27 => "profiling timer expired",
        28 => "window changed",
        29 => "I/O possible",
        30 => "power failure",
        31 => "bad system call",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_process_state_semantics() {
        let ok = ExitOutcome::from_wait_status(0);
        assert_eq!((ok.exit_code, ok.exited, ok.status.as_str(), ok.error()), (0, true, "exit status 0", None));
        let three = ExitOutcome::from_wait_status(3 << 8);
        assert_eq!(three.error().as_deref(), Some("exit status 3"));
        let killed = ExitOutcome::from_wait_status(9);
        assert_eq!((killed.exit_code, killed.exited, killed.status.as_str()), (-1, false, "signal: killed"));
        assert_eq!(ExitOutcome::from_wait_status(15).status, "signal: terminated");
    }
}
