//! Filesystem snapshots of a running sandbox, and forks. A snapshot freezes every process of the
//! sandbox (cgroup freezer) for a consistent point, writes what the sandbox wrote (its overlay
//! upper layer, its private `/home` and `/root`, the upper layers of `base`'s host-program
//! layers) as tar files beside the template store while it is frozen, thaws it, and only then
//! turns the tars into store layers through the store's hostile-layer extractor: the sandbox is
//! frozen only for the copy. The source keeps its id, deadline and processes. A snapshot's
//! template stacks those layers over the layers the sandbox ran on ([`Lineage`]), so sandboxes
//! of it share them: no full copy. A fork is a snapshot and `count` sandboxes of it, created
//! side by side, each succeeding or failing on its own.
//!
//! Memory, running processes and open connections are never part of a snapshot (this host has
//! no working process checkpointer): see [`FORK_CARRIES`].

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

use super::{CreateParams, ProviderError, SandboxTable};
use crate::e2b::wire::SandboxState;
use crate::local::control::agent_process;
use crate::local::control::record::SandboxRecord;
use crate::local::isolation::cgroups;
use crate::local::store::harvest::{self, Part};
use crate::local::store::{Lineage, RunConfig, Store, StoreError};

pub use crate::e2b::wire::{MAX_FORK_COUNT, META_FORK_CARRIES, META_FORK_PARENT};
/// What a fork (and a sandbox made from a snapshot) has of its source, and what it has not.
pub const FORK_CARRIES: &str = "filesystem only: the root filesystem, /home and /root as they were at the fork; \
     not /tmp, not memory, running processes (background tasks copied from the parent never report running here) \
     or open connections";

/// A tar file of one layer-to-be, written while the sandbox was frozen.
struct LayerTar {
    /// `None`: the root's layer; else the extra layer's target (`usr`).
    target: Option<String>,
    path: PathBuf,
}

fn store_error(err: StoreError) -> ProviderError {
    match err {
        StoreError::LimitReached { .. } | StoreError::TooLarge(_) => {
            ProviderError::Quota(format!("cannot keep the snapshot: {err}"))
        }
        other => ProviderError::Internal(format!("snapshot: {other}")),
    }
}

