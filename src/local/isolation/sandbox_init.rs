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
    let root = sandbox_dir.join("root");
    let ids = spec.id_map;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making / private in the sandbox's mount namespace")?;
    // Relative names below (overlay layers, the socket) are resolved against the sandbox's directory.
    nix::unistd::chdir(sandbox_dir).context("chdir into the sandbox directory")?;

    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let userns = match userns {
        Some(userns) => userns,
        None => {
            // The host's /proc shows host pids: a procfs of this PID namespace finds the helper child.
            let own_proc = sandbox_dir.join("lower/proc");
            std::fs::create_dir_all(&own_proc).context("creating a procfs mount point")?;
            mount(Some("proc"), &own_proc, Some("proc"), nosuid_nodev_noexec, None::<&str>)
                .context("mounting a procfs")?;
            let userns = userns::create(&ids, &own_proc).context("creating the sandbox's user namespace")?;
            umount2(&own_proc, MntFlags::MNT_DETACH).context("unmounting the procfs")?;
            userns
        }
    };

    // Everything the sandbox writes lands in `data`: its own disk image when limited.
    let data = match (disk, &spec.disk_image) {
        (Some(mount), _) => {
            let disk = sandbox_dir.join("disk");
            std::fs::create_dir_all(&disk).context("creating the disk mount point")?;
            super::disk::attach_detached(mount, &disk).context("moving the prepared disk into the sandbox")?;
            disk
        }
        (None, Some(image)) => {
            let disk = sandbox_dir.join("disk");
            std::fs::create_dir_all(&disk).context("creating the disk mount point")?;
            super::disk::mount_image(image, &disk)?;
            disk
        }
        (None, None) => sandbox_dir.to_owned(),
    };
    mount_layers(sandbox_dir, &data, &root, spec, &userns)?;

    let proc_dir = ensure_dir(&root, "proc", 0o555)?;
    mount(Some("proc"), &proc_dir, Some("proc"), nosuid_nodev_noexec, None::<&str>).context("mounting /proc")?;
    protect_proc(&proc_dir)?;
    let sys_dir = ensure_dir(&root, "sys", 0o555)?;
    if let Err(err) =
        mount(Some("sysfs"), &sys_dir, Some("sysfs"), nosuid_nodev_noexec | MsFlags::MS_RDONLY, None::<&str>)
    {
        eprintln!("sandbox-mcp envd: /sys not mounted: {err}");
    }
    build_dev(&root, &ids)?;

    // Private /tmp, backed by the sandbox's disk. `base` and directory templates (a directory may
    // be a host's `/`) also get private, empty /home (with /home/user) and /root; a stored
    // template shows its own, written through the overlay (see `ensure_user_home`).
    let (host_root, host_user) = (ids.host(0), ids.host(spec.user_uid));
    bind_private(&data, &root, "tmp", 0o1777, host_root, host_root)?;
    if !spec.home_from_template {
        let home = bind_private(&data, &root, "home", 0o755, host_root, host_root)?;
        let user_home = home.join("user");
        std::fs::DirBuilder::new().mode(0o755).recursive(true).create(&user_home).context("creating /home/user")?;
        nix::unistd::chown(&user_home, Some(host_user.into()), Some(ids.host(spec.user_gid).into()))
            .context("chown /home/user")?;
        bind_private(&data, &root, "root", 0o700, host_root, host_root)?;
    }

    // A template that contains the provider's state directory (e.g. a custom template of `/`)
    // gets it hidden behind an empty read-only tmpfs.
    let state_inside = root.join(spec.state_dir.strip_prefix("/").unwrap_or(&spec.state_dir));
    if state_inside.is_dir() {
        mount(
            Some("tmpfs"),
            &state_inside,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | nosuid_nodev_noexec,
            Some("size=4k,mode=755"),
        )
        .context("hiding the state directory")?;
    }

    nix::unistd::sethostname(&spec.sandbox_id).context("sethostname")?;

    // Bind the agent's socket on the host-visible path before leaving the host's view, by its
    // relative name (the cwd is the sandbox directory): `/proc/net/unix` shows the name as bound.
    let socket = sandbox_dir.join(SOCKET_FILE);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(SOCKET_FILE).with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).context("chmod envd socket")?;

    nix::unistd::chdir(&root).context("chdir into the new root")?;
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

