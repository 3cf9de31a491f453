//! Starting a sandbox process without copying envd's memory: `clone(CLONE_VM | CLONE_VFORK)`, as
//! glibc's `posix_spawn` does, with the steps `posix_spawn` cannot take (the user switch, the OOM
//! score, the dumpable flag, descriptors marked close-on-exec) done in the child before `execve`.
//! A `fork` copies envd's page tables and the child's `execve` tears that copy down again, which
//! cost about as much CPU as the rest of envd's work per command on these machines.
//!
//! The child shares envd's memory until it execs, so it only makes system calls on data prepared
//! before the clone: no allocation, no lock, and no glibc wrapper that involves other threads (glibc's
//! `setuid` would signal envd's threads: the credentials are changed with raw system calls). Every
//! signal is blocked across the clone, and the child resets its handlers before unblocking them,
//! so no handler of envd's ever runs on the child's stack. Until its exec the child is
//! non-dumpable (it is only for the write of its OOM score), so code in the sandbox cannot read or
//! trace envd's memory or descriptors through the child's `/proc` entries.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

/// `oom_score_adj` of every command envd starts.
pub const COMMAND_OOM_SCORE_ADJ: &[u8] = b"500";
const OOM_SCORE_PATH: &CStr = c"/proc/self/oom_score_adj";

/// The child's stack (it runs a few system calls, and `execve`).
const CHILD_STACK: usize = 64 * 1024;

/// What the child needs, prepared before the clone.
pub struct ExecPlan {
    /// Where to look for the program, in order: the program itself when it names a path, else
    /// `DIR/PROGRAM` for each directory of the child's `PATH` (as `execvp` searches).
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: CString,
    /// `(uid, gid, supplementary groups)` to switch to, when envd runs as root.
    pub user: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)>,
}

/// The candidates for `program` under the colon-separated `path` (empty entries mean the
/// current directory, as in `execvp`).
pub fn candidates(program: &str, path: &str) -> Result<Vec<CString>, std::ffi::NulError> {
    if program.contains('/') {
        return Ok(vec![CString::new(program)?]);
    }
    path.split(':')
        .map(|dir| CString::new(if dir.is_empty() { program.to_owned() } else { format!("{dir}/{program}") }))
        .collect()
}

/// The child's standard descriptors.
pub struct Stdio {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
}

struct ChildArgs<'a> {
    plan: &'a ExecPlan,
    candidates: Vec<*const c_char>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    stdio: [RawFd; 3],
    /// Set by the child to the `errno` of the step that failed before its exec (0: none). The
    /// child shares this memory, and the clone returns only once it has exec'd or exited.
    error: AtomicI32,
}

/// Starts the plan's program with `stdio`, in its own process group; its pid. An error is the
/// child's (`errno` of the step that failed, the child reaped) or the clone's.
pub fn spawn(plan: &ExecPlan, stdio: &Stdio) -> std::io::Result<u32> {
    let nul_terminated = |strings: &[CString]| {
        let mut pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        pointers
    };
    let args = ChildArgs {
        plan,
        candidates: nul_terminated(&plan.candidates),
        argv: nul_terminated(&plan.argv),
        envp: nul_terminated(&plan.envp),
        stdio: [stdio.stdin, stdio.stdout, stdio.stderr],
        error: AtomicI32::new(0),
    };
    // Never read before the child writes it: left uninitialised (no 64 KiB memset per command).
    let mut stack: Vec<std::mem::MaybeUninit<u8>> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down from its (16-byte aligned) end.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    // SAFETY: every signal is blocked across the clone (restored right after); the child runs
    // `child_main` on its own stack with `args`, which outlives it (CLONE_VFORK suspends this
    // thread until the child has exec'd or exited).
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw const args).cast_mut().cast(),
        );
        let clone_error = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    let errno = args.error.load(Ordering::Acquire);
    if errno != 0 {
        let mut status = 0;
        // SAFETY: reaps the child that failed before its exec (the caller holds the reaper's
        // registration lock, so nobody else waits for it).
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    Ok(pid as u32)
}

/// The child: async-signal-safe system calls only, then `execve`. Never returns.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while the parent is suspended.
    let args = unsafe { &*(arg as *const ChildArgs<'_>) };
    // SAFETY: system calls on prepared data; `fail` ends the child.
    unsafe {
        // Handlers of envd's would run on this stack, in envd's memory: back to the defaults
        // (SIGPIPE too, which Rust ignores and an ignored disposition would survive the exec).
        for signal in 1..=libc::SIGRTMAX() {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) == 0
                && (current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN
                    || signal == libc::SIGPIPE)
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        for (target, &source) in args.stdio.iter().enumerate() {
            let target = target as c_int;
            let moved =
                if source == target { libc::fcntl(target, libc::F_SETFD, 0) } else { libc::dup2(source, target) };
            if moved < 0 {
                report_and_exit(args);
            }
        }
        if libc::setpgid(0, 0) != 0 {
            report_and_exit(args);
        }
        // Only stdin, stdout and stderr cross into the command, whatever envd inherited or opened.
        crate::local::fds::mark_inherited_fds_cloexec(3);
        // Commands get a raised OOM score (raising needs no privilege; lowering it back does), so
        // the OOM killer picks them, never envd. envd lost dumpability when it entered the
        // sandbox's user namespace, which leaves /proc/self owned by an unmapped uid; the exec
        // restores it, and the child must be able to write its own oom_score_adj first.
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        let plan = args.plan;
        let oom = libc::open(OOM_SCORE_PATH.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if oom >= 0 {
            libc::write(oom, COMMAND_OOM_SCORE_ADJ.as_ptr().cast(), COMMAND_OOM_SCORE_ADJ.len());
            libc::close(oom);
        }
        // Dumpability belongs to the memory, which is envd's until the exec: back to
        // non-dumpable, so neither envd nor this process can be read or traced through `/proc`
        // by code in the sandbox before the exec (which makes the command dumpable as usual).
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        if let Some((uid, gid, groups)) = &plan.user {
            // Raw system calls: they change this process's credentials alone.
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid) != 0
                || libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid) != 0
            {
                report_and_exit(args);
            }
        }
        // After the user switch, so the user must be able to enter the directory.
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            report_and_exit(args);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // As execvp: the first candidate that runs; else EACCES if one was refused, else the
        // last error.
        let mut refused = false;
        for &path in &args.candidates {
            if path.is_null() {
                break;
            }
            libc::execve(path, args.argv.as_ptr(), args.envp.as_ptr());
            match *libc::__errno_location() {
                libc::EACCES => refused = true,
                libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG | libc::ESTALE => {}
                _ => report_and_exit(args),
            }
        }
        if refused {
            *libc::__errno_location() = libc::EACCES;
        }
        report_and_exit(args)
    }
}

