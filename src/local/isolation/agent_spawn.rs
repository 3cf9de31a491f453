//! Host side of sandbox creation: clones the in-sandbox agent (`sandbox-mcp
//! envd`) into new PID, mount, UTS and IPC namespaces, moves it into the
//! network namespace the provider prepared for it (see `local::net`), hands it
//! the disk and user namespace prepared for it (see `disk` and `userns`), and
//! detaches it into its own session so it outlives the provider. On cgroup v1
//! the child moves itself into the sandbox's cgroups before anything else;
//! otherwise the provider moves it while it sets the sandbox up, before
//! anything of the sandbox's own runs.
//! Also the start-up probe that checks namespaces and overlayfs are permitted.
//!
//! The child of `clone` lives in a copy of a multi-threaded process, so it only
//! makes async-signal-safe system calls on data prepared before the clone.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// File descriptor on which envd reports readiness (`ok`) or its set-up error.
pub const READY_FD: i32 = 3;
/// File descriptor of the sandbox's prepared disk (a detached mount), when it has one.
pub const DISK_FD: i32 = 4;
/// File descriptor of the sandbox's prepared user namespace, when the provider made one.
pub const USERNS_FD: i32 = 5;
/// File descriptor of the sandbox's directory (`O_PATH`): its path is not in the agent's argv,
/// which every host user can read (see `agent_process`).
pub const SANDBOX_DIR_FD: i32 = 6;
/// The argument naming the agent's tag (see `agent_process`).
pub const AGENT_TAG_FLAG: &str = "--agent-tag";

/// Descriptors the provider made ahead of time for a new sandbox (see `disk` and `userns`).
#[derive(Clone, Copy, Default)]
pub struct Prepared<'a> {
    /// The sandbox's disk, mounted as a detached mount.
    pub disk: Option<BorrowedFd<'a>>,
    /// The sandbox's user namespace.
    pub userns: Option<BorrowedFd<'a>>,
}

/// Errors of spawning an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentSpawnError {
    #[error("{what}: {source}")]
    Sys { what: &'static str, source: nix::Error },
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("path contains a NUL byte")]
    Nul,
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> AgentSpawnError {
    move |source| AgentSpawnError::Sys { what, source }
}

/// A freshly cloned agent: its host pid and the read end of its readiness pipe.
pub struct SpawnedAgent {
    pub pid: i32,
    pub ready: OwnedFd,
}

fn pipe_cloexec() -> Result<(OwnedFd, OwnedFd), AgentSpawnError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe2"))
}

/// Raw `clone(2)` that behaves like `fork` (no new stack, no shared memory).
/// Returns 0 in the child, the child's pid in the parent.
pub(crate) fn raw_clone(flags: libc::c_int) -> Result<libc::pid_t, nix::Error> {
    // SAFETY: without CLONE_VM the child gets a copy-on-write copy of our address space and
    // continues on its own copy of this stack, exactly like fork(2). The null pointers are
    // the stack / tid / tls arguments that these flags do not use.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if ret < 0 { Err(nix::Error::last()) } else { Ok(ret as libc::pid_t) }
}

/// Namespaces every sandbox gets from `clone` (its network namespace is joined with `setns`).
fn sandbox_clone_flags() -> libc::c_int {
    libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC
}

/// The child copies each passed descriptor to a number at least this high before moving it to
/// its place: above every target, so no `dup2` clobbers another's source.
const DUP_FLOOR: i32 = 16;

/// The agent's command line and environment, decided before the clone (the child only reads
/// them). The sandbox's path is in neither: every host user can read an argv.
#[derive(Debug)]
struct AgentCommand {
    argv: Vec<CString>,
    env: Vec<CString>,
}