impl SandboxTable {
    /// Takes a filesystem snapshot of sandbox `id` and hands its lineage (the sandbox's own plus
    /// the new layers) and process configuration to `register`, which runs under the store's
    /// lock (a template record is written there, or nothing) and returns what it returns. Nothing
    /// of a failed snapshot stays: its tars and extracted layers are in the store's scratch space
    /// until committed.
    pub async fn snapshot_layers<T: Send + 'static>(
        &self,
        id: &str,
        register: impl FnOnce(&Store, Lineage, RunConfig) -> Result<T, ProviderError> + Send + 'static,
    ) -> Result<T, ProviderError> {
        let store = self.store.clone().ok_or_else(|| {
            ProviderError::Internal("snapshots need the template store, which cannot be opened".into())
        })?;
        let entry = self.get_public(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?;
        let rec = entry.snapshot();
        let Some(lineage) = rec.lineage.clone() else {
            return Err(ProviderError::Conflict(format!(
                "sandbox {id} was created before this provider version took snapshots; create a new sandbox to \
                 snapshot or fork it"
            )));
        };
        // The provider's own handle on the sandbox's disk, else (a sandbox re-adopted after a
        // restart) the one its agent keeps.
        let disk = match entry.kept_disk() {
            Some(fd) => Some(fd),
            None if entry.dir.join("disk.img").exists() => {
                let fd = rec
                    .agent_data_fd
                    .ok_or_else(|| std::io::Error::other("its agent keeps no data descriptor"))
                    .and_then(|number| agent_process::agent_data_dir(rec.envd_pid, rec.envd_start_time, number));
                Some(fd.map_err(|e| {
                    ProviderError::Conflict(format!(
                        "the disk of sandbox {id} cannot be reached for a snapshot since the provider restarted \
                         ({e}); snapshot sandboxes started since"
                    ))
                })?)
            }
            None => None,
        };
        let data = match &disk {
            Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            None => entry.dir.clone(),
        };
        // The copy and its layers take about twice what the sandbox wrote: refused before anything
        // is frozen or written when the store cannot keep it.
        if disk.is_some()
            && let Some((used, _)) = crate::local::isolation::disk::usage(&data)
        {
            let free = store.limit_bytes().saturating_sub(store.usage_bytes());
            if used > free {
                return Err(ProviderError::Quota(format!(
                    "sandbox {id} has written {} MiB, more than the template store's {} MiB left \
                     (local.template_store_limit_mb); delete snapshots or templates first",
                    used >> 20,
                    free >> 20
                )));
            }
        }
        let scratch = store.layout.scratch("snapshot").map_err(store_error)?;
        let id_base = self.cfg.id_map.host(0);
        let config = rec.template_config.clone().unwrap_or_default();

        let op = entry.op.lock().await;
        if !self.get(id).is_some_and(|current| std::sync::Arc::ptr_eq(&current, &entry)) {
            return Err(ProviderError::NotFound(id.to_owned())); // killed meanwhile
        }
        let rec = entry.snapshot();
        let frozen_here = rec.state == SandboxState::Running;
        if frozen_here {
            match cgroups::set_frozen(&rec.cgroups, true).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ProviderError::Conflict(
                        "snapshots need the cgroup freezer (to copy a sandbox's files while nothing in it runs)".into(),
                    ));
                }
                Err(e) => return Err(ProviderError::Internal(format!("cannot freeze sandbox {id}: {e}"))),
            }
        }
        let started = Instant::now();
        let (dir, private_home) = (scratch.path.clone(), lineage.private_home);
        // What was written is listed while nothing runs: a layer first written to now is not missed.
        let written =
            tokio::task::spawn_blocking(move || write_tars(&dir, &parts_of(&data, private_home), id_base)).await;
        let frozen = started.elapsed();
        if frozen_here && let Err(e) = cgroups::set_frozen(&rec.cgroups, false).await {
            tracing::error!(sandbox = %id, err = %e, "cannot thaw the sandbox after its snapshot");
            return Err(ProviderError::Internal(format!("cannot thaw sandbox {id} after its snapshot: {e}")));
        }
        drop(op);
        drop(disk);
        let tars = written.map_err(|e| ProviderError::Internal(format!("snapshot: {e}")))?.map_err(|e| match e {
            StoreError::TooLarge(_) => store_error(e),
            e => ProviderError::Internal(format!("cannot copy the files of sandbox {id}: {e}")),
        })?;
        tracing::info!(sandbox = %id, frozen_ms = frozen.as_secs_f64() * 1000.0, "snapshot copied");

        tokio::task::spawn_blocking(move || -> Result<T, ProviderError> {
            let mut prepared = Vec::with_capacity(tars.len());
            for tar in &tars {
                let file =
                    std::fs::File::open(&tar.path).map_err(|e| ProviderError::Internal(format!("snapshot: {e}")))?;
                prepared.push((tar.target.clone(), store.extract_layer(file, None, None).map_err(store_error)?));
                let _ = std::fs::remove_file(&tar.path);
            }
            let _lock = store.lock().map_err(store_error)?;
            let mut lineage = Lineage { private_home: false, ..lineage };
            for (target, layer) in prepared {
                let digest = store.commit_layer(layer).map_err(store_error)?.to_string();
                match target {
                    None => lineage.layers.push(digest),
                    Some(target) => lineage.extra.entry(target).or_default().push(digest),
                }
            }
            let registered = register(&store, lineage, config);
            drop(scratch);
            registered
        })
        .await
        .map_err(|e| ProviderError::Internal(format!("snapshot: {e}")))?
    }

    /// Forks sandbox `id`: one snapshot, then `count` sandboxes of it, created side by side. The
    /// forks have the parent's template name, environment, network rules, lifecycle and metadata,
    /// plus [`META_FORK_PARENT`] and [`META_FORK_CARRIES`]. The parent keeps its id and deadline.
    pub async fn fork(
        &self,
        id: &str,
        count: u32,
        timeout_secs: Option<u64>,
    ) -> Result<Vec<Result<SandboxRecord, ProviderError>>, ProviderError> {
        if !(1..=MAX_FORK_COUNT).contains(&count) {
            return Err(ProviderError::BadRequest(format!(
                "count must be between 1 and {MAX_FORK_COUNT} (got {count})"
            )));
        }
        // Checked before anything is frozen.
        self.timeout_ms(timeout_secs)?;
        let parent = self.get_public(id).ok_or_else(|| ProviderError::NotFound(id.to_owned()))?.snapshot();
        let (lineage, config) = self.snapshot_layers(id, |_, lineage, config| Ok((lineage, config))).await?;
        let resolved = self.stack(&format!("fork of {id}"), lineage, config)?;
        let mut metadata: HashMap<String, String> = parent.metadata.clone();
        metadata.insert(META_FORK_PARENT.into(), id.to_owned());
        metadata.insert(META_FORK_CARRIES.into(), FORK_CARRIES.into());
        let creates = (0..count).map(|_| {
            self.create(CreateParams {
                template: parent.template.clone(),
                timeout_secs,
                metadata: metadata.clone(),
                env_vars: parent.env_vars.clone(),
                allow_internet_access: parent.allow_internet_access,
                network: parent.network.clone(),
                resolved: Some(resolved.clone()),
                lifecycle: parent.lifecycle,
                ..CreateParams::default()
            })
        });
        Ok(futures_util::future::join_all(creates).await)
    }
}

