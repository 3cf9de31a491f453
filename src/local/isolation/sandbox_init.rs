//! In-sandbox set-up, run by `sandbox-mcp envd` as PID 1 of the new PID
//! namespace before any thread exists: private mounts, the copy-on-write root
//! (overlayfs over the template), fresh `/proc`, a minimal `/dev`, private
//! `/tmp` (and private `/home`, `/root` unless the template is a stored one,
//! whose own show), the user namespace (see `userns`), the `user` account
//! (uid 1000), the hostname, the agent's Unix socket, `pivot_root` into the
//! new root, and last the capability bounding set and the seccomp filter (see
//! `seccomp`).
//!
//! Paths the kernel shows inside the sandbox (overlay options in
//! `/proc/self/mountinfo`, the agent socket's name in `/proc/net/unix`) are
//! given relative to the sandbox's directory, so they do not name the host's
//! state directory or the sandbox's place in it.
//!
//! What is mounted where is decided first, from the spec alone, as a
//! `SandboxPlan` that `enter_sandbox` then carries out step by step (the unit
//! tests in `sandbox_init_tests.rs` inspect it without root).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::seccomp;
use super::spec::{SOCKET_FILE, SandboxSpec};
use super::userns::{self, IdMap};

/// Size of the sandbox's `/dev/shm` tmpfs (Docker's default). tmpfs pages are charged to the
/// sandbox's memory cgroup but belong to no process, so an unbounded `/dev/shm` lets a filler push
/// the cgroup into the OOM killer with nothing it could free; bounded, the filler gets ENOSPC.
pub const SHM_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// Makes envd the last process of its sandbox the OOM killer picks, so a process exhausting the
/// sandbox's memory is killed and the sandbox survives: envd lowers its own `oom_score_adj` to
/// -1000 when it may (CAP_SYS_RESOURCE; some container runtimes withhold it), and every command it
/// starts raises its own to +500 (see `envd::process::spawn`), which needs no privilege and which
/// an unprivileged sandbox user cannot undo.
fn shield_from_oom_killer() {
    // EACCES/EPERM without CAP_SYS_RESOURCE is expected in some containers and stays quiet (envd's
    // last log line becomes the provider's start-up error detail); commands still run at +500.
    if let Err(err) = std::fs::write("/proc/self/oom_score_adj", "-1000")
        && err.kind() != std::io::ErrorKind::PermissionDenied
    {
        eprintln!("sandbox-mcp envd: cannot lower its OOM score ({err}); commands still run at +500");
    }
}

