//! The seccomp filter of every sandbox, in the spirit of Docker's default
//! profile: envd installs it on itself (with `no_new_privs`) after building
//! the sandbox, so every process it starts inherits it. Blocked calls fail with
//! `EPERM`; `clone3` fails with `ENOSYS` so that libc falls back to `clone`,
//! whose flags a filter can inspect.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// System calls no sandbox process may make: mounting and namespace games, kernel keyrings
/// (shared across sandboxes), BPF, perf, kernel modules and kexec, swap, reboot, accounting,
/// quotas, clock setting, raw I/O ports, io_uring, userfaultfd, and opening files by handle.
pub const BLOCKED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("setns", libc::SYS_setns),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("syslog", libc::SYS_syslog),
    ("vhangup", libc::SYS_vhangup),
    ("uselib", libc::SYS_uselib),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// Errors of building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
}

fn arch() -> Result<TargetArch, SeccompError> {
    Ok(TargetArch::try_from(std::env::consts::ARCH)?)
}

/// A rule matching calls whose argument `arg` has the `CLONE_NEWUSER` bit set.
fn with_newuser(arg: u8) -> Result<SeccompRule, SeccompError> {
    let flag = libc::CLONE_NEWUSER as u64;
    Ok(SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(flag),
        flag,
    )?])?)
}

/// The two programs: calls failing with `EPERM`, and `clone3` failing with `ENOSYS`.
pub fn programs() -> Result<[BpfProgram; 2], SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BLOCKED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    // New user namespaces from inside (the gateway to every other namespace type).
    rules.insert(libc::SYS_unshare, vec![with_newuser(0)?]);
    rules.insert(libc::SYS_clone, vec![with_newuser(0)?]);
    let eperm = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch()?)?;
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )?;
    Ok([eperm.try_into()?, enosys.try_into()?])
}

/// Sets `no_new_privs` and installs the filter on the calling thread (and so on every process it
/// starts afterwards). Call while single-threaded.
pub fn install() -> Result<(), SeccompError> {
    for program in programs()? {
        seccompiler::apply_filter(&program)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds_for_this_architecture() {
        let [eperm, enosys] = programs().unwrap();
        assert!(eperm.len() > BLOCKED.len() && !enosys.is_empty());
    }
}
