//! The sandbox's set-up decided ahead of time: from the spec alone, `SandboxPlan` says what
//! `sandbox_init::enter_sandbox` mounts and makes (the idmapped lower layers and the overlays
//! over them, `/proc` and its guards, `/sys`, `/dev`, the private directories, the hidden state
//! directory), so that unit tests inspect it without root and the executing code only carries
//! it out.

use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::mount::{MsFlags, mount};

use super::spec::SandboxSpec;
use super::userns::IdMap;

/// Size of the sandbox's `/dev/shm` tmpfs (Docker's default). tmpfs pages are charged to the
/// sandbox's memory cgroup but belong to no process, so an unbounded `/dev/shm` lets a filler push
/// the cgroup into the OOM killer with nothing it could free; bounded, the filler gets ENOSPC.
pub const SHM_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// A `mount(2)` call decided ahead of time, and what its error says failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub(super) source: Option<PathBuf>,
    pub(super) target: PathBuf,
    pub(super) fstype: Option<&'static str>,
    pub(super) flags: MsFlags,
    pub(super) data: Option<String>,
    pub(super) what: String,
}

impl Mount {
    /// A mount of a filesystem of type `fstype`.
    pub(super) fn new(
        source: impl Into<PathBuf>,
        target: PathBuf,
        fstype: &'static str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Self {
        Mount {
            source: Some(source.into()),
            target,
            fstype: Some(fstype),
            flags,
            data: data.map(str::to_owned),
            what: String::new(),
        }
    }

    /// A bind mount of `source` onto `target`.
    pub(super) fn bind(source: impl Into<PathBuf>, target: PathBuf, flags: MsFlags) -> Self {
        Mount {
            source: Some(source.into()),
            target,
            fstype: None,
            flags: MsFlags::MS_BIND | flags,
            data: None,
            what: String::new(),
        }
    }

    /// The same mount, with what its error says failed.
    pub(super) fn what(self, what: impl Into<String>) -> Self {
        Mount { what: what.into(), ..self }
    }

    /// Mounts it.
    pub(super) fn call(&self) -> nix::Result<()> {
        mount(self.source.as_deref(), &self.target, self.fstype, self.flags, self.data.as_deref())
    }

    /// Mounts it, an error saying what failed.
    pub(super) fn run(&self) -> anyhow::Result<()> {
        self.call().with_context(|| self.what.clone())
    }
}

/// What `enter_sandbox` mounts and makes, decided from the spec before its first system call
/// (so a unit test builds it without root); `enter_sandbox` carries it out step by step, with
/// the checks that need the sandbox's tree (what exists in the template) made as it goes.
#[derive(Debug)]
pub(super) struct SandboxPlan {
    /// `DIR/root`: the new root.
    pub(super) root: PathBuf,
    /// Where everything the sandbox writes lands: `DIR/disk` (its disk) when it has one, else
    /// `DIR`.
    pub(super) data: PathBuf,
    /// The procfs of the sandbox's PID namespace at `DIR/lower/proc`, mounted while envd makes
    /// the user namespace itself (when the provider did not).
    pub(super) own_proc: Mount,
    pub(super) layers: LayersPlan,
    /// `/proc` (then guarded, see [`PROC_GUARDS`]) and a read-only `/sys`.
    pub(super) proc: Mount,
    pub(super) sys: Mount,
    pub(super) dev: DevPlan,
    /// `/tmp`, and `/home` and `/root` unless the template brings its own.
    pub(super) private: Vec<PrivateDir>,
    /// Hides the provider's state directory, where the new root has one.
    pub(super) hide_state: Mount,
}

/// What makes `/`: idmapped views of the template's directories under `DIR/lower`, the root
/// overlay over them and one overlay per extra layer.
#[derive(Debug)]
pub(super) struct LayersPlan {
    /// The template root (first), then a stored template's further layers, bottom first.
    pub(super) lowers: Vec<LowerBind>,
    /// The copy-on-write root over `lowers` (listed top first, as overlayfs wants them).
    pub(super) root: Overlay,
    /// One per extra template layer (`base`'s host `/usr`), or why its target was refused.
    pub(super) extra: Vec<Result<ExtraLayer, InvalidLayerTarget>>,
}

