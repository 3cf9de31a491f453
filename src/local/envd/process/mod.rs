//! The agent's processes: the `process.Process` Connect RPCs (`process_rpc`),
//! starting one process as its user in its own process group (`spawn`, through
//! `clone_exec`: no copy of envd's memory), the
//! table of started processes with their output fan-out (`table`), and the
//! one SIGCHLD reaper that collects every exit status (`reaper`).

#[allow(unsafe_code)] // clone, and the child's system calls; every block has a SAFETY comment
mod clone_exec;
pub(super) mod process_rpc;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub(super) mod reaper;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub(super) mod spawn;
pub(super) mod table;
