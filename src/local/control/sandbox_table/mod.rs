//! The sandbox table of the local provider ([`SandboxTable`]): its sandboxes by id, the
//! settings, templates and pools a create draws on, and the operations on one live sandbox
//! (timeouts, connect, pause/resume, network rules). Creating a sandbox is `create`; killing
//! one, the deadline reaper, re-adoption after a restart and reconciliation are `teardown`.

mod create;
mod resolve;
mod snapshot;
mod teardown;

pub use resolve::ResolvedTemplate;
pub use snapshot::{FORK_CARRIES, META_FORK_CARRIES, META_FORK_PARENT};

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::agent_process;
use super::provider_config::LocalProviderConfig;
use super::record::{RECORD_FILE, SandboxRecord, now_ms, write_json_atomic};
use crate::e2b::EnvdClient;
use crate::e2b::wire::SandboxState;
use crate::local::isolation::cgroups::{self, CgroupLayout};
use crate::local::isolation::spec::SOCKET_FILE;
use crate::local::net::policy::{EgressPolicy, NetworkConfig};
use crate::local::net::{NetPool, SandboxNet};
use crate::local::template::TemplateRoot;

/// How long a killed agent may take to disappear.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of provider operations, each with the HTTP status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    #[error("sandbox {0} is already paused")]
    AlreadyPaused(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the provider already runs its maximum of {0} sandboxes; kill one first")]
    TooMany(usize),
    /// A quota other than the sandbox count (snapshots, the template store's size).
    #[error("{0}")]
    Quota(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
}

impl ProviderError {
    pub fn status(&self) -> u16 {
        match self {
            ProviderError::NotFound(_) | ProviderError::TemplateNotFound(_) => 404,
            ProviderError::AlreadyPaused(_) => 409,
            ProviderError::BadRequest(_) => 400,
            ProviderError::TooMany(_) | ProviderError::Quota(_) => 429,
            ProviderError::Conflict(_) => 409,
            ProviderError::Internal(_) => 500,
        }
    }
}

/// One sandbox: its directory, its record, and a lock serialising state changes.
pub struct SandboxEntry {
    pub dir: PathBuf,
    record: Mutex<SandboxRecord>,
    op: tokio::sync::Mutex<()>,
    /// The sandbox's network; taken (and so torn down) when the sandbox is killed.
    net: Mutex<Option<SandboxNet>>,
    /// The provider's own descriptor of the sandbox's disk, kept when the create asked for it
    /// (a template build reads the overlay's upper layer through it once the sandbox stopped).
    kept_disk: Mutex<Option<OwnedFd>>,
    /// A template build's step sandbox ([`is_build_step`]): its build's own, hidden from the
    /// sandbox API ([`SandboxTable::get_public`]).
    build_step: bool,
}

impl SandboxEntry {
    /// A copy of the current record.
    pub fn snapshot(&self) -> SandboxRecord {
        crate::sync::lock(&self.record).clone()
    }
    /// What `read` takes from the current record, without copying the rest (the data plane
    /// reads a few fields per request; a copy is dozens of allocations).
    pub fn read<T>(&self, read: impl FnOnce(&SandboxRecord) -> T) -> T {
        read(&crate::sync::lock(&self.record))
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join(SOCKET_FILE)
    }
    /// A descriptor of the sandbox's network namespace (for inbound connections).
    pub fn netns(&self) -> Option<OwnedFd> {
        let net = crate::sync::lock(&self.net);
        net.as_ref().and_then(|n| n.netns.try_clone().ok())
    }
    fn new(dir: PathBuf, rec: SandboxRecord, net: Option<SandboxNet>) -> SandboxEntry {
        SandboxEntry {
            dir,
            build_step: is_build_step(&rec),
            record: Mutex::new(rec),
            op: tokio::sync::Mutex::new(()),
            net: Mutex::new(net),
            kept_disk: Mutex::new(None),
        }
    }
    /// The sandbox's disk (a detached ext4 mount) when the create kept it: the directory that
    /// holds its `upper` layer. `None` without a disk limit: the layers are in [`SandboxEntry::dir`].
    pub fn take_kept_disk(&self) -> Option<OwnedFd> {
        crate::sync::lock(&self.kept_disk).take()
    }
    /// A copy of the sandbox's disk descriptor ([`SandboxEntry::take_kept_disk`]), for a snapshot
    /// of the running sandbox. `None` without a disk limit, and for a sandbox re-adopted after a
    /// provider restart (the descriptor did not survive it).
    pub fn kept_disk(&self) -> Option<OwnedFd> {
        crate::sync::lock(&self.kept_disk).as_ref().and_then(|fd| fd.try_clone().ok())
    }
    fn take_net(&self) -> Option<SandboxNet> {
        crate::sync::lock(&self.net).take()
    }
    fn update(&self, change: impl FnOnce(&mut SandboxRecord)) -> Result<(), ProviderError> {
        let mut rec = crate::sync::lock(&self.record);
        change(&mut rec);
        write_json_atomic(&self.dir.join(RECORD_FILE), &*rec).map_err(|e| ProviderError::Internal(e.to_string()))
    }
}

/// Whether `rec` is a template build's step sandbox (its record names the build, which only the
/// build's own create sets). Builds live in the provider process: one found at start-up belongs
/// to a build that is gone, and is killed rather than re-adopted.
pub fn is_build_step(rec: &SandboxRecord) -> bool {
    rec.build_step_of.is_some()
}

/// Parameters of a new sandbox (validated by the HTTP layer).
#[derive(Debug, Clone, Default)]
pub struct CreateParams {
    pub template: String,
    pub timeout_secs: Option<u64>,
    pub metadata: HashMap<String, String>,
    pub env_vars: HashMap<String, String>,
    pub allow_internet_access: bool,
    /// Egress rules and inbound access (validated by the HTTP layer with [`EgressPolicy::new`]).
    pub network: NetworkConfig,
    /// The layers to stack instead of looking `template` up (a template build's step sandbox).
    pub root: Option<TemplateRoot>,
    /// The template already resolved (a fork's snapshot, stacked without a template record).
    pub resolved: Option<ResolvedTemplate>,
    /// What happens at the deadline (`autoPause`, `autoResume`).
    pub lifecycle: super::record::Lifecycle,
    /// The build whose step this sandbox runs ([`is_build_step`]); never set from the API.
    pub build_step_of: Option<String>,
}

/// The sandbox table: the provider's shared state (settings, templates, pools) and its
/// sandboxes by id.
pub struct SandboxTable {
    pub cfg: LocalProviderConfig,
    /// The `base` template root built from the host's allow-list.
    base: TemplateRoot,
    /// Imported and pulled templates (`sandbox-mcp template`); `None` when it cannot be opened.
    store: Option<crate::local::store::Store>,
    /// Ready disk images when the disk limit is on.
    disks: Option<Arc<crate::local::isolation::disk::DiskPool>>,
    sandboxes_dir: PathBuf,
    cgroups: CgroupLayout,
    net: Arc<NetPool>,
    /// User namespaces made ahead of time.
    userns: Arc<crate::local::isolation::userns::UsernsPool>,
    table: Mutex<HashMap<String, Arc<SandboxEntry>>>,
    /// Creates in flight (counted against `max_sandboxes`).
    pending: Mutex<usize>,
    /// Background clean-ups of killed sandboxes still running.
    cleanups: Arc<Mutex<usize>>,
    /// Ids whose directory is being created or cleaned up (reconciliation leaves them alone).
    busy: Arc<Mutex<HashSet<String>>>,
}

impl SandboxTable {
    /// Prepares the state directory and cgroups (the caller has run the isolation probe).
    pub fn new(mut cfg: LocalProviderConfig) -> anyhow::Result<SandboxTable> {
        cfg.agent_binary = super::agent_binary::choose(&cfg.agent_binary);
        let sandboxes_dir = cfg.state_dir.join("sandboxes");
        std::fs::create_dir_all(&sandboxes_dir)
            .map_err(|e| anyhow::anyhow!("cannot create the state directory {}: {e}", sandboxes_dir.display()))?;
        // Sandbox records hold access tokens and env vars; layers hold the sandboxes' files.
        std::fs::set_permissions(&sandboxes_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| anyhow::anyhow!("cannot restrict {}: {e}", sandboxes_dir.display()))?;
        for (name, root) in &cfg.templates {
            if !root.join("etc").is_dir() {
                anyhow::bail!(
                    "template {name:?} in local.templates: {} is not a root filesystem directory (it has no etc/); \
                     make one with e.g. `docker export` or `mmdebstrap`",
                    root.display()
                );
            }
        }
        let base = match cfg.templates.get("base") {
            Some(root) => TemplateRoot::directory(root.clone()),
            None => crate::local::template::build_base(&cfg.state_dir, Path::new("/"))?,
        };
        let store = match crate::local::store::Store::open(&cfg.state_dir, cfg.template_store_limit_mb) {
            // A configured directory template's name is its own: no build, import or pull takes it.
            Ok(store) => {
                for name in cfg.templates.keys() {
                    if store.layout.read_record(name).ok().flatten().is_some() {
                        tracing::warn!(template = %name, "a stored template has a configured directory template's name; \
                            creates of that name start the directory template (rename or remove one of them)");
                    }
                }
                Some(store.reserving(cfg.templates.keys().cloned()))
            }
            Err(err) => {
                tracing::warn!(%err, "the template store cannot be opened: only base and local.templates are served");
                None
            }
        };
        let disks = match cfg.disk_limit_mb {
            Some(mb) => match crate::local::isolation::disk::DiskPool::new(&cfg.state_dir, mb, cfg.id_map.host(0)) {
                Ok(pool) => Some(Arc::new(pool)),
                Err(err) => {
                    tracing::warn!(
                        %err,
                        "sandboxes run WITHOUT a disk limit: it needs mkfs.ext4 (e2fsprogs) and loop devices; \
                         set local.disk_limit_mb = 0 to run without one knowingly"
                    );
                    None
                }
            },
            None => None,
        };
        let disks = match disks {
            Some(pool) => match std::fs::OpenOptions::new().read(true).write(true).open("/dev/loop-control") {
                Ok(_) => Some(pool),
                Err(err) => {
                    tracing::warn!(
                        %err,
                        "sandboxes run WITHOUT a disk limit: /dev/loop-control cannot be opened (in a container: \
                         --privileged, or --device /dev/loop-control and the /dev/loopN devices); set \
                         local.disk_limit_mb = 0 to run without one knowingly"
                    );
                    None
                }
            },
            None => None,
        };
        if let Some(pool) = disks.clone() {
            create::refill_disks(pool);
        }
        let cgroups = CgroupLayout::detect();
        tracing::info!(?cgroups, state_dir = %cfg.state_dir.display(), "local provider state");
        let net = NetPool::new(cfg.network.clone());
        let userns = crate::local::isolation::userns::UsernsPool::new(cfg.id_map);
        Ok(SandboxTable {
            cfg,
            base,
            store,
            disks,
            sandboxes_dir,
            cgroups,
            net,
            userns,
            table: Mutex::new(HashMap::new()),
            pending: Mutex::new(0),
            cleanups: Arc::new(Mutex::new(0)),
            busy: Arc::new(Mutex::new(HashSet::new())),
        })
    }

    /// The `base` template's root (for `GET /templates`).
    pub fn base_template(&self) -> &TemplateRoot {
        &self.base
    }

    /// The template store, when it could be opened.
    pub fn template_store(&self) -> Option<&crate::local::store::Store> {
        self.store.as_ref()
    }

    /// The per-sandbox disk limit in bytes, when enforced.
    pub fn disk_limit_bytes(&self) -> Option<u64> {
        self.disks.as_ref().map(|pool| pool.size_bytes())
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SandboxEntry>>> {
        crate::sync::lock(&self.table)
    }

    pub fn get(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        self.table().get(id).cloned()
    }

    /// Sandbox `id` as the sandbox API sees it: a template build's step sandbox belongs to its
    /// build and is not found (listed, connected to, paused, timed or killed) through the API.
    pub fn get_public(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        self.get(id).filter(|entry| !entry.build_step)
    }

    /// Every live sandbox the sandbox API sees (all but build steps, see [`Self::get_public`]).
    pub fn all_public(&self) -> Vec<Arc<SandboxEntry>> {
        self.table().values().filter(|entry| !entry.build_step).cloned().collect()
    }

    /// An envd client that reaches sandbox `id`'s agent over its Unix socket, for the provider's
    /// own calls into a sandbox (template builds, a template's start command).
    pub fn agent_client(&self, id: &str, request_timeout: Duration) -> Result<EnvdClient, ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        agent_client_at(&entry.dir, id, request_timeout)
    }

    /// Every live sandbox.
    pub fn all(&self) -> Vec<Arc<SandboxEntry>> {
        self.table().values().cloned().collect()
    }

    fn timeout_ms(&self, secs: Option<u64>) -> Result<i64, ProviderError> {
        let secs = secs.unwrap_or(self.cfg.default_timeout_secs);
        if secs > self.cfg.max_timeout_secs {
            return Err(ProviderError::BadRequest(format!(
                "timeout {secs} s exceeds the maximum of {} s",
                self.cfg.max_timeout_secs
            )));
        }
        Ok(secs as i64 * 1000)
    }

    fn busy_ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        crate::sync::lock(&self.busy)
    }

    /// Number of killed sandboxes whose clean-up is still running.
    pub fn cleanups_in_flight(&self) -> usize {
        *crate::sync::lock(&self.cleanups)
    }

    /// Sets the deadline to now + `timeout_secs`.
    pub fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<(), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        let end = now_ms() + self.timeout_ms(Some(timeout_secs))?;
        entry.update(|rec| rec.end_at_ms = end)
    }

    /// Connects: resumes a paused sandbox (returns true) and extends the deadline to at least now + timeout.
    pub async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<(SandboxRecord, bool), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        let _op = entry.op.lock().await;
        let rec = entry.snapshot();
        let resumed = rec.state == SandboxState::Paused;
        if resumed {
            self.thaw(&rec).await?;
        }
        let wanted_end = match timeout_secs {
            Some(secs) => Some(now_ms() + self.timeout_ms(Some(secs))?),
            None if resumed => Some(now_ms() + self.timeout_ms(None)?),
            None => None,
        };
        // A sandbox paused at its deadline has its retention as deadline: resumed, it gets a
        // lifetime again, not the rest of its retention.
        let timed_out = rec.timed_out && resumed;
        entry.update(|r| {
            r.state = SandboxState::Running;
            r.pause_method = None;
            r.timed_out = false;
            if let Some(end) = wanted_end {
                r.end_at_ms = if timed_out { end } else { r.end_at_ms.max(end) };
            }
        })?;
        Ok((entry.snapshot(), resumed))
    }

    /// Pauses a running sandbox (cgroup freezer, or SIGSTOP to every process without one).
    pub async fn pause(&self, id: &str) -> Result<(), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        self.pause_entry(&entry).await
    }

    async fn pause_entry(&self, entry: &SandboxEntry) -> Result<(), ProviderError> {
        let id = entry.snapshot().id;
        let id = id.as_str();
        let _op = entry.op.lock().await;
        let rec = entry.snapshot();
        if rec.state == SandboxState::Paused {
            return Err(ProviderError::AlreadyPaused(id.to_owned()));
        }
        let method = match cgroups::set_frozen(&rec.cgroups, true).await {
            Ok(true) => "freezer",
            Ok(false) => {
                agent_process::signal_namespace(rec.envd_pid, nix::sys::signal::Signal::SIGSTOP);
                "sigstop"
            }
            Err(e) => return Err(ProviderError::Internal(format!("cannot freeze the sandbox: {e}"))),
        };
        entry.update(|r| {
            r.state = SandboxState::Paused;
            r.pause_method = Some(method.to_owned());
        })
    }

    async fn thaw(&self, rec: &SandboxRecord) -> Result<(), ProviderError> {
        match rec.pause_method.as_deref() {
            Some("sigstop") => {
                agent_process::signal_namespace(rec.envd_pid, nix::sys::signal::Signal::SIGCONT);
                Ok(())
            }
            _ => cgroups::set_frozen(&rec.cgroups, false)
                .await
                .map(|_| ())
                .map_err(|e| ProviderError::Internal(format!("cannot thaw the sandbox: {e}"))),
        }
    }

    /// Replaces a running sandbox's egress rules (`PUT /sandboxes/{id}/network`): fields left out
    /// are cleared, as E2B does; `allowPublicTraffic` is kept.
    pub async fn update_network(
        &self,
        id: &str,
        allow_out: Vec<String>,
        deny_out: Vec<String>,
        allow_internet_access: Option<bool>,
    ) -> Result<(), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        let _op = entry.op.lock().await;
        let current = entry.snapshot();
        let network = NetworkConfig { allow_out, deny_out, ..current.network.clone() };
        let internet = allow_internet_access.unwrap_or(true);
        let policy = EgressPolicy::new(&network, internet).map_err(|e| ProviderError::BadRequest(e.to_string()))?;
        // Applied first: if the namespace refuses them, the stored rules stay those in force.
        let cannot_apply =
            |err| ProviderError::Internal(format!("cannot apply the network rules in the sandbox's namespace: {err}"));
        let update = crate::sync::lock(&entry.net).as_ref().map(|net| net.policy_update());
        if let Some(update) = update {
            update.map_err(cannot_apply)?.apply(policy).await.map_err(cannot_apply)?;
        }
        entry.update(|rec| {
            rec.network = network;
            rec.allow_internet_access = internet;
        })?;
        Ok(())
    }

    /// Starts filling the pools of prepared network and user namespaces.
    pub fn warm_network_pool(&self) {
        self.net.refill();
        self.userns.refill();
    }
}

/// An envd client over the Unix socket of the agent of the sandbox in `dir`.
fn agent_client_at(dir: &Path, id: &str, request_timeout: Duration) -> Result<EnvdClient, ProviderError> {
    EnvdClient::over_unix_socket(&dir.join(SOCKET_FILE), id.to_owned(), request_timeout)
        .map_err(|e| ProviderError::Internal(e.to_string()))
}

/// Removes a sandbox directory, first detaching anything still mounted under it on the host.
fn remove_sandbox_dir(dir: &Path) {
    for mount_point in agent_process::host_mounts_under(dir).into_iter().rev() {
        tracing::warn!(%mount_point, "detaching a leftover mount");
        let _ = nix::mount::umount2(mount_point.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
    if let Err(err) = std::fs::remove_dir_all(dir)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(%err, dir = %dir.display(), "cannot remove sandbox directory");
    }
}