/// An idmapped bind of a host directory onto a mount point under `DIR/lower`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LowerBind {
    pub(super) source: PathBuf,
    pub(super) mount_point: PathBuf,
    /// What creating the mount point says when it fails.
    pub(super) what: &'static str,
}

/// An overlay mount and the layer directories it needs (made first, the upper one owned by the
/// sandbox's root). Its options name paths relative to the sandbox's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Overlay {
    pub(super) upper: PathBuf,
    pub(super) work: PathBuf,
    pub(super) owner: u32,
    pub(super) mount: Mount,
}

/// An extra template layer: the template's `/<target>` overlaid with the layer's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExtraLayer {
    pub(super) target: String,
    pub(super) bind: LowerBind,
    /// The layers stacked above the source (a snapshot's), bottom first.
    pub(super) above: Vec<LowerBind>,
    pub(super) overlay: Overlay,
}

/// A template layer whose target is not a plain name of a top-level directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid template layer target {0:?}")]
pub(super) struct InvalidLayerTarget(pub(super) String);

/// The sandbox's `/dev`: a tmpfs with [`DEV_NODES`] bound from the host, a devpts of its own,
/// `/dev/shm`, and the [`DEV_LINKS`].
#[derive(Debug)]
pub(super) struct DevPlan {
    pub(super) tmpfs: Mount,
    pub(super) nodes: Vec<(&'static str, Mount)>,
    pub(super) pts: Mount,
    pub(super) shm: Mount,
}

/// The device nodes bound from the host's `/dev`.
pub(super) const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// The symlinks of `/dev` made last (`ptmx` is made right after devpts).
pub(super) const DEV_LINKS: [(&str, &str); 4] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// A fresh directory `DATA/<name>.d` (on the sandbox's disk) bound over `/<name>` of the new root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PrivateDir {
    pub(super) name: &'static str,
    pub(super) mode: u32,
    /// Host uid and gid of the directory.
    pub(super) owner: (u32, u32),
    pub(super) source: PathBuf,
    pub(super) bind: Mount,
    /// `/home/user`, made inside `/home` for the sandbox's user.
    pub(super) user_home: Option<UserHome>,
}

/// The sandbox user's home directory and its host owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UserHome {
    pub(super) path: PathBuf,
    pub(super) uid: u32,
    pub(super) gid: u32,
}

/// `path` relative to `dir` when under it (as the kernel shows overlay options in the sandbox's
/// mountinfo), else unchanged.
pub(super) fn relative_to(dir: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(dir).map(Path::to_path_buf).unwrap_or_else(|_| path.to_path_buf())
}

impl SandboxPlan {
    /// The plan for the sandbox at `sandbox_dir` (absolute) of `spec`; `has_disk` tells whether
    /// the provider passed a mounted disk.
    pub(super) fn new(sandbox_dir: &Path, spec: &SandboxSpec, has_disk: bool) -> SandboxPlan {
        let root = sandbox_dir.join("root");
        let ids = spec.id_map;
        let data =
            if has_disk || spec.disk_image.is_some() { sandbox_dir.join("disk") } else { sandbox_dir.to_owned() };
        let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        let own_proc = Mount::new("proc", sandbox_dir.join("lower/proc"), "proc", nosuid_nodev_noexec, None)
            .what("mounting a procfs");
        let proc = Mount::new("proc", root.join("proc"), "proc", nosuid_nodev_noexec, None).what("mounting /proc");
        let sys = Mount::new("sysfs", root.join("sys"), "sysfs", nosuid_nodev_noexec | MsFlags::MS_RDONLY, None)
            .what("mounting /sys");
        let (host_root, host_user) = (ids.host(0), ids.host(spec.user_uid));
        let private_dir = |name: &'static str, mode: u32| {
            let source = data.join(format!("{name}.d"));
            let bind =
                Mount::bind(&source, root.join(name), MsFlags::empty()).what(format!("mounting a private /{name}"));
            PrivateDir { name, mode, owner: (host_root, host_root), source, bind, user_home: None }
        };
        // `base` and directory templates (a directory may be a host's `/`) get private, empty
        // /home (with /home/user) and /root; a stored template shows its own, written through the
        // overlay (see `ensure_user_home`).
        let mut private = vec![private_dir("tmp", 0o1777)];
        if !spec.home_from_template {
            let user_home = UserHome { path: root.join("home/user"), uid: host_user, gid: ids.host(spec.user_gid) };
            private.push(PrivateDir { user_home: Some(user_home), ..private_dir("home", 0o755) });
            private.push(private_dir("root", 0o700));
        }
        let state_inside = root.join(spec.state_dir.strip_prefix("/").unwrap_or(&spec.state_dir));
        let hide_state = Mount::new(
            "tmpfs",
            state_inside,
            "tmpfs",
            MsFlags::MS_RDONLY | nosuid_nodev_noexec,
            Some("size=4k,mode=755"),
        )
        .what("hiding the state directory");
        SandboxPlan {
            layers: LayersPlan::new(sandbox_dir, &data, &root, spec),
            dev: DevPlan::new(&root, &ids),
            root,
            data,
            own_proc,
            proc,
            sys,
            private,
            hide_state,
        }
    }
}