/// Builds the sandbox around the calling process and returns the bound agent socket. `disk` and
/// `userns` are the sandbox's disk (mounted) and user namespace made ahead of time by the
/// provider (see `disk` and `userns`); without them the agent makes its own.
pub fn enter_sandbox(
    sandbox_dir: &Path,
    spec: &SandboxSpec,
    disk: Option<OwnedFd>,
    userns: Option<OwnedFd>,
) -> anyhow::Result<UnixListener> {
    shield_from_oom_killer();
    // Absolute, so that paths derived from it stay right after the chdir below.
    let sandbox_dir = &std::fs::canonicalize(sandbox_dir)
        .with_context(|| format!("resolving the sandbox directory {}", sandbox_dir.display()))?;
    let plan = SandboxPlan::new(sandbox_dir, spec, disk.is_some());
    let root = &plan.root;
    let ids = spec.id_map;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making / private in the sandbox's mount namespace")?;
    // Relative names below (overlay layers, the socket) are resolved against the sandbox's directory.
    nix::unistd::chdir(sandbox_dir).context("chdir into the sandbox directory")?;

    let userns = match userns {
        Some(userns) => userns,
        None => {
            // The host's /proc shows host pids: a procfs of this PID namespace finds the helper child.
            let own_proc = &plan.own_proc.target;
            std::fs::create_dir_all(own_proc).context("creating a procfs mount point")?;
            plan.own_proc.run()?;
            let userns = userns::create(&ids, own_proc).context("creating the sandbox's user namespace")?;
            umount2(own_proc, MntFlags::MNT_DETACH).context("unmounting the procfs")?;
            userns
        }
    };

    // Everything the sandbox writes lands in `data`: its own disk image when limited.
    match (disk, &spec.disk_image) {
        (Some(mount), _) => {
            std::fs::create_dir_all(&plan.data).context("creating the disk mount point")?;
            super::disk::attach_detached(mount, &plan.data).context("moving the prepared disk into the sandbox")?;
        }
        (None, Some(image)) => {
            std::fs::create_dir_all(&plan.data).context("creating the disk mount point")?;
            super::disk::mount_image(image, &plan.data)?;
        }
        (None, None) => {}
    }
    mount_layers(&plan.layers, &userns)?;

    ensure_dir(root, "proc", 0o555)?;
    plan.proc.run()?;
    protect_proc(&plan.proc.target)?;
    ensure_dir(root, "sys", 0o555)?;
    if let Err(err) = plan.sys.call() {
        eprintln!("sandbox-mcp envd: /sys not mounted: {err}");
    }
    build_dev(root, &plan.dev)?;

    // Private /tmp (and /home, /root unless the template brings its own), backed by the
    // sandbox's disk.
    for private in &plan.private {
        bind_private(root, private)?;
        if let Some(user_home) = &private.user_home {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(&user_home.path)
                .context("creating /home/user")?;
            nix::unistd::chown(&user_home.path, Some(user_home.uid.into()), Some(user_home.gid.into()))
                .context("chown /home/user")?;
        }
    }

    // A template that contains the provider's state directory (e.g. a custom template of `/`)
    // gets it hidden behind an empty read-only tmpfs.
    if plan.hide_state.target.is_dir() {
        plan.hide_state.run()?;
    }

    nix::unistd::sethostname(&spec.sandbox_id).context("sethostname")?;

    // Bind the agent's socket on the host-visible path before leaving the host's view, by its
    // relative name (the cwd is the sandbox directory): `/proc/net/unix` shows the name as bound.
    let socket = sandbox_dir.join(SOCKET_FILE);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(SOCKET_FILE).with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).context("chmod envd socket")?;

    nix::unistd::chdir(root).context("chdir into the new root")?;
    nix::unistd::pivot_root(".", ".").context("pivot_root")?;
    umount2(".", MntFlags::MNT_DETACH).context("detaching the old root")?;
    nix::unistd::chdir("/").context("chdir /")?;

    // From here on: root of the sandbox's user namespace, an unprivileged uid on the host.
    userns::enter(&userns).context("entering the sandbox's user namespace")?;
    drop(userns);
    let new_root = Path::new("/");
    write_accounts(new_root, spec)?;
    if spec.home_from_template {
        ensure_user_home(new_root, spec)?;
    }
    let _ = std::fs::write("/etc/hostname", format!("{}\n", spec.sandbox_id));
    write_hosts(new_root, &spec.sandbox_id);
    write_resolv_conf(new_root)?;
    drop_bounding_capabilities()?;
    seccomp::install().context("installing the seccomp filter")?;
    Ok(listener)
}

/// A `mount(2)` call decided ahead of time, and what its error says failed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    source: Option<PathBuf>,
    target: PathBuf,
    fstype: Option<&'static str>,
    flags: MsFlags,
    data: Option<String>,
    what: String,
}