/// What of the sandbox's data directory `data` makes its snapshot's layers: the overlay's upper
/// layer (with the private `/home` and `/root` of a `base` or directory template's sandbox, made
/// opaque so the template's own stay hidden), then one layer per extra layer that was written to.
fn parts_of(data: &std::path::Path, private_home: bool) -> Vec<(Option<String>, Vec<Part>)> {
    const PRIVATE: &[&str] = &["home", "root"];
    let mut root = vec![Part { skip: if private_home { PRIVATE } else { &[] }, ..Part::root(data.join("upper")) }];
    if private_home {
        root.push(Part { source: data.join("home.d"), at: "home", opaque: true, skip: &[] });
        root.push(Part { source: data.join("root.d"), at: "root", opaque: true, skip: &[] });
    }
    let mut parts = vec![(None, root)];
    if let Ok(layers) = std::fs::read_dir(data.join("layers")) {
        let mut names: Vec<String> =
            layers.flatten().filter_map(|e| e.file_name().to_str().map(str::to_owned)).collect();
        names.sort();
        for name in names {
            let upper = data.join("layers").join(&name).join("upper");
            let written = std::fs::read_dir(&upper).map(|mut d| d.next().is_some()).unwrap_or(false);
            if written {
                parts.push((Some(name), vec![Part::root(upper)]));
            }
        }
    }
    parts
}

/// Writes each layer's tar into `dir` (the sandbox is frozen meanwhile).
fn write_tars(
    dir: &std::path::Path,
    parts: &[(Option<String>, Vec<Part>)],
    id_base: u32,
) -> Result<Vec<LayerTar>, StoreError> {
    let mut tars = Vec::with_capacity(parts.len());
    for (i, (target, layer_parts)) in parts.iter().enumerate() {
        let path = dir.join(format!("{i}.tar"));
        let file = std::fs::File::create(&path).map_err(|e| StoreError::io(&path, e))?;
        harvest::write_tar(layer_parts, id_base, file)?;
        tars.push(LayerTar { target: target.clone(), path });
    }
    Ok(tars)
}