/// `sandbox-mcp envd --agent-tag TAG --sandbox-dir-fd 6 --ready-fd 3`, plus `--disk-fd 4` and
/// `--userns-fd 5` for what was prepared, in an environment of only `PATH` and the provider's
/// `RUST_LOG` (`rust_log`): the provider's own environment (which may hold its API key) never
/// leaks in.
fn agent_command(
    agent_tag: &str,
    prepared: Prepared<'_>,
    rust_log: Option<String>,
) -> Result<AgentCommand, AgentSpawnError> {
    let cstr = |s: &str| CString::new(s).map_err(|_| AgentSpawnError::Nul);
    let mut argv = vec![
        cstr("sandbox-mcp")?,
        cstr("envd")?,
        cstr(AGENT_TAG_FLAG)?,
        cstr(agent_tag)?,
        cstr("--sandbox-dir-fd")?,
        cstr(&SANDBOX_DIR_FD.to_string())?,
        cstr("--ready-fd")?,
        cstr(&READY_FD.to_string())?,
    ];
    for (fd, flag, number) in [(prepared.disk, "--disk-fd", DISK_FD), (prepared.userns, "--userns-fd", USERNS_FD)] {
        if fd.is_some() {
            argv.push(cstr(flag)?);
            argv.push(cstr(&number.to_string())?);
        }
    }
    let mut env = vec![cstr(&format!("PATH={}", crate::local::envd::DEFAULT_PATH))?];
    if let Some(filter) = rust_log {
        env.push(cstr(&format!("RUST_LOG={filter}"))?);
    }
    Ok(AgentCommand { argv, env })
}

/// The descriptors the agent receives: (descriptor in the provider, its number in the agent),
/// one per passed resource, -1 in the provider for what was not prepared. The pipe end `ready`
/// lands on [`READY_FD`], the sandbox directory `dir` on [`SANDBOX_DIR_FD`].
fn passed_fds(ready: RawFd, prepared: Prepared<'_>, dir: RawFd) -> [(RawFd, i32); 4] {
    let raw = |fd: Option<BorrowedFd<'_>>| fd.map_or(-1, |fd| fd.as_raw_fd());
    [(ready, READY_FD), (raw(prepared.disk), DISK_FD), (raw(prepared.userns), USERNS_FD), (dir, SANDBOX_DIR_FD)]
}