impl Mount {
    /// A mount of a filesystem of type `fstype`.
    fn new(
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
    fn bind(source: impl Into<PathBuf>, target: PathBuf, flags: MsFlags) -> Self {
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
    fn what(self, what: impl Into<String>) -> Self {
        Mount { what: what.into(), ..self }
    }

    /// Mounts it.
    fn call(&self) -> nix::Result<()> {
        mount(self.source.as_deref(), &self.target, self.fstype, self.flags, self.data.as_deref())
    }

    /// Mounts it, an error saying what failed.
    fn run(&self) -> anyhow::Result<()> {
        self.call().with_context(|| self.what.clone())
    }
}

/// What `enter_sandbox` mounts and makes, decided from the spec before its first system call
/// (so a unit test builds it without root); `enter_sandbox` carries it out step by step, with
/// the checks that need the sandbox's tree (what exists in the template) made as it goes.
#[derive(Debug)]
struct SandboxPlan {
    /// `DIR/root`: the new root.
    root: PathBuf,
    /// Where everything the sandbox writes lands: `DIR/disk` (its disk) when it has one, else
    /// `DIR`.
    data: PathBuf,
    /// The procfs of the sandbox's PID namespace at `DIR/lower/proc`, mounted while envd makes
    /// the user namespace itself (when the provider did not).
    own_proc: Mount,
    layers: LayersPlan,
    /// `/proc` (then guarded, see [`PROC_GUARDS`]) and a read-only `/sys`.
    proc: Mount,
    sys: Mount,
    dev: DevPlan,
    /// `/tmp`, and `/home` and `/root` unless the template brings its own.
    private: Vec<PrivateDir>,
    /// Hides the provider's state directory, where the new root has one.
    hide_state: Mount,
}

/// What makes `/`: idmapped views of the template's directories under `DIR/lower`, the root
/// overlay over them and one overlay per extra layer.
#[derive(Debug)]
struct LayersPlan {
    /// The template root (first), then a stored template's further layers, bottom first.
    lowers: Vec<LowerBind>,
    /// The copy-on-write root over `lowers` (listed top first, as overlayfs wants them).
    root: Overlay,
    /// One per extra template layer (`base`'s host `/usr`), or why its target was refused.
    extra: Vec<Result<ExtraLayer, InvalidLayerTarget>>,
}

/// An idmapped bind of a host directory onto a mount point under `DIR/lower`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LowerBind {
    source: PathBuf,
    mount_point: PathBuf,
    /// What creating the mount point says when it fails.
    what: &'static str,
}

/// An overlay mount and the layer directories it needs (made first, the upper one owned by the
/// sandbox's root). Its options name paths relative to the sandbox's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Overlay {
    upper: PathBuf,
    work: PathBuf,
    owner: u32,
    mount: Mount,
}

/// An extra template layer: the template's `/<target>` overlaid with the layer's source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExtraLayer {
    target: String,
    bind: LowerBind,
    overlay: Overlay,
}

/// A template layer whose target is not a plain name of a top-level directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid template layer target {0:?}")]
struct InvalidLayerTarget(String);

/// The sandbox's `/dev`: a tmpfs with [`DEV_NODES`] bound from the host, a devpts of its own,
/// `/dev/shm`, and the [`DEV_LINKS`].
#[derive(Debug)]
struct DevPlan {
    tmpfs: Mount,
    nodes: Vec<(&'static str, Mount)>,
    pts: Mount,
    shm: Mount,
}

/// The device nodes bound from the host's `/dev`.
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// The symlinks of `/dev` made last (`ptmx` is made right after devpts).
const DEV_LINKS: [(&str, &str); 4] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// A fresh directory `DATA/<name>.d` (on the sandbox's disk) bound over `/<name>` of the new root.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PrivateDir {
    name: &'static str,
    mode: u32,
    /// Host uid and gid of the directory.
    owner: (u32, u32),
    source: PathBuf,
    bind: Mount,
    /// `/home/user`, made inside `/home` for the sandbox's user.
    user_home: Option<UserHome>,
}

/// The sandbox user's home directory and its host owner.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UserHome {
    path: PathBuf,
    uid: u32,
    gid: u32,
}

/// `path` relative to `dir` when under it (as the kernel shows overlay options in the sandbox's
/// mountinfo), else unchanged.
fn relative_to(dir: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(dir).map(Path::to_path_buf).unwrap_or_else(|_| path.to_path_buf())
}

impl SandboxPlan {
    /// The plan for the sandbox at `sandbox_dir` (absolute) of `spec`; `has_disk` tells whether
    /// the provider passed a mounted disk.
    fn new(sandbox_dir: &Path, spec: &SandboxSpec, has_disk: bool) -> SandboxPlan {
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
    fn new(sandbox_dir: &Path, data: &Path, root: &Path, spec: &SandboxSpec) -> LayersPlan {
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
                let layer_dir = data.join("layers").join(name);
                let overlay =
                    overlay(&[&bind.mount_point], layer_dir.join("upper"), layer_dir.join("work"), root.join(name));
                Ok(ExtraLayer { target: name.clone(), bind, overlay })
            })
            .collect();
        LayersPlan { lowers, root: root_overlay, extra }
    }
}