impl LayersPlan {
    /// The copy-on-write root: an overlay whose lower layers are idmapped views of the template
    /// root and of a stored template's further layers, plus one overlay per extra template layer
    /// (the host's `/usr` for `base`), all with their upper layers in `data` (the sandbox's
    /// disk), owned by the sandbox's root.
    pub(super) fn new(sandbox_dir: &Path, data: &Path, root: &Path, spec: &SandboxSpec) -> LayersPlan {
        let owner = spec.id_map.host(0);
        let overlay = |lowers: &[&Path], upper: PathBuf, work: PathBuf, target: PathBuf| {
            // Relative to the sandbox directory (the cwd): the options show in the sandbox's mountinfo.
            let rel = |p: &Path| relative_to(sandbox_dir, p).display().to_string();
            let lowerdir: Vec<String> = lowers.iter().map(|p| rel(p)).collect();
            let opts = format!("lowerdir={},upperdir={},workdir={}", lowerdir.join(":"), rel(&upper), rel(&work));
            let mount = Mount::new("overlay", target, "overlay", MsFlags::empty(), Some(&opts))
                .what(format!("mounting an overlay ({opts})"));
            Overlay { upper, work, owner, mount }
        };
        let lower_dir = sandbox_dir.join("lower");
        let mut lowers = vec![LowerBind {
            source: spec.template_root.clone(),
            mount_point: lower_dir.join("root"),
            what: "creating the lower layer mount point",
        }];
        for (i, source) in spec.template_lowers.iter().enumerate() {
            lowers.push(LowerBind {
                source: source.clone(),
                mount_point: lower_dir.join(format!("l{}", i + 1)),
                what: "creating a lower layer mount point",
            });
        }
        let stack: Vec<&Path> = lowers.iter().rev().map(|l| l.mount_point.as_path()).collect();
        let root_overlay = overlay(&stack, data.join("upper"), data.join("work"), root.to_owned());
        let extra = spec
            .template_layers
            .iter()
            .map(|layer| {
                let name = &layer.target;
                if name.is_empty() || name.contains('/') || name.starts_with('.') {
                    return Err(InvalidLayerTarget(name.clone()));
                }
                let bind = LowerBind {
                    source: layer.source.clone(),
                    mount_point: lower_dir.join(name),
                    what: "creating a layer mount point",
                };
                let above: Vec<LowerBind> = layer
                    .above
                    .iter()
                    .enumerate()
                    .map(|(i, source)| LowerBind {
                        source: source.clone(),
                        mount_point: lower_dir.join(format!("{name}+{}", i + 1)),
                        what: "creating a layer mount point",
                    })
                    .collect();
                let layer_dir = data.join("layers").join(name);
                // Top first, as overlayfs wants them.
                let stack: Vec<&Path> = above
                    .iter()
                    .rev()
                    .map(|b| b.mount_point.as_path())
                    .chain(std::iter::once(bind.mount_point.as_path()))
                    .collect();
                let overlay = overlay(&stack, layer_dir.join("upper"), layer_dir.join("work"), root.join(name));
                Ok(ExtraLayer { target: name.clone(), bind, above, overlay })
            })
            .collect();
        LayersPlan { lowers, root: root_overlay, extra }
    }
}

