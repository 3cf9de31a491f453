//! The state directory's lock: one provider per `local.state_dir`. A second
//! provider on the same directory would re-adopt (and later reap) the first
//! one's sandboxes, so it refuses to start instead.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// File inside the state directory that the running provider holds an exclusive `flock` on.
pub const LOCK_FILE: &str = "provider.lock";

/// How long a lock held after its recorded provider died is waited for.
pub const DEAD_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Errors of taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another sandbox-mcp provider (pid {holder}) already uses the state directory {dir}; stop it, or give \
         this one its own state directory (local.state_dir in the config, --state-dir for `sandbox-mcp provider`)"
    )]
    Busy { dir: PathBuf, holder: String },
    #[error("cannot lock the state directory {dir} (local.state_dir): {source}")]
    Io { dir: PathBuf, source: std::io::Error },
}

/// An exclusive lock on a state directory, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
}

impl StateLock {
    /// Takes the lock; fails with [`LockError::Busy`] while another provider holds it. The
    /// descriptor is close-on-exec, so sandbox agents (which outlive the provider) never hold it;
    /// but a provider's short-lived helper children (forked, never exec'd: a user namespace's
    /// holder) keep it for the moment they take to notice their provider died, so while the
    /// recorded holder is no longer alive the lock is tried again for up to [`DEAD_HOLDER_WAIT`].
    pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
        let io = |source| LockError::Io { dir: state_dir.to_owned(), source };
        let path = state_dir.join(LOCK_FILE);
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        let deadline = std::time::Instant::now() + DEAD_HOLDER_WAIT;
        loop {
            // SAFETY: flock on a descriptor we own.
            let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if ret == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(err));
            }
            let holder = std::fs::read_to_string(&path).unwrap_or_default().trim().to_owned();
            let dead = holder.parse::<i32>().is_ok_and(|pid| !crate::procfs::is_alive(pid));
            if !dead || std::time::Instant::now() >= deadline {
                let holder = if holder.is_empty() { "unknown".to_owned() } else { holder };
                return Err(LockError::Busy { dir: state_dir.to_owned(), holder });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        use std::io::{Seek, Write};
        file.set_len(0).map_err(io)?;
        file.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
        Ok(StateLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_the_same_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let err = StateLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("local.state_dir") && err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        StateLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_lock_kept_by_the_child_of_a_dead_holder_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        // The lock file names a process that has exited; a copy of the locked descriptor lives on
        // (as in a helper forked by that provider) for 300 ms.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), format!("{}\n", gone.id())).unwrap();
        let held = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(first);
        });
        let started = std::time::Instant::now();
        let _taken = StateLock::acquire(dir.path()).unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(250));
        held.join().unwrap();
        // A live holder (this process now) is refused at once.
        let started = std::time::Instant::now();
        StateLock::acquire(dir.path()).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_millis(250));
    }
}