impl DevPlan {
    /// The `/dev` of the new root `root`, owned by the sandbox's root (`tty` group: gid 5).
    fn new(root: &Path, ids: &IdMap) -> DevPlan {
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

/// Mounts the copy-on-write root and the extra layers (see [`LayersPlan`]).
fn mount_layers(plan: &LayersPlan, userns: &OwnedFd) -> anyhow::Result<()> {
    let overlay = |overlay: &Overlay| -> anyhow::Result<()> {
        for dir in [&overlay.upper, &overlay.work] {
            std::fs::DirBuilder::new().mode(0o755).recursive(true).create(dir).context("creating layer dirs")?;
        }
        nix::unistd::chown(&overlay.upper, Some(overlay.owner.into()), Some(overlay.owner.into()))
            .context("chown upper layer")?;
        overlay.mount.run()
    };
    let bind = |lower: &LowerBind| -> anyhow::Result<()> {
        std::fs::create_dir_all(&lower.mount_point).context(lower.what)?;
        userns::idmapped_bind(&lower.source, &lower.mount_point, userns)
    };
    for lower in &plan.lowers {
        bind(lower)?;
    }
    overlay(&plan.root)?;
    for layer in &plan.extra {
        let layer = layer.as_ref().map_err(Clone::clone)?;
        bind(&layer.bind)?;
        if !layer.overlay.mount.target.is_dir() {
            anyhow::bail!("the template has no /{} directory for its layer", layer.target);
        }
        overlay(&layer.overlay)?;
    }
    Ok(())
}

/// How `/proc/<name>` is protected, as container runtimes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcGuard {
    /// A host-wide knob: bound onto itself, read-only.
    ReadOnly,
    /// A sensitive file: `/dev/null` bound over it.
    Masked,
    /// Host hardware details: hidden behind an empty read-only tmpfs (as Docker does).
    Hidden,
}

/// The guarded entries of `/proc`, in the order they are guarded; each only where present (a
/// directory, for [`ProcGuard::Hidden`]).
const PROC_GUARDS: [(&str, ProcGuard); 15] = [
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
    fn applies(self, path: &Path) -> bool {
        match self {
            ProcGuard::ReadOnly | ProcGuard::Masked => path.exists(),
            ProcGuard::Hidden => path.is_dir(),
        }
    }

    /// The mounts that guard `/proc/<name>`, at `path`.
    fn mounts(self, name: &str, path: &Path) -> Vec<Mount> {
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

/// Makes the host-wide knobs under `/proc` read-only and masks the sensitive files (see
/// [`PROC_GUARDS`]).
fn protect_proc(proc_dir: &Path) -> anyhow::Result<()> {
    for (name, guard) in PROC_GUARDS {
        let path = proc_dir.join(name);
        if guard.applies(&path) {
            for mount in guard.mounts(name, &path) {
                mount.run()?;
            }
        }
    }
    Ok(())
}

/// Capabilities processes in the sandbox may still get (Docker's default set minus CAP_MKNOD).
const KEPT_CAPABILITIES: &[u32] = &[
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    13, // NET_RAW
    18, // SYS_CHROOT
    29, // AUDIT_WRITE
    31, // SETFCAP
];

/// Drops every other capability from the bounding set, so no process started in the sandbox (root
/// included) can mount, load modules, open devices by handle, change host sysctls, etc.
fn drop_bounding_capabilities() -> anyhow::Result<()> {
    for cap in 0..64u32 {
        if KEPT_CAPABILITIES.contains(&cap) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number; EINVAL past the kernel's last one.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(err).with_context(|| format!("dropping capability {cap} from the bounding set"));
        }
    }
    Ok(())
}

fn ensure_dir(root: &Path, rel: &str, mode: u32) -> anyhow::Result<PathBuf> {
    let path = root.join(rel);
    std::fs::DirBuilder::new().mode(mode).recursive(true).create(&path).with_context(|| format!("creating /{rel}"))?;
    Ok(path)
}

/// Makes the fresh directory of `dir` and binds it over its place in the new root `root`.
fn bind_private(root: &Path, dir: &PrivateDir) -> anyhow::Result<()> {
    let (name, mode, source) = (dir.name, dir.mode, &dir.source);
    std::fs::DirBuilder::new().mode(mode).recursive(true).create(source).with_context(|| format!("creating {name}"))?;
    std::fs::set_permissions(source, std::fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {name}"))?;
    nix::unistd::chown(source, Some(dir.owner.0.into()), Some(dir.owner.1.into()))
        .with_context(|| format!("chown {name}"))?;
    ensure_dir(root, name, mode)?;
    dir.bind.run()
}

/// A tmpfs `/dev` with the usual device nodes bound from the host, a private devpts and `/dev/shm`.
fn build_dev(root: &Path, plan: &DevPlan) -> anyhow::Result<()> {
    let dev = ensure_dir(root, "dev", 0o755)?;
    plan.tmpfs.run()?;
    for (node, bind) in &plan.nodes {
        std::fs::File::create(&bind.target).with_context(|| format!("creating /dev/{node}"))?;
        bind.run()?;
    }
    ensure_dir(&dev, "pts", 0o755)?;
    plan.pts.run()?;
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx")).context("linking /dev/ptmx")?;
    ensure_dir(&dev, "shm", 0o1777)?;
    plan.shm.run()?;
    for (name, target) in DEV_LINKS {
        std::os::unix::fs::symlink(target, dev.join(name)).with_context(|| format!("linking /dev/{name}"))?;
    }
    Ok(())
}

/// Makes `user` (uid/gid from the spec, home /home/user) the only account with that uid.
fn write_accounts(root: &Path, spec: &SandboxSpec) -> anyhow::Result<()> {
    let (uid, gid) = (spec.user_uid, spec.user_gid);
    let passwd_line = format!("user:x:{uid}:{gid}:sandbox user:/home/user:/bin/bash");
    let group_line = format!("user:x:{gid}:");
    rewrite_table(&root.join("etc/passwd"), &passwd_line, |fields| {
        fields.first() == Some(&"user") || fields.get(2) == Some(&uid.to_string().as_str())
    })?;
    rewrite_table(&root.join("etc/group"), &group_line, |fields| {
        fields.first() == Some(&"user") || fields.get(2) == Some(&gid.to_string().as_str())
    })?;
    Ok(())
}

fn rewrite_table(path: &Path, new_line: &str, replaces: impl Fn(&[&str]) -> bool) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(old.len() + new_line.len() + 1);
    for line in old.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if !replaces(&fields) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(new_line);
    out.push('\n');
    let mut file = std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(out.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Gives a stored template's sandbox the `user` home E2B's SDKs expect: run inside the sandbox
/// (after `pivot_root`, as the sandbox's root), so the paths resolve in the sandbox's own tree and
/// the writes land in its overlay. A missing `/root` or `/home/user` is created (`/home/user`
/// owned by `user`); an existing one is left as the image made it, owner included.
fn ensure_user_home(root: &Path, spec: &SandboxSpec) -> anyhow::Result<()> {
    let create = |rel: &str, mode: u32| -> anyhow::Result<bool> {
        let path = root.join(rel);
        if std::fs::symlink_metadata(&path).is_ok() {
            return Ok(false);
        }
        std::fs::DirBuilder::new()
            .mode(mode)
            .recursive(true)
            .create(&path)
            .with_context(|| format!("creating /{rel}"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod /{rel}"))?;
        Ok(true)
    };
    create("root", 0o700)?;
    create("home", 0o755)?;
    if create("home/user", 0o755)? {
        nix::unistd::chown(&root.join("home/user"), Some(spec.user_uid.into()), Some(spec.user_gid.into()))
            .context("chown /home/user")?;
    }
    Ok(())
}

/// Names the sandbox in `/etc/hosts` as `127.0.1.1 <id>`, replacing an earlier `127.0.1.1` line
/// (a template built from a sandbox carries its builder's).
fn write_hosts(root: &Path, sandbox_id: &str) {
    let path = root.join("etc/hosts");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::write(&path, hosts_with_name(&old, sandbox_id));
}

/// `hosts` without its `127.0.1.1` lines, plus `127.0.1.1 <id>`.
fn hosts_with_name(hosts: &str, sandbox_id: &str) -> String {
    let mut out = String::with_capacity(hosts.len() + sandbox_id.len() + 12);
    for line in hosts.lines() {
        if line.split_whitespace().next() != Some("127.0.1.1") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(&format!("127.0.1.1\t{sandbox_id}\n"));
    out
}

/// Points the sandbox's resolver at the provider's DNS forwarder (the far end of its `eth0`),
/// replacing whatever the template had (often a symlink to a host-only stub resolver).
fn write_resolv_conf(root: &Path) -> anyhow::Result<()> {
    let path = root.join("etc/resolv.conf");
    let _ = std::fs::remove_file(&path);
    let text = format!("nameserver {}\n", crate::local::net::netns::GATEWAY_ADDR);
    std::fs::write(&path, text).context("writing /etc/resolv.conf")
}

#[cfg(test)]
#[path = "sandbox_init_tests.rs"]
mod tests;
