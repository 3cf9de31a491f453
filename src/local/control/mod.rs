//! The control plane's state: the sandbox table and every sandbox's lifecycle (create, kill,
//! pause/resume, deadlines, re-adoption after a restart, reconciliation), what the provider keeps
//! of each sandbox on disk (`record`), ids and tokens (`ids`), the identity of a recorded agent
//! process (`identity`) and the host-side helpers that find, probe and kill agents
//! (`agent_process`, `agent_probe`, `agent_binary`), a stored template's start command
//! (`template_start`), the provider's settings (`provider_config`) and the state directory's
//! lock (`state_lock`).
//!
//! It sits above `isolation`, `net`, `store` and `template` (it applies them to each sandbox) and
//! below `api` and `build`, which drive it.

pub mod agent_binary;
pub mod agent_probe;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod agent_process;
pub mod identity;
pub mod ids;
pub mod provider_config;
pub mod record;
pub mod sandbox_table;
#[allow(unsafe_code)] // system calls; every block has a SAFETY comment
pub mod state_lock;
pub mod template_start;
