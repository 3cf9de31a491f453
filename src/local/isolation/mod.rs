//! The isolation layers of a sandbox, each applied to every sandbox and each failing closed:
//! the agent's spawn into new PID, mount, UTS and IPC namespaces (`agent_spawn`), the spec the
//! agent builds its sandbox from (`spec`), the in-sandbox set-up it runs as PID 1 before any
//! thread exists (`sandbox_init`: mounts, overlayfs root, `/proc` masks, `pivot_root`, carrying out what
//! `sandbox_plan` decided from the spec), the user
//! namespace (`userns`), the seccomp filter (`seccomp`), cgroups (`cgroups`) and the disk limit
//! (`disk`). The network namespace and egress relays are `local::net`.
//!
//! Nothing here knows the sandbox table: `control` applies these layers, and `run_envd` (in
//! `local`) runs the in-sandbox half.

#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod agent_spawn;
pub mod cgroups;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod disk;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod sandbox_init;
mod sandbox_plan;
pub mod seccomp;
pub mod spec;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod userns;
