//! Creating a sandbox: the template looked up, the sandbox's directory, disk, spec and agent tag
//! written, its prepared network and user namespaces taken, its agent spawned into its cgroups
//! and waited for, a stored template's start command run, and its record written and tabled.
//! Every failure on the way undoes what was done.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::{
    CreateParams, KILL_TIMEOUT, ProviderError, SandboxEntry, SandboxTable, agent_client_at, remove_sandbox_dir,
};
use crate::e2b::wire::SandboxState;
use crate::local::control::identity::process_start_time;
use crate::local::control::record::{self, LOG_FILE, RECORD_FILE, SandboxRecord, now_ms, write_json_atomic};
use crate::local::control::{agent_process, ids, template_start};
use crate::local::isolation::cgroups::{self, Limits};
use crate::local::isolation::disk::DiskPool;
use crate::local::isolation::sandbox_init::TEMPLATE_REFUSED;
use crate::local::isolation::spec::{SPEC_FILE, SandboxSpec, parse_ready_line};
use crate::local::isolation::userns::UsernsPool;
use crate::local::net::NetPool;
use crate::local::net::policy::EgressPolicy;
use crate::local::store::{Lineage, RunConfig};
use crate::local::template::TemplateRoot;
use crate::logging::escaped;

/// How long a new agent may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of the provider's own unary calls into an agent (a template's start command).
const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl SandboxTable {
    /// Creates a sandbox and returns once its agent accepts connections.
    pub async fn create(&self, mut params: CreateParams) -> Result<SandboxRecord, ProviderError> {
        let template_root = match (params.root.take(), params.resolved.take()) {
            // A build step's sandbox runs no start command (that is the built template's own).
            (Some(root), _) => (root, RunConfig::default(), None),
            (None, Some(resolved)) => (resolved.root, resolved.config, Some(resolved.lineage)),
            (None, None) => {
                let resolved = self
                    .resolve_template(&params.template)?
                    .ok_or_else(|| ProviderError::TemplateNotFound(params.template.clone()))?;
                (resolved.root, resolved.config, Some(resolved.lineage))
            }
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
        template: (TemplateRoot, RunConfig, Option<Lineage>),
        lifetime_ms: i64,
        policy: EgressPolicy,
    ) -> Result<SandboxRecord, ProviderError> {
        let id = ids::new_sandbox_id();
        self.busy_ids().insert(id.clone());
        let result = self.create_in_dir(params, template, lifetime_ms, policy, id.clone()).await;
        self.busy_ids().remove(&id);
        self.refill_pools_after_answer();
        result
    }

    /// [`refill_pools`](Self::refill_pools) [`REFILL_DELAY`] from now, once the create's answer is
    /// out: started as the create returns, the refills' first `clone`s and `mkfs.ext4` held its
    /// answer back by 2-3 ms.
    fn refill_pools_after_answer(&self) {
        let (disks, net, userns) = (self.disks.clone(), self.net.clone(), self.userns.clone());
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_DELAY).await;
            refill(disks, &net, &userns);
        });
    }

    /// Tops up the disk, network and user namespace pools in the background now. A create does
    /// so once it is done (see [`refill_pools_after_answer`](Self::refill_pools_after_answer)),
    /// before a template's start command, or when a pool was empty; not when it takes from them:
    /// a refill (`mkfs.ext4` and its `fsync`, new namespaces) competes for the CPU, the disk and
    /// the kernel's locks with the create it would run beside.
    fn refill_pools(&self) {
        refill(self.disks.clone(), &self.net, &self.userns);
    }

    async fn create_in_dir(
        &self,
        params: CreateParams,
        template: (TemplateRoot, RunConfig, Option<Lineage>),
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
                    // The pool ran dry: refill it beside this create, which makes its own (the
                    // other pools refill themselves when a take finds them empty).
                    refill_disks(pool.clone());
                    let (dest, pool) = (image.clone(), pool.clone());
                    tokio::task::spawn_blocking(move || pool.take(&dest))
                        .await
                        .unwrap_or_else(|e| Err(crate::local::isolation::disk::DiskError::Task(e.to_string())))
                }
            };
            match taken {
                Ok(mount) => (disk_image, disk_mount) = (Some(image), mount),
                Err(e) => {
                    remove_sandbox_dir(&dir);
                    return Err(internal("cannot prepare the sandbox's disk", &e));
                }
            }
        }
        let (template, run_config, lineage) = template;
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
        // On cgroup v1 the agent moves itself into them before it execs (see
        // `cgroups::self_move_files`): no global lock, no RCU grace period on the create path.
        let self_move = cgroups::self_move_files(&cgroup_dirs);
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
            &self_move,
        );
        // The agent has its own copies of these descriptors now (or failed to start).
        // Every sandbox's: a snapshot reads the upper layer through it while the sandbox runs.
        let kept_disk = disk_mount.as_ref().and_then(|d| d.try_clone().ok());
        if disk_mount.is_some() != kept_disk.is_some() {
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
        // Without a self-move (cgroup v2), into its cgroups while it sets the sandbox up: moving
        // another process between cgroups can wait for an RCU grace period (tens of milliseconds
        // on a busy machine). Nothing of the sandbox's own runs before the create is answered,
        // which waits for both, and for the check that a self-move happened.
        let attach = |dirs: Vec<std::path::PathBuf>| tokio::task::spawn_blocking(move || cgroups::attach(&dirs, pid));
        let attached = self_move.is_empty().then(|| attach(cgroup_dirs.clone()));
        let ready = wait_ready(agent.ready).await;
        let ready_ms = started.elapsed().as_secs_f64() * 1000.0;
        let moved = match attached {
            Some(attached) => attached.await,
            None if ready.is_ok() && !cgroups::is_member(pid, &cgroup_dirs) => {
                tracing::warn!(sandbox = %id, "the sandbox agent is not in its cgroups; moving it");
                attach(cgroup_dirs.clone()).await
            }
            None => Ok(()),
        };
        if let Err(err) = moved {
            tracing::warn!(sandbox = %id, %err, "moving the sandbox agent into its cgroups failed");
        }
        let agent_data_fd = match ready {
            Ok(data_fd) => data_fd,
            Err(message) => {
                tracing::warn!(sandbox = %id, error = %escaped(&message), "sandbox agent failed to start");
                agent_process::kill_and_wait(pid, start_time, KILL_TIMEOUT).await;
                cgroups::remove(&cgroup_dirs).await;
                let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
                remove_sandbox_dir(&dir);
                // An image the set-up cannot be made in (its mount points symlinks): the caller's to fix.
                if let ReadyError::SetUp(text) = &message
                    && let Some(why) = text.strip_prefix(TEMPLATE_REFUSED)
                {
                    let template = &params.template;
                    return Err(ProviderError::BadRequest(format!(
                        "template '{template}' cannot start a sandbox: {why}"
                    )));
                }
                let detail = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
                return Err(ProviderError::Internal(format!("the sandbox failed to start: {message} {detail}")));
            }
        };
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
            build_step_of: params.build_step_of,
            template_config: lineage.is_some().then(|| run_config.clone()),
            agent_data_fd,
            lineage,
            lifecycle: params.lifecycle,
            timed_out: false,
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
        if template_start::has_commands(&run_config) {
            // A start command may take long: the pools are not kept waiting for it.
            self.refill_pools();
            let timeout = Duration::from_secs(self.cfg.template_ready_timeout_secs);
            let started = match agent_client_at(&dir, &id, AGENT_CALL_TIMEOUT) {
                Ok(client) => template_start::start_and_wait(&client, &rec.template, &run_config, timeout)
                    .await
                    .map_err(|e| ProviderError::Internal(e.to_string())),
                Err(e) => Err(e),
            };
            if let Err(err) = started {
                tracing::warn!(sandbox = %id, template = %escaped(&rec.template), err = %escaped(&err), "sandbox not ready; killing it");
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
        tracing::info!(sandbox = %id, pid, ms, spawned_ms, ready_ms, "sandbox created");
        Ok(rec)
    }
}

/// How long after a create returns the pools start their refill (see
/// `SandboxTable::refill_pools_after_answer`).
const REFILL_DELAY: Duration = Duration::from_millis(10);

/// Starts the refills of the disk, network and user namespace pools (each a no-op when full or
/// already refilling).
fn refill(disks: Option<Arc<DiskPool>>, net: &Arc<NetPool>, userns: &Arc<UsernsPool>) {
    if let Some(pool) = disks {
        refill_disks(pool);
    }
    net.refill();
    userns.refill();
}

/// Starts the disk pool's refill on a thread of its own (`DiskPool::refill` blocks), unless one
/// runs already.
pub(super) fn refill_disks(pool: Arc<DiskPool>) {
    if !pool.refilling() {
        std::thread::spawn(move || pool.refill());
    }
}

/// Why a new agent did not report ready.
#[derive(Debug, thiserror::Error)]
enum ReadyError {
    #[error("{0}")]
    Pipe(std::io::Error),
    #[error("the sandbox agent did not become ready within {secs} s")]
    Timeout { secs: u64 },
    #[error("the sandbox agent exited during set-up")]
    ExitedDuringSetUp,
    /// What the agent wrote on its readiness pipe instead of `ok`: its set-up error.
    #[error("{0}")]
    SetUp(String),
}

/// Waits for the agent's readiness line (`ok`, with the number of the descriptor at which it keeps
/// the sandbox's data directory: see `spec::ready_line`); any other text is its set-up error.
async fn wait_ready(ready: OwnedFd) -> Result<Option<i32>, ReadyError> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(ready).map_err(ReadyError::Pipe)?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(READY_TIMEOUT, async {
        let mut chunk = [0u8; 512];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if (buf.starts_with(b"ok") && buf.contains(&b'\n')) || buf.len() > 4096 {
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
        (Err(_), _) => Err(ReadyError::Timeout { secs: READY_TIMEOUT.as_secs() }),
        (Ok(()), "") => Err(ReadyError::ExitedDuringSetUp),
        (Ok(()), msg) => parse_ready_line(msg).ok_or_else(|| ReadyError::SetUp(msg.to_owned())),
    }
}
