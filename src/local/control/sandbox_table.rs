//! The sandbox table of the local provider and its lifecycle operations:
//! create, kill, pause/resume, timeouts, the deadline reaper, and re-adoption
//! of sandboxes that kept running while the provider was down.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::agent_process;
use super::identity::{self, Liveness, process_is, process_start_time};
use super::ids;
use super::provider_config::LocalProviderConfig;
use super::record::{self, LOG_FILE, RECORD_FILE, SandboxRecord, now_ms, write_json_atomic};
use crate::e2b::EnvdClient;
use crate::e2b::wire::SandboxState;
use crate::local::isolation::cgroups::{self, CgroupLayout, Limits};
use crate::local::isolation::spec::{SOCKET_FILE, SPEC_FILE, SandboxSpec};
use crate::local::net::policy::{EgressPolicy, NetworkConfig};
use crate::local::net::{NetPool, SandboxNet};
use crate::local::store::RunConfig;
use crate::local::template::TemplateRoot;

/// How long a new agent may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed agent may take to disappear.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of the provider's own unary calls into an agent (a template's start command).
const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

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
    #[error("{0}")]
    Internal(String),
}

impl ProviderError {
    pub fn status(&self) -> u16 {
        match self {
            ProviderError::NotFound(_) | ProviderError::TemplateNotFound(_) => 404,
            ProviderError::AlreadyPaused(_) => 409,
            ProviderError::BadRequest(_) => 400,
            ProviderError::TooMany(_) => 429,
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
}

impl SandboxEntry {
    /// A copy of the current record.
    pub fn snapshot(&self) -> SandboxRecord {
        crate::sync::lock(&self.record).clone()
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
    fn take_net(&self) -> Option<SandboxNet> {
        crate::sync::lock(&self.net).take()
    }
    fn update(&self, change: impl FnOnce(&mut SandboxRecord)) -> Result<(), ProviderError> {
        let mut rec = crate::sync::lock(&self.record);
        change(&mut rec);
        write_json_atomic(&self.dir.join(RECORD_FILE), &*rec).map_err(|e| ProviderError::Internal(e.to_string()))
    }
}

/// The metadata key of a template build's step sandbox (its value: the build's id).
pub const BUILD_STEP_METADATA: &str = "sandbox-mcp.build";
/// The template name prefix of a template build's step sandbox.
pub const BUILD_STEP_TEMPLATE_PREFIX: &str = "build:";

/// Whether `rec` is a template build's step sandbox. Builds live in the provider process: one
/// found at start-up belongs to a build that is gone, and is killed rather than re-adopted.
pub fn is_build_step(rec: &SandboxRecord) -> bool {
    rec.template.starts_with(BUILD_STEP_TEMPLATE_PREFIX) && rec.metadata.contains_key(BUILD_STEP_METADATA)
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
    /// Keep the provider's descriptor of the sandbox's disk ([`SandboxEntry::take_kept_disk`]).
    pub keep_disk: bool,
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
            Ok(store) => Some(store),
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
            std::thread::spawn(move || pool.refill());
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

    /// The lower layers of a template, if it exists, and its process configuration (a stored
    /// template's start and ready commands; empty for the others): `local.templates`, `base`,
    /// then the store (by name, template id or alias; read on every create, so imports need no
    /// restart).
    fn template(&self, name: &str) -> Result<Option<(TemplateRoot, RunConfig)>, ProviderError> {
        if let Some(root) = self.cfg.templates.get(name) {
            return Ok(Some((TemplateRoot::directory(root.clone()), RunConfig::default())));
        }
        if name == "base" {
            return Ok(Some((self.base.clone(), RunConfig::default())));
        }
        let Some(store) = &self.store else { return Ok(None) };
        let internal = |e: crate::local::store::StoreError| ProviderError::Internal(format!("template store: {e}"));
        let Some(record) = store.lookup(name).map_err(internal)? else { return Ok(None) };
        Ok(TemplateRoot::stacked(store.lowers(&record).map_err(internal)?).map(|root| (root, record.config)))
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

    /// Creates a sandbox and returns once its agent accepts connections.
    pub async fn create(&self, mut params: CreateParams) -> Result<SandboxRecord, ProviderError> {
        let template_root = match params.root.take() {
            // A build step's sandbox runs no start command (that is the built template's own).
            Some(root) => (root, RunConfig::default()),
            None => self
                .template(&params.template)?
                .ok_or_else(|| ProviderError::TemplateNotFound(params.template.clone()))?,
        };
        let lifetime_ms = self.timeout_ms(params.timeout_secs)?;
        let policy = EgressPolicy::new(&params.network, params.allow_internet_access)
            .map_err(|e| ProviderError::BadRequest(e.to_string()))?;
        {
            let table = self.table();
            let mut pending = crate::sync::lock(&self.pending);
            if table.len() + *pending >= self.cfg.max_sandboxes {
                return Err(ProviderError::TooMany(self.cfg.max_sandboxes));
            }
            *pending += 1;
        }
        let result = self.create_reserved(params, template_root, lifetime_ms, policy).await;
        *crate::sync::lock(&self.pending) -= 1;
        result
    }

    async fn create_reserved(
        &self,
        params: CreateParams,
        template: (TemplateRoot, RunConfig),
        lifetime_ms: i64,
        policy: EgressPolicy,
    ) -> Result<SandboxRecord, ProviderError> {
        let id = ids::new_sandbox_id();
        self.busy_ids().insert(id.clone());
        let result = self.create_in_dir(params, template, lifetime_ms, policy, id.clone()).await;
        self.busy_ids().remove(&id);
        result
    }

    async fn create_in_dir(
        &self,
        params: CreateParams,
        template: (TemplateRoot, RunConfig),
        lifetime_ms: i64,
        policy: EgressPolicy,
        id: String,
    ) -> Result<SandboxRecord, ProviderError> {
        let started = std::time::Instant::now();
        let dir = self.sandboxes_dir.join(&id);
        let internal = |what: &str, e: &dyn std::fmt::Display| ProviderError::Internal(format!("{what}: {e}"));
        for sub in ["", "upper", "work", "root"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| internal("cannot create the sandbox directory", &e))?;
        }
        let (mut disk_image, mut disk_mount) = (None, None);
        if let Some(pool) = self.disks.clone() {
            let image = dir.join("disk.img");
            let taken = match pool.take_ready(&image) {
                Some(taken) => taken,
                None => {
                    let (dest, pool) = (image.clone(), pool.clone());
                    tokio::task::spawn_blocking(move || pool.take(&dest))
                        .await
                        .unwrap_or_else(|e| Err(crate::local::isolation::disk::DiskError::Task(e.to_string())))
                }
            };
            if !pool.refilling() {
                std::thread::spawn(move || pool.refill());
            }
            match taken {
                Ok(mount) => (disk_image, disk_mount) = (Some(image), mount),
                Err(e) => {
                    remove_sandbox_dir(&dir);
                    return Err(internal("cannot prepare the sandbox's disk", &e));
                }
            }
        }
        let (template, run_config) = template;
        let spec = SandboxSpec {
            sandbox_id: id.clone(),
            home_from_template: template.stored,
            template_root: template.root,
            template_layers: template.layers,
            template_lowers: template.lowers,
            id_map: self.cfg.id_map,
            disk_image,
            state_dir: self.cfg.state_dir.clone(),
            env_vars: params.env_vars.clone(),
            allow_internet_access: params.allow_internet_access,
            user_uid: 1000,
            user_gid: 1000,
        };
        if let Err(e) = write_json_atomic(&dir.join(SPEC_FILE), &spec) {
            remove_sandbox_dir(&dir);
            return Err(internal("cannot write the sandbox spec", &e));
        }
        // Before the agent exists, so that every agent can be found by it (see `agent_process`).
        let agent_tag = ids::new_agent_tag();
        if let Err(e) = std::fs::write(dir.join(record::AGENT_TAG_FILE), &agent_tag) {
            remove_sandbox_dir(&dir);
            return Err(internal("cannot write the agent tag", &e));
        }
        let prepared = match self.net.take().await {
            Ok(prepared) => prepared,
            Err(e) => {
                remove_sandbox_dir(&dir);
                return Err(internal("cannot prepare the sandbox's network", &e));
            }
        };
        let userns = match self.userns.take().await {
            Ok(userns) => userns,
            Err(e) => {
                remove_sandbox_dir(&dir);
                return Err(internal("cannot prepare the sandbox's user namespace", &format!("{e:#}")));
            }
        };
        let limits = Limits { memory_limit_mb: self.cfg.memory_limit_mb, pids_limit: self.cfg.pids_limit };
        let cgroup_dirs = self.cgroups.create(&id, limits);
        let spawned = crate::local::isolation::agent_spawn::spawn_agent(
            &self.cfg.agent_binary,
            &dir,
            &agent_tag,
            &dir.join(LOG_FILE),
            std::os::fd::AsFd::as_fd(&prepared.netns),
            crate::local::isolation::agent_spawn::Prepared {
                disk: disk_mount.as_ref().map(std::os::fd::AsFd::as_fd),
                userns: Some(std::os::fd::AsFd::as_fd(&userns)),
            },
        );
        // The agent has its own copies of these descriptors now (or failed to start).
        let kept_disk = if params.keep_disk { disk_mount.as_ref().and_then(|d| d.try_clone().ok()) } else { None };
        if params.keep_disk && disk_mount.is_some() != kept_disk.is_some() {
            tracing::warn!(sandbox = %id, "the sandbox's disk descriptor could not be kept");
        }
        drop((disk_mount, userns));
        let spawned_ms = started.elapsed().as_secs_f64() * 1000.0;
        let agent = match spawned {
            Ok(agent) => agent,
            Err(e) => {
                cgroups::remove(&cgroup_dirs).await;
                remove_sandbox_dir(&dir);
                return Err(internal("cannot start the sandbox", &e));
            }
        };
        let pid = agent.pid;
        let start_time = process_start_time(pid).unwrap_or(0);
        // Into its cgroups while it sets the sandbox up: moving a process between cgroups can wait
        // for an RCU grace period (tens of milliseconds on a busy machine). Nothing of the
        // sandbox's own runs before the create is answered, which waits for both.
        let attach_dirs = cgroup_dirs.clone();
        let attached = tokio::task::spawn_blocking(move || cgroups::attach(&attach_dirs, pid));
        let ready = wait_ready(agent.ready).await;
        if let Err(err) = attached.await {
            tracing::warn!(sandbox = %id, %err, "moving the sandbox agent into its cgroups failed");
        }
        if let Err(message) = ready {
            tracing::warn!(sandbox = %id, error = %message, "sandbox agent failed to start");
            agent_process::kill_and_wait(pid, start_time, KILL_TIMEOUT).await;
            cgroups::remove(&cgroup_dirs).await;
            let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
            remove_sandbox_dir(&dir);
            let detail = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
            return Err(ProviderError::Internal(format!("the sandbox failed to start: {message} {detail}")));
        }
        let now = now_ms();
        let traffic_access_token = (!params.network.allow_public_traffic).then(ids::new_access_token);
        let mut rec = SandboxRecord {
            id: id.clone(),
            template: params.template,
            metadata: params.metadata,
            env_vars: params.env_vars,
            allow_internet_access: params.allow_internet_access,
            network: params.network,
            traffic_access_token,
            started_at_ms: now,
            end_at_ms: now + lifetime_ms,
            state: SandboxState::Running,
            envd_pid: pid,
            envd_start_time: start_time,
            envd_access_token: ids::new_access_token(),
            cgroups: cgroup_dirs,
            pause_method: None,
        };
        let net = match self.net.activate(&id, prepared, policy) {
            Ok(net) => net,
            Err(e) => {
                self.destroy(&rec, &dir).await;
                return Err(internal("cannot serve the sandbox's network", &e));
            }
        };
        // A stored template's start command, and its ready command waited for (egress is on: a
        // start command may download). Not yet in the table, so not listed while it waits.
        if super::template_start::has_commands(&run_config) {
            let timeout = Duration::from_secs(self.cfg.template_ready_timeout_secs);
            let started = match agent_client_at(&dir, &id, AGENT_CALL_TIMEOUT) {
                Ok(client) => super::template_start::start_and_wait(&client, &rec.template, &run_config, timeout)
                    .await
                    .map_err(|e| ProviderError::Internal(e.to_string())),
                Err(e) => Err(e),
            };
            if let Err(err) = started {
                tracing::warn!(sandbox = %id, template = %rec.template, %err, "sandbox not ready; killing it");
                drop(net);
                self.destroy(&rec, &dir).await;
                return Err(err);
            }
            // The lifetime starts when the sandbox is ready.
            rec.started_at_ms = now_ms();
            rec.end_at_ms = rec.started_at_ms + lifetime_ms;
        }
        if let Err(e) = write_json_atomic(&dir.join(RECORD_FILE), &rec) {
            drop(net);
            self.destroy(&rec, &dir).await;
            return Err(internal("cannot write the sandbox record", &e));
        }
        let entry = Arc::new(SandboxEntry::new(dir, rec.clone(), Some(net)));
        *crate::sync::lock(&entry.kept_disk) = kept_disk;
        self.table().insert(id.clone(), entry);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        tracing::info!(sandbox = %id, pid, ms, spawned_ms, "sandbox created");
        Ok(rec)
    }

    /// Kills a sandbox. Returns once its agent got SIGKILL (the kernel then kills every process of
    /// its PID namespace); waiting for the exit, removing the cgroups and the directory continue in
    /// the background (see [`SandboxTable::cleanups_in_flight`]).
    pub async fn kill(&self, id: &str) -> Result<(), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        let _op = entry.op.lock().await;
        if !self.table().get(id).is_some_and(|current| Arc::ptr_eq(current, &entry)) {
            return Err(ProviderError::NotFound(id.to_owned())); // killed meanwhile
        }
        let rec = entry.snapshot();
        // Nothing leaves the table before its agent got the signal: an agent that cannot be
        // signalled now (no descriptor for a pidfd) stays tracked, and the reaper tries again.
        let pidfd = agent_process::try_send_kill(rec.envd_pid, rec.envd_start_time).map_err(|err| {
            tracing::warn!(sandbox = %rec.id, %err, "cannot kill the sandbox now; it stays tracked and is retried");
            ProviderError::Internal(format!("cannot kill sandbox {id} right now ({err}); try again shortly"))
        })?;
        self.busy_ids().insert(rec.id.clone());
        self.table().remove(id);
        drop(entry.take_net());
        if rec.state == SandboxState::Paused && rec.pause_method.as_deref() == Some("freezer") {
            // Frozen tasks die only once thawed.
            let _ = cgroups::set_frozen(&rec.cgroups, false).await;
        }
        let in_flight = self.cleanups.clone();
        *crate::sync::lock(&in_flight) += 1;
        let busy = self.busy.clone();
        let dir = entry.dir.clone();
        tokio::spawn(async move {
            finish_destroy(pidfd, &rec, &dir).await;
            crate::sync::lock(&busy).remove(&rec.id);
            *crate::sync::lock(&in_flight) -= 1;
            tracing::info!(sandbox = %rec.id, "sandbox removed");
        });
        Ok(())
    }

    fn busy_ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        crate::sync::lock(&self.busy)
    }

    /// Number of killed sandboxes whose clean-up is still running.
    pub fn cleanups_in_flight(&self) -> usize {
        *crate::sync::lock(&self.cleanups)
    }

    /// Tears down whatever remains of a sandbox (its agent verified by start time), waiting for it.
    async fn destroy(&self, rec: &SandboxRecord, dir: &Path) {
        let pidfd = agent_process::send_kill(rec.envd_pid, rec.envd_start_time);
        if rec.state == SandboxState::Paused && rec.pause_method.as_deref() == Some("freezer") {
            let _ = cgroups::set_frozen(&rec.cgroups, false).await;
        }
        finish_destroy(pidfd, rec, dir).await;
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
        entry.update(|r| {
            r.state = SandboxState::Running;
            r.pause_method = None;
            if let Some(end) = wanted_end {
                r.end_at_ms = r.end_at_ms.max(end);
            }
        })?;
        Ok((entry.snapshot(), resumed))
    }

    /// Pauses a running sandbox (cgroup freezer, or SIGSTOP to every process without one).
    pub async fn pause(&self, id: &str) -> Result<(), ProviderError> {
        let entry = self.get(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
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

    /// Serves again the network of a sandbox that survived a provider restart. Without it the
    /// sandbox keeps running with no way out (its namespace has no other route).
    async fn readopt_network(&self, rec: &SandboxRecord) -> Option<SandboxNet> {
        let policy = match EgressPolicy::new(&rec.network, rec.allow_internet_access) {
            Ok(policy) => policy,
            Err(err) => {
                tracing::warn!(sandbox = %rec.id, %err, "stored network rules are invalid; egress stays closed");
                return None;
            }
        };
        match self.net.readopt(&rec.id, rec.envd_pid, policy).await {
            Ok(net) => Some(net),
            Err(err) => {
                tracing::warn!(sandbox = %rec.id, %err, "cannot serve the re-adopted sandbox's network");
                None
            }
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

    /// Re-adopts sandboxes left by a previous run; cleans up those whose agent is gone.
    pub async fn adopt_existing(&self) {
        let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            match record::read_json::<SandboxRecord>(&dir.join(RECORD_FILE)) {
                Ok(rec) if rec.id == id => {
                    let alive = process_is(rec.envd_pid, rec.envd_start_time);
                    let healthy = alive
                        && (rec.state == SandboxState::Paused
                            || super::agent_probe::agent_healthy(&dir.join(SOCKET_FILE)).await);
                    if is_build_step(&rec) {
                        tracing::info!(sandbox = %id, "killing a template build's step sandbox left by a previous run");
                        self.destroy(&rec, &dir).await;
                    } else if healthy {
                        let net = self.readopt_network(&rec).await;
                        tracing::info!(sandbox = %id, pid = rec.envd_pid, network = net.is_some(), "re-adopted running sandbox");
                        self.table().insert(id, Arc::new(SandboxEntry::new(dir, rec, net)));
                    } else {
                        tracing::info!(sandbox = %id, alive, "cleaning up sandbox whose agent is gone");
                        self.destroy(&rec, &dir).await;
                    }
                }
                _ => {
                    // No usable record: the previous run died mid-create. Kill whatever runs there.
                    tracing::info!(dir = %dir.display(), "cleaning up a sandbox directory without a record");
                    for pid in agent_process::agents_for_dir(&dir) {
                        if let Some(start) = process_start_time(pid) {
                            agent_process::kill_and_wait(pid, start, KILL_TIMEOUT).await;
                        }
                    }
                    cgroups::remove(&self.cgroups.paths_for(&id)).await;
                    remove_sandbox_dir(&dir);
                }
            }
        }
    }

    /// One pass of the reaper: kills sandboxes past their deadline and cleans up dead agents. An
    /// agent counts as dead only on positive evidence (`/proc/<pid>` absent, a zombie, or a
    /// recycled pid), never because `/proc` could not be read; and nothing is dropped before its
    /// agent got SIGKILL (see [`SandboxTable::kill`]).
    pub async fn reap_once(&self) {
        let now = now_ms();
        for entry in self.all() {
            let rec = entry.snapshot();
            let expired = rec.end_at_ms <= now;
            let liveness = identity::process_liveness(rec.envd_pid, rec.envd_start_time);
            let dead = liveness == Liveness::Gone;
            if liveness == Liveness::Unknown && !expired {
                tracing::debug!(sandbox = %rec.id, "cannot read the agent's /proc entry; checking again later");
                continue;
            }
            if expired || dead {
                if dead {
                    tracing::warn!(sandbox = %rec.id, "sandbox agent died; cleaning up");
                }
                let _ = self.kill(&rec.id).await;
            }
        }
    }

    /// One reconciliation pass between this provider's records, its own state directory and the
    /// live agents: kills any agent started from this state directory whose sandbox is not in the
    /// table, and removes the cgroups and directory of any untracked sandbox directory. Touches
    /// only sandboxes under this provider's `state_dir` (other providers on the machine share the
    /// cgroup parent). Returns how many untracked sandboxes it cleaned up.
    pub async fn reconcile_once(&self) -> usize {
        // Checked live, after finding the agent/directory: a create marks its id busy before it
        // makes the directory or starts the agent, and keeps it busy until the entry is tabled.
        let known = |id: &str| self.get(id).is_some() || self.busy_ids().contains(id);
        let mut cleaned = HashSet::new();
        for (pid, id) in agent_process::agents_under(&self.sandboxes_dir) {
            if known(&id) {
                continue;
            }
            if let Some(start) = process_start_time(pid) {
                tracing::warn!(sandbox = %id, pid, "reconciliation: killing an untracked sandbox agent");
                agent_process::kill_and_wait(pid, start, KILL_TIMEOUT).await;
                cleaned.insert(id);
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.sandboxes_dir) {
            for entry in entries.flatten() {
                let Some(id) = entry.file_name().to_str().map(str::to_owned) else { continue };
                // Re-read: a create may have finished since the snapshot.
                if !ids::is_valid_sandbox_id(&id) || known(&id) {
                    continue;
                }
                tracing::warn!(sandbox = %id, "reconciliation: removing an untracked sandbox directory");
                cgroups::remove(&self.cgroups.paths_for(&id)).await;
                remove_sandbox_dir(&entry.path());
                cleaned.insert(id);
            }
        }
        cleaned.len()
    }

    /// Kills every sandbox and waits (up to 15 s) until their clean-up has finished. For tests and
    /// ephemeral embeddings: a normal shutdown leaves sandboxes running for the next start.
    pub async fn kill_all(&self) {
        let ids: Vec<String> = self.table().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(&id).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while self.cleanups_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// An envd client over the Unix socket of the agent of the sandbox in `dir`.
fn agent_client_at(dir: &Path, id: &str, request_timeout: Duration) -> Result<EnvdClient, ProviderError> {
    EnvdClient::over_unix_socket(&dir.join(SOCKET_FILE), id.to_owned(), request_timeout)
        .map_err(|e| ProviderError::Internal(e.to_string()))
}

/// Waits for a killed agent to be gone, then removes its cgroups and directory.
async fn finish_destroy(pidfd: Option<OwnedFd>, rec: &SandboxRecord, dir: &Path) {
    if !agent_process::wait_gone(pidfd, rec.envd_pid, rec.envd_start_time, KILL_TIMEOUT).await {
        tracing::warn!(sandbox = %rec.id, pid = rec.envd_pid, "sandbox agent did not exit after SIGKILL");
    }
    cgroups::remove(&rec.cgroups).await;
    remove_sandbox_dir(dir);
}

/// Waits for the agent's `ok` on its readiness pipe; any other text is its set-up error.
async fn wait_ready(ready: OwnedFd) -> Result<(), String> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(ready).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(READY_TIMEOUT, async {
        let mut chunk = [0u8; 512];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.starts_with(b"ok\n") || buf.len() > 4096 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&buf).trim().to_owned();
    match (read, text.as_str()) {
        (Err(_), _) => Err(format!("the sandbox agent did not become ready within {} s", READY_TIMEOUT.as_secs())),
        (Ok(()), "ok") => Ok(()),
        (Ok(()), "") => Err("the sandbox agent exited during set-up".to_owned()),
        (Ok(()), msg) => Err(msg.to_owned()),
    }
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