/// Hands `errno` to the parent (through their shared memory) and ends the child.
///
/// # Safety
/// Only in the child, before its exec.
unsafe fn report_and_exit(args: &ChildArgs<'_>) -> ! {
    // SAFETY: reads errno, stores into memory the suspended parent reads after the child exits, _exit.
    unsafe {
        let errno = *libc::__errno_location();
        // A failure always has an errno; EIO stands in should one not.
        args.error.store(if errno == 0 { libc::EIO } else { errno }, Ordering::Release);
        libc::_exit(127)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Runs `argv` through [`spawn`] in `cwd` with `env`; its exit status and stdout.
    fn run(argv: &[&str], env: &[&str], cwd: &str) -> std::io::Result<(i32, String)> {
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let null = std::fs::File::open("/dev/null")?;
        let path = env.iter().find_map(|e| e.strip_prefix("PATH=")).unwrap_or("/usr/bin:/bin");
        let plan = ExecPlan {
            candidates: candidates(argv[0], path).unwrap(),
            argv: argv.iter().map(|a| CString::new(*a).unwrap()).collect(),
            envp: env.iter().map(|e| CString::new(*e).unwrap()).collect(),
            cwd: CString::new(cwd).unwrap(),
            user: None,
        };
        let stdio = Stdio { stdin: null.as_raw_fd(), stdout: out_w.as_raw_fd(), stderr: out_w.as_raw_fd() };
        let pid = spawn(&plan, &stdio)?;
        drop(out_w);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(out_r), &mut out)?;
        let mut status = 0;
        // SAFETY: waits for the child this test started.
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        Ok((libc::WEXITSTATUS(status), out))
    }

    #[test]
    fn a_child_gets_its_argv_env_cwd_and_only_its_three_descriptors() {
        let script = "echo \"$0 $1 $GREETING\"; pwd; ls /proc/self/fd | wc -l; \
            grep -E '^(SigBlk|SigIgn)' /proc/self/status; cat /proc/self/oom_score_adj; \
            test \"$(ps -o pgid= $$ | tr -d ' ')\" = $$ && echo own-group";
        let (code, out) =
            run(&["sh", "-c", script, "zero", "one"], &["GREETING=hi", "PATH=/usr/bin:/bin"], "/tmp").unwrap();
        assert_eq!(code, 0, "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[..2], ["zero one hi", "/tmp"], "{out}");
        // 0, 1, 2 and the directory ls reads.
        assert_eq!(lines[2], "4", "only stdin, stdout and stderr are inherited: {out}");
        // No signal blocked; SIGPIPE, which Rust ignores in this process, back to its default.
        assert_eq!(lines[3], "SigBlk:\t0000000000000000", "{out}");
        let ignored = u64::from_str_radix(lines[4].trim_start_matches("SigIgn:\t"), 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
        assert_eq!(lines[5], "500", "{out}");
        assert_eq!(lines.get(6), Some(&"own-group"), "{out}");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error_of_its_own() {
        let missing = run(&["no-such-program-here"], &["PATH=/usr/bin:/bin"], "/").unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT), "{missing}");
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-executable");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let refused = run(&[script.to_str().unwrap()], &[], "/").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EACCES), "{refused}");
        let bad_cwd = run(&["/bin/true"], &[], "/no/such/dir").unwrap_err();
        assert_eq!(bad_cwd.raw_os_error(), Some(libc::ENOENT), "{bad_cwd}");
        // A refused candidate earlier on PATH does not hide a runnable one later.
        std::fs::write(dir.path().join("true"), "").unwrap();
        let path = format!("PATH={}:/usr/bin:/bin", dir.path().display());
        assert_eq!(run(&["true"], &[&path], "/").unwrap().0, 0);
    }

    #[test]
    fn candidates_follow_execvp() {
        let names = |c: Vec<CString>| c.into_iter().map(|s| s.into_string().unwrap()).collect::<Vec<_>>();
        assert_eq!(names(candidates("/bin/sh", "/a:/b").unwrap()), ["/bin/sh"]);
        assert_eq!(names(candidates("./run", "/a").unwrap()), ["./run"]);
        assert_eq!(names(candidates("sh", "/a::/b").unwrap()), ["/a/sh", "sh", "/b/sh"]);
    }
}