/// Clones `sandbox-mcp envd --agent-tag TAG --sandbox-dir-fd 6 ...` into new namespaces and the
/// network namespace `netns`, handing it its directory at [`SANDBOX_DIR_FD`] and what the
/// provider prepared for it (its disk at [`DISK_FD`], its user namespace at [`USERNS_FD`]).
/// `agent_tag` must already be in the directory's `agent.tag`. The caller puts the agent into
/// its cgroups while it sets the sandbox up (see `SandboxTable::create`), unless `cgroup_tasks`
/// names them: then the child moves itself, first thing, by writing `0` into each of these
/// files (cgroup v1's `tasks`, see `cgroups::self_move_files`; best effort, the caller checks).
pub fn spawn_agent(
    agent_binary: &Path,
    sandbox_dir: &Path,
    agent_tag: &str,
    log_file: &Path,
    netns: BorrowedFd<'_>,
    prepared: Prepared<'_>,
    cgroup_tasks: &[std::path::PathBuf],
) -> Result<SpawnedAgent, AgentSpawnError> {
    let exe = CString::new(agent_binary.as_os_str().as_bytes()).map_err(|_| AgentSpawnError::Nul)?;
    let tasks: Vec<CString> = cgroup_tasks
        .iter()
        .map(|file| CString::new(file.as_os_str().as_bytes()).map_err(|_| AgentSpawnError::Nul))
        .collect::<Result<_, _>>()?;
    let dir_fd = nix::fcntl::open(
        sandbox_dir,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(sys("open the sandbox directory"))?;
    let command = agent_command(agent_tag, prepared, std::env::var("RUST_LOG").ok())?;
    let mut argv: Vec<*const libc::c_char> = command.argv.iter().map(|s| s.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = command.env.iter().map(|s| s.as_ptr()).collect();
    envp.push(std::ptr::null());

    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file)
        .map_err(|source| AgentSpawnError::Io { what: "open envd log", source })?;
    let devnull =
        std::fs::File::open("/dev/null").map_err(|source| AgentSpawnError::Io { what: "open /dev/null", source })?;
    let (sync_r, sync_w) = pipe_cloexec()?;
    let (ready_r, ready_w) = pipe_cloexec()?;
    let (log_fd, null_fd) = (log.as_raw_fd(), devnull.as_raw_fd());
    let (sync_r_fd, sync_w_fd, ready_w_fd) = (sync_r.as_raw_fd(), sync_w.as_raw_fd(), ready_w.as_raw_fd());
    let netns_fd = netns.as_raw_fd();
    let passed = passed_fds(ready_w_fd, prepared, dir_fd.as_raw_fd());

    let pid =
        raw_clone(sandbox_clone_flags()).map_err(sys("clone(CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWUTS|CLONE_NEWIPC)"))?;
    if pid == 0 {
        // Child: async-signal-safe calls only.
        // SAFETY: plain system calls on descriptors and buffers prepared before the clone.
        unsafe {
            libc::close(sync_w_fd);
            // Into the sandbox's cgroups while this process is still one thread (see
            // `cgroups::self_move_files`): everything it does and starts from here on is counted.
            for file in &tasks {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            let mut byte = 0u8;
            if libc::read(sync_r_fd, (&mut byte as *mut u8).cast(), 1) != 1 || byte != b'g' {
                libc::_exit(121);
            }
            if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0 {
                libc::_exit(122);
            }
            libc::setsid();
            let empty: libc::sigset_t = std::mem::zeroed();
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::dup2(null_fd, 0);
            libc::dup2(log_fd, 1);
            libc::dup2(log_fd, 2);
            // Copies above the target numbers first, so no dup2 can clobber another's source.
            let mut high = [-1; 4];
            for (i, (fd, _)) in passed.iter().enumerate() {
                if *fd >= 0 {
                    high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, DUP_FLOOR);
                    if high[i] < 0 {
                        libc::_exit(123);
                    }
                }
            }
            for (i, (_, target)) in passed.iter().enumerate() {
                if high[i] >= 0 && libc::dup2(high[i], *target) != *target {
                    libc::_exit(124);
                }
            }
            // Nothing else crosses into the sandbox: everything past READY_FD is close-on-exec
            // except what was passed on purpose.
            crate::local::fds::mark_inherited_fds_cloexec(READY_FD + 1);
            for (i, (_, target)) in passed.iter().enumerate() {
                if high[i] >= 0 {
                    libc::fcntl(*target, libc::F_SETFD, 0);
                }
            }
            libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(127);
        }
    }
    drop((sync_r, ready_w, log, devnull, dir_fd));
    // SAFETY: sync_w is an open pipe end we own; File takes it over and closes it.
    let mut go = unsafe { std::fs::File::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(sync_w)) };
    if let Err(source) = std::io::Write::write_all(&mut go, b"g") {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(AgentSpawnError::Io { what: "start the sandbox agent", source });
    }
    Ok(SpawnedAgent { pid, ready: ready_r })
}

/// What the hint of every isolation-probe failure says to do.
const PROBE_HINT: &str = "run it as root or with CAP_SYS_ADMIN (in a container: --cap-add SYS_ADMIN and an unconfined \
                          seccomp/AppArmor profile)";

/// Why the isolation probe failed: each a sentence for the operator.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot create {path}: {err}", path = .path.display())]
    Scratch { path: std::path::PathBuf, err: std::io::Error },
    #[error("state directory path contains a NUL byte")]
    NulInStateDir,
    #[error("bad path")]
    BadPath,
    #[error("nul")]
    Nul,
    #[error("{0}")]
    Pipe(AgentSpawnError),
    #[error(
        "sandbox-mcp provider needs permission to create PID/mount/UTS/IPC namespaces, but \
         clone(CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWUTS|CLONE_NEWIPC) failed with {0}; {PROBE_HINT}."
    )]
    Namespaces(nix::Error),
    #[error("sandbox-mcp provider cannot make mounts private in a new mount namespace ({0}); {PROBE_HINT}.")]
    PrivateMounts(nix::Error),
    #[error(
        "sandbox-mcp provider cannot mount an overlay filesystem ({err}): the kernel needs overlayfs, \
         the state directory {state_dir} must be on a filesystem that can be an overlay upper layer (not \
         overlayfs itself), and the provider needs CAP_SYS_ADMIN; {PROBE_HINT}."
    )]
    Overlay { err: nix::Error, state_dir: String },
    #[error("sandbox-mcp provider's isolation probe failed unexpectedly: {0}")]
    Unexpected(String),
}