impl DevPlan {
    /// The `/dev` of the new root `root`, owned by the sandbox's root (`tty` group: gid 5).
    pub(super) fn new(root: &Path, ids: &IdMap) -> DevPlan {
        let dev = root.join("dev");
        let owner = format!("uid={},gid={}", ids.host(0), ids.host(0));
        let tmpfs = Mount::new(
            "tmpfs",
            dev.clone(),
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
            Some(&format!("mode=755,size=64k,{owner}")),
        )
        .what("mounting /dev");
        let nodes = DEV_NODES
            .iter()
            .map(|node| {
                let bind = Mount::bind(Path::new("/dev").join(node), dev.join(node), MsFlags::empty())
                    .what(format!("binding /dev/{node}"));
                (*node, bind)
            })
            .collect();
        let pts = Mount::new(
            "devpts",
            dev.join("pts"),
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some(&format!("newinstance,ptmxmode=0666,mode=0620,gid={}", ids.host(5))),
        )
        .what("mounting /dev/pts");
        let shm = Mount::new(
            "tmpfs",
            dev.join("shm"),
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(&format!("mode=1777,size={SHM_SIZE_BYTES},{owner}")),
        )
        .what("mounting /dev/shm");
        DevPlan { tmpfs, nodes, pts, shm }
    }
}

/// How `/proc/<name>` is protected, as container runtimes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProcGuard {
    /// A host-wide knob: bound onto itself, read-only.
    ReadOnly,
    /// A sensitive file: `/dev/null` bound over it.
    Masked,
    /// Host hardware details: hidden behind an empty read-only tmpfs (as Docker does).
    Hidden,
}

/// The guarded entries of `/proc`, in the order they are guarded; each only where present (a
/// directory, for [`ProcGuard::Hidden`]).
pub(super) const PROC_GUARDS: [(&str, ProcGuard); 15] = [
    ("sys", ProcGuard::ReadOnly),
    ("sysrq-trigger", ProcGuard::ReadOnly),
    ("irq", ProcGuard::ReadOnly),
    ("bus", ProcGuard::ReadOnly),
    ("fs", ProcGuard::ReadOnly),
    ("kcore", ProcGuard::Masked),
    ("keys", ProcGuard::Masked),
    ("timer_list", ProcGuard::Masked),
    ("timer_stats", ProcGuard::Masked),
    ("sched_debug", ProcGuard::Masked),
    ("latency_stats", ProcGuard::Masked),
    ("config.gz", ProcGuard::Masked),
    ("acpi", ProcGuard::Hidden),
    ("asound", ProcGuard::Hidden),
    ("scsi", ProcGuard::Hidden),
];

impl ProcGuard {
    /// Whether `/proc/<name>`, at `path`, is there to guard.
    pub(super) fn applies(self, path: &Path) -> bool {
        match self {
            ProcGuard::ReadOnly | ProcGuard::Masked => path.exists(),
            ProcGuard::Hidden => path.is_dir(),
        }
    }

    /// The mounts that guard `/proc/<name>`, at `path`.
    pub(super) fn mounts(self, name: &str, path: &Path) -> Vec<Mount> {
        match self {
            ProcGuard::ReadOnly => {
                let ro = MsFlags::MS_BIND
                    | MsFlags::MS_REMOUNT
                    | MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV;
                vec![
                    Mount::bind(path, path.to_owned(), MsFlags::MS_REC).what(format!("binding /proc/{name}")),
                    Mount {
                        source: None,
                        target: path.to_owned(),
                        fstype: None,
                        flags: ro,
                        data: None,
                        what: String::new(),
                    }
                    .what(format!("making /proc/{name} read-only")),
                ]
            }
            ProcGuard::Masked => {
                vec![Mount::bind("/dev/null", path.to_owned(), MsFlags::empty()).what(format!("masking /proc/{name}"))]
            }
            ProcGuard::Hidden => {
                let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                vec![
                    Mount::new("tmpfs", path.to_owned(), "tmpfs", flags, Some("size=4k,mode=555"))
                        .what(format!("masking /proc/{name}")),
                ]
            }
        }
    }
}

#[cfg(test)]
#[path = "sandbox_plan_tests.rs"]
mod tests;