/// Mounts the copy-on-write root: an overlay whose lower layers are idmapped views of the
/// template root and of a stored template's further layers, plus one overlay per extra template layer (the host's `/usr` for `base`), all
/// with their upper layers in `data` (the sandbox's disk), owned by the sandbox's root.
fn mount_layers(
    sandbox_dir: &Path,
    data: &Path,
    root: &Path,
    spec: &SandboxSpec,
    userns: &OwnedFd,
) -> anyhow::Result<()> {
    let ids = spec.id_map;
    let overlay = |lower: &Path, upper: &Path, work: &Path, target: &Path| -> anyhow::Result<()> {
        for dir in [upper, work] {
            std::fs::DirBuilder::new().mode(0o755).recursive(true).create(dir).context("creating layer dirs")?;
        }
        nix::unistd::chown(upper, Some(ids.host(0).into()), Some(ids.host(0).into())).context("chown upper layer")?;
        // Relative to the sandbox directory (the cwd): the options show in the sandbox's mountinfo.
        let rel = |p: &Path| p.strip_prefix(sandbox_dir).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf());
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            rel(lower).display(),
            rel(upper).display(),
            rel(work).display()
        );
        mount(Some("overlay"), target, Some("overlay"), MsFlags::empty(), Some(opts.as_str()))
            .with_context(|| format!("mounting an overlay ({opts})"))
    };
    let lower_dir = sandbox_dir.join("lower");
    let lower_root = lower_dir.join("root");
    std::fs::create_dir_all(&lower_root).context("creating the lower layer mount point")?;
    userns::idmapped_bind(&spec.template_root, &lower_root, userns)?;
    // A stored template's further layers, each idmapped like the first; overlayfs lists its
    // lower layers top first.
    let mut stack = vec![lower_root];
    for (i, source) in spec.template_lowers.iter().enumerate() {
        let lower = lower_dir.join(format!("l{}", i + 1));
        std::fs::create_dir_all(&lower).context("creating a lower layer mount point")?;
        userns::idmapped_bind(source, &lower, userns)?;
        stack.push(lower);
    }
    let rel = |p: &Path| p.strip_prefix(sandbox_dir).map(Path::to_path_buf).unwrap_or_else(|_| p.to_path_buf());
    let lowers: Vec<String> = stack.iter().rev().map(|p| rel(p).display().to_string()).collect();
    overlay(Path::new(&lowers.join(":")), &data.join("upper"), &data.join("work"), root)?;
    for layer in &spec.template_layers {
        if layer.target.is_empty() || layer.target.contains('/') || layer.target.starts_with('.') {
            anyhow::bail!("invalid template layer target {:?}", layer.target);
        }
        let lower = lower_dir.join(&layer.target);
        std::fs::create_dir_all(&lower).context("creating a layer mount point")?;
        userns::idmapped_bind(&layer.source, &lower, userns)?;
        let layer_dir = data.join("layers").join(&layer.target);
        let target = root.join(&layer.target);
        if !target.is_dir() {
            anyhow::bail!("the template has no /{} directory for its layer", layer.target);
        }
        overlay(&lower, &layer_dir.join("upper"), &layer_dir.join("work"), &target)?;
    }
    Ok(())
}

/// Makes the host-wide knobs under `/proc` read-only and masks the sensitive files, as container
/// runtimes do.
fn protect_proc(proc_dir: &Path) -> anyhow::Result<()> {
    for rel in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let path = proc_dir.join(rel);
        if !path.exists() {
            continue;
        }
        mount(Some(&path), &path, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
            .with_context(|| format!("binding /proc/{rel}"))?;
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(None::<&str>, &path, None::<&str>, ro, None::<&str>)
            .with_context(|| format!("making /proc/{rel} read-only"))?;
    }
    for rel in ["kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats", "config.gz"] {
        let path = proc_dir.join(rel);
        if path.exists() {
            mount(Some("/dev/null"), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .with_context(|| format!("masking /proc/{rel}"))?;
        }
    }
    // Host hardware details, hidden behind empty read-only directories (as Docker does).
    for rel in ["acpi", "asound", "scsi"] {
        let path = proc_dir.join(rel);
        if path.is_dir() {
            let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("tmpfs"), &path, Some("tmpfs"), flags, Some("size=4k,mode=555"))
                .with_context(|| format!("masking /proc/{rel}"))?;
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

/// Bind-mounts a fresh directory `DIR/<name>` over `/<name>` of the new root.
fn bind_private(sandbox_dir: &Path, root: &Path, name: &str, mode: u32, uid: u32, gid: u32) -> anyhow::Result<PathBuf> {
    let source = sandbox_dir.join(format!("{name}.d"));
    std::fs::DirBuilder::new()
        .mode(mode)
        .recursive(true)
        .create(&source)
        .with_context(|| format!("creating {name}"))?;
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {name}"))?;
    nix::unistd::chown(&source, Some(uid.into()), Some(gid.into())).with_context(|| format!("chown {name}"))?;
    let target = ensure_dir(root, name, mode)?;
    mount(Some(&source), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("mounting a private /{name}"))?;
    Ok(target)
}

/// A tmpfs `/dev` with the usual device nodes bound from the host, a private devpts and `/dev/shm`.
fn build_dev(root: &Path, ids: &IdMap) -> anyhow::Result<()> {
    let dev = ensure_dir(root, "dev", 0o755)?;
    let owner = format!("uid={},gid={}", ids.host(0), ids.host(0));
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
        Some(format!("mode=755,size=64k,{owner}").as_str()),
    )
    .context("mounting /dev")?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(node);
        std::fs::File::create(&target).with_context(|| format!("creating /dev/{node}"))?;
        mount(Some(Path::new("/dev").join(node).as_path()), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .with_context(|| format!("binding /dev/{node}"))?;
    }
    let pts = ensure_dir(&dev, "pts", 0o755)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(format!("newinstance,ptmxmode=0666,mode=0620,gid={}", ids.host(5)).as_str()),
    )
    .context("mounting /dev/pts")?;
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx")).context("linking /dev/ptmx")?;
    let shm = ensure_dir(&dev, "shm", 0o1777)?;
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("mode=1777,size={SHM_SIZE_BYTES},{owner}").as_str()),
    )
    .context("mounting /dev/shm")?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
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
    use super::hosts_with_name;

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
