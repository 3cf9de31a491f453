//! Descriptor hygiene shared by the sandbox launcher and envd's process spawner: nothing a
//! parent holds crosses an `exec` into a sandbox or a sandboxed command.

/// Marks every descriptor from `first` up close-on-exec, so nothing the provider inherited or
/// opened crosses into a sandbox (`close_range(CLOSE_RANGE_CLOEXEC)`, Linux >= 5.11; older
/// kernels: `fcntl` over the descriptor range). Async-signal-safe: for use between fork and exec.
pub fn mark_inherited_fds_cloexec(first: i32) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: plain system calls on integers.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as i32
        } else {
            1 << 16
        };
        for fd in first..max {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}