/// Checks, in a throw-away child, that this process may create the namespaces and the overlay
/// mount sandboxes need. `scratch` is an empty directory on the state filesystem. Returns one
/// clear sentence on failure.
pub fn probe_isolation(scratch: &Path) -> Result<(), ProbeError> {
    let mk = |name: &str| -> Result<CString, ProbeError> {
        let path = scratch.join(name);
        std::fs::create_dir_all(&path).map_err(|err| ProbeError::Scratch { path: path.clone(), err })?;
        CString::new(path.as_os_str().as_bytes()).map_err(|_| ProbeError::NulInStateDir)
    };
    let (upper, work, merged) = (mk("upper")?, mk("work")?, mk("merged")?);
    let opts =
        CString::new(format!("lowerdir=/,upperdir={},workdir={}", upper.to_string_lossy(), work.to_string_lossy()))
            .map_err(|_| ProbeError::BadPath)?;
    let overlay = CString::new("overlay").map_err(|_| ProbeError::Nul)?;
    let root = CString::new("/").map_err(|_| ProbeError::Nul)?;
    let (report_r, report_w) = pipe_cloexec().map_err(ProbeError::Pipe)?;
    let report_fd = report_w.as_raw_fd();

    let flags = sandbox_clone_flags();
    let pid = match raw_clone(flags) {
        Ok(pid) => pid,
        Err(err) => return Err(ProbeError::Namespaces(err)),
    };
    if pid == 0 {
        // SAFETY: async-signal-safe system calls on buffers prepared before the clone.
        unsafe {
            let fail = |step: u8| {
                let errno = *libc::__errno_location();
                let msg = [step, errno as u8];
                libc::write(report_fd, msg.as_ptr().cast(), 2);
                libc::_exit(1);
            };
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                fail(1);
            }
            if libc::mount(overlay.as_ptr(), merged.as_ptr(), overlay.as_ptr(), 0, opts.as_ptr().cast()) != 0 {
                fail(2);
            }
            libc::_exit(0);
        }
    }
    drop(report_w);
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    let mut report = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::fs::File::from(report_r), &mut report);
    let _ = std::fs::remove_dir_all(scratch);
    match (status, report.as_slice()) {
        (Ok(nix::sys::wait::WaitStatus::Exited(_, 0)), _) => Ok(()),
        (_, [step, errno]) => {
            let err = nix::Error::from_raw(i32::from(*errno));
            Err(match step {
                1 => ProbeError::PrivateMounts(err),
                _ => ProbeError::Overlay {
                    err,
                    state_dir: scratch.parent().map(|p| p.display().to_string()).unwrap_or_default(),
                },
            })
        }
        (status, _) => Err(ProbeError::Unexpected(format!("{status:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn strings(list: &[CString]) -> Vec<&str> {
        list.iter().map(|s| s.to_str().unwrap()).collect()
    }

    /// The agent's arguments as envd itself parses them.
    fn parsed(command: &AgentCommand) -> crate::local::EnvdArgs {
        use clap::{Args, FromArgMatches};
        assert_eq!(strings(&command.argv[..2]), ["sandbox-mcp", "envd"]);
        let parser = crate::local::EnvdArgs::augment_args(clap::Command::new("envd").no_binary_name(true));
        let matches = parser.try_get_matches_from(strings(&command.argv[2..])).unwrap();
        crate::local::EnvdArgs::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn the_agent_is_cloned_into_new_pid_mount_uts_and_ipc_namespaces_like_a_fork() {
        let flags = sandbox_clone_flags();
        for (name, flag) in [
            ("CLONE_NEWPID", libc::CLONE_NEWPID),
            ("CLONE_NEWNS", libc::CLONE_NEWNS),
            ("CLONE_NEWUTS", libc::CLONE_NEWUTS),
            ("CLONE_NEWIPC", libc::CLONE_NEWIPC),
        ] {
            assert_ne!(flags & flag, 0, "{name} missing");
        }
        // The network namespace is joined (setns) and the user namespace entered by envd later;
        // nothing is shared with the provider (no thread, no shared memory, descriptors or cwd).
        for (name, flag) in [
            ("CLONE_NEWNET", libc::CLONE_NEWNET),
            ("CLONE_NEWUSER", libc::CLONE_NEWUSER),
            ("CLONE_VM", libc::CLONE_VM),
            ("CLONE_FILES", libc::CLONE_FILES),
            ("CLONE_FS", libc::CLONE_FS),
            ("CLONE_SIGHAND", libc::CLONE_SIGHAND),
            ("CLONE_THREAD", libc::CLONE_THREAD),
        ] {
            assert_eq!(flags & flag, 0, "{name} set");
        }
    }

    #[test]
    fn the_agent_argv_names_its_tag_and_descriptors_but_no_path() {
        let command = agent_command("tag123", Prepared::default(), None).unwrap();
        assert_eq!(
            strings(&command.argv),
            ["sandbox-mcp", "envd", "--agent-tag", "tag123", "--sandbox-dir-fd", "6", "--ready-fd", "3"]
        );
        // Every host user can read an argv: no path at all, the directory comes as a descriptor.
        assert!(command.argv.iter().all(|a| !a.as_bytes().contains(&b'/')), "{:?}", command.argv);
        let args = parsed(&command);
        assert_eq!(args.sandbox_dir, None);
        assert_eq!(args.agent_tag.as_deref(), Some("tag123"));
        assert_eq!((args.sandbox_dir_fd, args.ready_fd), (Some(SANDBOX_DIR_FD), Some(READY_FD)));
        assert_eq!((args.disk_fd, args.userns_fd), (None, None));
        assert!(matches!(agent_command("a\0b", Prepared::default(), None), Err(AgentSpawnError::Nul)));
    }

    #[test]
    fn the_agent_argv_and_its_descriptors_agree_on_what_was_prepared() {
        let (disk, userns) = (std::fs::File::open("/dev/null").unwrap(), std::fs::File::open("/dev/null").unwrap());
        let (ready, dir) = (40, 41);
        for (with_disk, with_userns) in [(false, false), (true, false), (false, true), (true, true)] {
            let prepared =
                Prepared { disk: with_disk.then(|| disk.as_fd()), userns: with_userns.then(|| userns.as_fd()) };
            let args = parsed(&agent_command("t", prepared, None).unwrap());
            let passed = passed_fds(ready, prepared, dir);
            let expect = |on: bool, fd: &std::fs::File| if on { fd.as_raw_fd() } else { -1 };
            assert_eq!(
                passed,
                [
                    (ready, READY_FD),
                    (expect(with_disk, &disk), DISK_FD),
                    (expect(with_userns, &userns), USERNS_FD),
                    (dir, SANDBOX_DIR_FD)
                ]
            );
            // Each descriptor envd is told of is one the child moves to that number.
            for (told, slot) in [(args.ready_fd, 0), (args.disk_fd, 1), (args.userns_fd, 2), (args.sandbox_dir_fd, 3)] {
                let (fd, target) = passed[slot];
                assert_eq!(told, (fd >= 0).then_some(target), "slot {slot} with {with_disk}/{with_userns}");
            }
        }
    }

    #[test]
    fn passed_descriptors_land_above_stdio_and_below_the_dup_floor() {
        let targets: Vec<i32> = passed_fds(40, Prepared::default(), 41).iter().map(|(_, t)| *t).collect();
        let mut unique = targets.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), targets.len(), "two resources share a number: {targets:?}");
        // The child marks everything from READY_FD + 1 close-on-exec, then clears the flag on
        // the targets: so READY_FD must be the lowest, above stdin/stdout/stderr.
        assert_eq!(unique.first(), Some(&READY_FD));
        assert!(unique.iter().all(|t| *t > libc::STDERR_FILENO), "{targets:?}");
        // The high copies (>= DUP_FLOOR) never collide with a target.
        assert!(unique.iter().all(|t| *t < DUP_FLOOR), "{targets:?}");
    }

    #[test]
    fn the_agent_environment_is_path_and_rust_log_only() {
        let path = format!("PATH={}", crate::local::envd::DEFAULT_PATH);
        let bare = agent_command("t", Prepared::default(), None).unwrap();
        assert_eq!(strings(&bare.env), [path.as_str()]);
        let logged = agent_command("t", Prepared::default(), Some("sandbox_mcp=debug".into())).unwrap();
        assert_eq!(strings(&logged.env), [path.as_str(), "RUST_LOG=sandbox_mcp=debug"]);
        assert!(agent_command("t", Prepared::default(), Some("x\0".into())).is_err());
    }
}
