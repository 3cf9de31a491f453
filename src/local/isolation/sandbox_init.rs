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
//! What is mounted where is decided first, from the spec alone, by
//! `sandbox_plan` (whose unit tests inspect it without root); this module
//! carries it out step by step.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::sandbox_plan::{DEV_LINKS, DevPlan, LayersPlan, LowerBind, Overlay, PROC_GUARDS, PrivateDir, SandboxPlan};
use super::seccomp;
use super::spec::AGENT_DATA_FD;
use super::spec::{SOCKET_FILE, SandboxSpec};
use super::userns;

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

/// Builds the sandbox around the calling process and returns the bound agent socket and the
/// descriptor at which the agent keeps the sandbox's data directory (see [`keep_data_dir`]).
/// `disk` and `userns` are the sandbox's disk (mounted) and user namespace made ahead of time by
/// the provider (see `disk` and `userns`); without them the agent makes its own.
pub fn enter_sandbox(
    sandbox_dir: &Path,
    spec: &SandboxSpec,
    disk: Option<OwnedFd>,
    userns: Option<OwnedFd>,
) -> anyhow::Result<(UnixListener, Option<i32>)> {
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
    let data_fd = keep_data_dir(&plan.data);
    mount_layers(&plan.layers, &userns)?;
    // Mount points the template made symlinks: the set-up below may fail on them, and is then
    // refused as the template's fault (see [`TEMPLATE_REFUSED`]).
    let linked = linked_mount_points(root);
    let set_up = || -> anyhow::Result<UnixListener> {
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
    };
    set_up().map(|listener| (listener, data_fd)).map_err(|err| refused_for_links(err, &linked))
}

/// Keeps the sandbox's data directory (its disk) open for the agent's whole life, at the first
/// free descriptor from [`AGENT_DATA_FD`] (or from half the descriptor limit when that is lower),
/// and returns its number, which the agent reports on its readiness line: after `pivot_root`
/// nothing else names the directory, and a provider that restarted takes it from there to
/// snapshot the sandbox. Close-on-exec: no process the agent starts inherits it. Best effort: a
/// sandbox whose descriptor could not be kept starts all the same (only a snapshot after a
/// provider restart is then refused).
fn keep_data_dir(data: &Path) -> Option<i32> {
    let kept = || -> anyhow::Result<i32> {
        let flags = nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(data, flags, nix::sys::stat::Mode::empty()).context("opening it")?;
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| i32::try_from(soft).unwrap_or(i32::MAX))
            .unwrap_or(1024);
        let lowest = AGENT_DATA_FD.min(soft / 2).max(3);
        // SAFETY: fcntl(2) F_DUPFD_CLOEXEC on a descriptor we own: the kernel picks a free number at
        // or above `lowest`; the new descriptor is deliberately never closed.
        let number = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::F_DUPFD_CLOEXEC, lowest) };
        if number < 0 {
            return Err(std::io::Error::last_os_error()).context("duplicating it");
        }
        Ok(number)
    };
    kept()
        .map_err(|err| {
            eprintln!(
                "sandbox-mcp envd: cannot keep the data directory open ({err:#}); snapshots after a provider \
                 restart will be refused"
            );
        })
        .ok()
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
        for above in &layer.above {
            bind(above)?;
        }
        if !layer.overlay.mount.target.is_dir() {
            anyhow::bail!("the template has no /{} directory for its layer", layer.target);
        }
        overlay(&layer.overlay)?;
    }
    Ok(())
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

/// The start of a set-up error that is the template's fault, not the host's: the provider
/// answers it with 400 naming the template (the rest of the text says what is wrong).
pub const TEMPLATE_REFUSED: &str = "template refused: ";

/// The directories the set-up mounts over or into, as the template may have them.
const MOUNT_POINTS: [&str; 6] = ["dev", "home", "proc", "root", "sys", "tmp"];

/// Which of [`MOUNT_POINTS`] are symlinks in the new root `root` (as `/name`).
fn linked_mount_points(root: &Path) -> Vec<String> {
    MOUNT_POINTS
        .iter()
        .filter(|name| std::fs::symlink_metadata(root.join(name)).is_ok_and(|m| m.file_type().is_symlink()))
        .map(|name| format!("/{name}"))
        .collect()
}

/// A set-up error of a template with symlinked mount points `linked`, made the template's fault
/// ([`TEMPLATE_REFUSED`]) when there are any: a mount through such a link lands outside the
/// sandbox's tree, and what the set-up does next fails (without changing the host).
fn refused_for_links(err: anyhow::Error, linked: &[String]) -> anyhow::Error {
    let Some((last, rest)) = linked.split_last() else { return err };
    let names = if rest.is_empty() { last.clone() } else { format!("{} and {last}", rest.join(", ")) };
    let verb = if rest.is_empty() { "is a symlink" } else { "are symlinks" };
    anyhow::anyhow!(
        "{TEMPLATE_REFUSED}its {names} {verb}, where a sandbox's set-up mounts directories of its own; \
         make them directories in the image ({err:#})"
    )
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
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_name_replaces_an_earlier_one_in_etc_hosts() {
        let fresh = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";
        let once = hosts_with_name(fresh, "aaa");
        assert_eq!(once, format!("{fresh}127.0.1.1\taaa\n"));
        // A root committed by a build carries its builder's line (and maybe an image's own).
        let twice = hosts_with_name(&format!("127.0.1.1 debian\n{once}# 127.0.1.1 stays\n"), "bbb");
        assert_eq!(twice, format!("{fresh}# 127.0.1.1 stays\n127.0.1.1\tbbb\n"));
        assert_eq!(hosts_with_name("", "ccc"), "127.0.1.1\tccc\n");
        assert_eq!(hosts_with_name("127.0.0.1 localhost", "d"), "127.0.0.1 localhost\n127.0.1.1\td\n");
    }
}
