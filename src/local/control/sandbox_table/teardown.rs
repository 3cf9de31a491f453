//! Ending sandboxes, and what a previous run left: a kill (the agent signalled at once, its
//! clean-up in the background), the deadline reaper, re-adoption at start of the sandboxes that
//! kept running while the provider was down (their network served again), and the periodic
//! reconciliation that removes untracked agents and directories.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{KILL_TIMEOUT, ProviderError, SandboxEntry, SandboxTable, is_build_step, remove_sandbox_dir};
use crate::e2b::wire::SandboxState;
use crate::local::control::identity::{self, Liveness, process_is, process_start_time};
use crate::local::control::record::{self, RECORD_FILE, SandboxRecord, now_ms};
use crate::local::control::{agent_probe, agent_process, ids};
use crate::local::isolation::cgroups;
use crate::local::isolation::spec::SOCKET_FILE;
use crate::local::net::SandboxNet;
use crate::local::net::policy::EgressPolicy;

impl SandboxTable {
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

    /// Tears down whatever remains of a sandbox (its agent verified by start time), waiting for it.
    pub(super) async fn destroy(&self, rec: &SandboxRecord, dir: &Path) {
        let pidfd = agent_process::send_kill(rec.envd_pid, rec.envd_start_time);
        if rec.state == SandboxState::Paused && rec.pause_method.as_deref() == Some("freezer") {
            let _ = cgroups::set_frozen(&rec.cgroups, false).await;
        }
        finish_destroy(pidfd, rec, dir).await;
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
                    if alive && rec.state == SandboxState::Running && !is_build_step(&rec) {
                        // A provider killed during a snapshot left it frozen: thawed before its
                        // agent is asked whether it is healthy.
                        let _ = cgroups::set_frozen(&rec.cgroups, false).await;
                    }
                    let healthy = alive
                        && (rec.state == SandboxState::Paused
                            || agent_probe::agent_healthy(&dir.join(SOCKET_FILE)).await);
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
            if expired && !dead && rec.lifecycle.on_timeout_pause && !rec.timed_out {
                self.pause_at_deadline(&entry).await;
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

    /// `lifecycle.on_timeout = "pause"`: at its deadline the sandbox is paused instead of killed,
    /// and kept `local.paused_retention_secs` (its new deadline; `connect` resumes it).
    async fn pause_at_deadline(&self, entry: &Arc<SandboxEntry>) {
        let id = entry.snapshot().id;
        if let Err(err) = self.pause_entry(entry).await
            && !matches!(err, ProviderError::AlreadyPaused(_))
        {
            tracing::warn!(sandbox = %id, %err, "cannot pause the sandbox at its deadline; killing it");
            let _ = self.kill(&id).await;
            return;
        }
        let retention_ms =
            i64::try_from(self.cfg.paused_retention_secs.max(1).saturating_mul(1000)).unwrap_or(i64::MAX);
        let until = now_ms().saturating_add(retention_ms);
        if let Err(err) = entry.update(|r| {
            r.timed_out = true;
            r.end_at_ms = until;
        }) {
            tracing::warn!(sandbox = %id, %err, "cannot record the pause at the deadline");
        }
        tracing::info!(sandbox = %id, retention_secs = self.cfg.paused_retention_secs, "sandbox paused at its deadline");
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

/// Waits for a killed agent to be gone, then removes its cgroups and directory.
async fn finish_destroy(pidfd: Option<OwnedFd>, rec: &SandboxRecord, dir: &Path) {
    if !agent_process::wait_gone(pidfd, rec.envd_pid, rec.envd_start_time, KILL_TIMEOUT).await {
        tracing::warn!(sandbox = %rec.id, pid = rec.envd_pid, "sandbox agent did not exit after SIGKILL");
    }
    cgroups::remove(&rec.cgroups).await;
    remove_sandbox_dir(dir);
}
