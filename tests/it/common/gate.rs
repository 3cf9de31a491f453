//! The skip gate of every test that needs something the machine may lack (root, a python with an
//! SDK, a tool on PATH): it prints one loud `SKIPPED` line and lets the test return, except under
//! `SANDBOX_MCP_NO_SKIP=1` (set by scripts/test.sh and CI), where a would-be skip is a failure.
//!
//! Needs only std and nix: the library's own unit tests include this file too (`#[path]`).
//! Tests use it through the `require_root!` / `require_env!` / `require_command!` macros of
//! `tests/it/common/mod.rs`.

use std::ffi::OsString;

/// The variable that turns a skip into a failure.
pub const NO_SKIP: &str = "SANDBOX_MCP_NO_SKIP";

/// True when skips are failures (`SANDBOX_MCP_NO_SKIP` set to anything but empty or `0`).
pub fn skips_fail() -> bool {
    std::env::var_os(NO_SKIP).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Records a skip of the running test: a loud line on stderr, or a panic under `SANDBOX_MCP_NO_SKIP`.
#[track_caller]
pub fn skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    eprintln!("\n!!!!! SKIPPED {test}: {why}\n");
    assert!(!skips_fail(), "{NO_SKIP} is set (scripts/test.sh): {test} may not skip ({why})");
}

/// True when running as root (the local provider needs namespaces, mounts and cgroups).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// True when root; otherwise records a skip (see [`skip`]) and returns false.
#[track_caller]
pub fn root_or_skip() -> bool {
    if is_root() {
        return true;
    }
    skip("needs root (the local provider uses namespaces, overlayfs and cgroups); run the tests as root");
    false
}

/// The value of `var` when set and not empty; otherwise records a skip saying what to set it to.
#[track_caller]
pub fn env_or_skip(var: &str, what: &str) -> Option<OsString> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(value) => Some(value),
        None => {
            skip(&format!("set {var} to {what} (scripts/test.sh does)"));
            None
        }
    }
}

/// True when `program --version` runs; otherwise records a skip.
#[track_caller]
pub fn command_or_skip(program: &str) -> bool {
    if std::process::Command::new(program).arg("--version").output().is_ok() {
        return true;
    }
    skip(&format!("{program} is not installed (scripts/test.sh installs it)"));
    false
}

/// A condition the test needs; otherwise records a skip with `why`.
#[track_caller]
pub fn or_skip(condition: bool, why: &str) -> bool {
    if !condition {
        skip(why);
    }
    condition
}
