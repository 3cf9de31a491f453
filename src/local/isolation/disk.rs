//! Per-sandbox disk limit (`local.disk_limit_mb`): every sandbox writes (its
//! overlay upper layers, `/tmp`, `/home`, `/root`) into its own sparse ext4
//! image of that size, so writes past the limit fail with `ENOSPC` inside while
//! the host's free space only shrinks by what was really written.
//!
//! The host side keeps a small pool of images (`STATE/disk-pool`) that are
//! formatted, attached to a loop device (auto-clear) and mounted as *detached*
//! mounts (`fsmount`: in no mount namespace, held only by a descriptor of the
//! provider), so creating a sandbox waits neither for `mkfs` nor for the loop
//! device and the ext4 mount: the sandbox's agent receives the descriptor and
//! moves the mount into its own mount namespace. Nothing of a pooled disk
//! outlives the provider process: its descriptors close on exit (crash
//! included), which unmounts the filesystem and frees the loop device; the
//! unused image files stay and are mounted again on the next start. Where the
//! kernel refuses detached mounts, the sandbox attaches and mounts its image
//! itself (slower).

use std::ffi::{CStr, CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Disks kept ready. A burst of creates beyond it makes the rest on the spot.
pub const POOL_SIZE: usize = 8;

/// Errors of making or attaching an image.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("mkfs.ext4 failed for {path}: {detail}")]
    Mkfs { path: PathBuf, detail: String },
    #[error("preparing a disk failed: {0}")]
    Task(String),
    #[error("cannot mount the disk image {path} ({what}): {source}")]
    Mount { what: &'static str, path: PathBuf, source: std::io::Error },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io { what, path: path.to_owned(), source }
}

/// A disk for a new sandbox: its image file and, unless the kernel refused, its ext4 filesystem
/// mounted as a detached mount (dropping the descriptor unmounts it and frees the loop device).
pub struct PreparedDisk {
    pub image: PathBuf,
    pub mount: Option<OwnedFd>,
}

/// The provider's pool of ready disks of one size, owned by one host uid (the sandboxes' root).
pub struct DiskPool {
    dir: PathBuf,
    size_mb: u64,
    root_owner: u32,
    /// False once the kernel refused a detached mount: sandboxes then mount their image.
    premount: AtomicBool,
    refilling: AtomicBool,
    ready: Mutex<Vec<PreparedDisk>>,
    /// Formatted images found in the pool directory at start (left by a previous run).
    leftover: Mutex<Vec<PathBuf>>,
    serial: AtomicU64,
}

impl DiskPool {
    /// Prepares the pool directory (dropping images of another size or owner and unfinished ones)
    /// and prepares one disk, which proves `mkfs.ext4` and loop devices work here.
    pub fn new(state_dir: &Path, size_mb: u64, root_owner: u32) -> Result<DiskPool, DiskError> {
        let dir = state_dir.join("disk-pool");
        std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
        let pool = DiskPool {
            dir,
            size_mb,
            root_owner,
            premount: AtomicBool::new(true),
            refilling: AtomicBool::new(false),
            ready: Mutex::new(Vec::new()),
            leftover: Mutex::new(Vec::new()),
            serial: AtomicU64::new(0),
        };
        let mut leftover = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&pool.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if is_pool_image(&name, &pool.prefix()) {
                    leftover.push(entry.path());
                } else {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        *crate::sync::lock(&pool.leftover) = leftover;
        let first = pool.prepare_one()?;
        crate::sync::lock(&pool.ready).push(first);
        Ok(pool)
    }

    fn prefix(&self) -> String {
        pool_prefix(self.size_mb, self.root_owner)
    }

    /// The limit in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_mb * 1024 * 1024
    }

    /// Disks ready now.
    pub fn ready_count(&self) -> usize {
        crate::sync::lock(&self.ready).len()
    }

    /// A formatted image in the pool directory: a leftover one, or a new one.
    fn image(&self) -> Result<PathBuf, DiskError> {
        if let Some(image) = crate::sync::lock(&self.leftover).pop() {
            return Ok(image);
        }
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        let (tmp, done) = image_names(&self.prefix(), std::process::id(), n);
        let tmp = self.dir.join(tmp);
        make_image(&tmp, self.size_mb, self.root_owner)?;
        let done = self.dir.join(done);
        std::fs::rename(&tmp, &done).map_err(io("cannot rename", &tmp))?;
        Ok(done)
    }

    /// A formatted image, mounted detached when the kernel allows it.
    fn prepare_one(&self) -> Result<PreparedDisk, DiskError> {
        let image = self.image()?;
        if !self.premount.load(Ordering::Acquire) {
            return Ok(PreparedDisk { image, mount: None });
        }
        match mount_detached(&image) {
            Ok(mount) => Ok(PreparedDisk { image, mount: Some(mount) }),
            Err(err) => {
                // Sandboxes then attach and mount their image themselves (on the create path).
                tracing::warn!(%err, "disk images cannot be mounted ahead of time; sandboxes mount their own (slower)");
                self.premount.store(false, Ordering::Release);
                Ok(PreparedDisk { image, mount: None })
            }
        }
    }

    /// Moves a ready disk's image to `dest` and returns its detached mount, if any; `None` when the
    /// pool is empty. Quick (a rename): fine on an async thread.
    pub fn take_ready(&self, dest: &Path) -> Option<Result<Option<OwnedFd>, DiskError>> {
        let disk = crate::sync::lock(&self.ready).pop()?;
        Some(Self::place(disk, dest))
    }

    /// Like [`take_ready`](Self::take_ready), preparing a disk on the spot if the pool is empty
    /// (slow: `mkfs.ext4`; call from a blocking thread).
    pub fn take(&self, dest: &Path) -> Result<Option<OwnedFd>, DiskError> {
        match self.take_ready(dest) {
            Some(taken) => taken,
            None => Self::place(self.prepare_one()?, dest),
        }
    }

    fn place(disk: PreparedDisk, dest: &Path) -> Result<Option<OwnedFd>, DiskError> {
        // The loop device holds the image open: renaming it does not disturb the mount.
        std::fs::rename(&disk.image, dest).map_err(io("cannot move", &disk.image))?;
        Ok(disk.mount)
    }

    /// Whether a refill is running.
    pub fn refilling(&self) -> bool {
        self.refilling.load(Ordering::Acquire)
    }

    /// Tops the pool up to its size (one refill at a time; call from a thread of its own, which
    /// runs at a lower priority so that creates keep the CPU).
    pub fn refill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: setpriority on the calling thread (nice values are per thread on Linux), which
        // the `mkfs.ext4` it starts inherits.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
        while self.ready_count() < POOL_SIZE {
            match self.prepare_one() {
                Ok(disk) => crate::sync::lock(&self.ready).push(disk),
                Err(err) => {
                    tracing::warn!(%err, "cannot refill the sandbox disk pool");
                    break;
                }
            }
        }
        self.refilling.store(false, Ordering::Release);
    }
}

/// Name prefix of a pool's images: their size and owner (`512m-1000000000-`), so that a pool
/// never takes an image of another size or owner.
fn pool_prefix(size_mb: u64, root_owner: u32) -> String {
    format!("{size_mb}m-{root_owner}-")
}

/// Whether `name`, in the pool directory, is a finished image of the pool whose prefix is
/// `prefix` (kept for reuse); anything else (another size or owner, an image left half made) is
/// removed at start.
fn is_pool_image(name: &str, prefix: &str) -> bool {
    name.starts_with(prefix) && name.ends_with(".img")
}

/// The names of a new pool image while `mkfs` runs and once it is done: a crash in between
/// leaves only a name that [`is_pool_image`] refuses.
fn image_names(prefix: &str, pid: u32, serial: u64) -> (String, String) {
    let name = format!("{prefix}{pid}-{serial}");
    (format!(".{name}.tmp"), format!("{name}.img"))
}

/// The program that formats images.
const MKFS: &str = "mkfs.ext4";
/// The `PATH` [`MKFS`] is looked up in (the provider's own may lack the sbin directories).
const MKFS_SEARCH_PATH: &str = "/usr/sbin:/sbin:/usr/bin:/bin";

/// How [`make_image`] makes an image: the length of the sparse file and the arguments of
/// [`MKFS`] that format it.
#[derive(Debug, PartialEq, Eq)]
struct MkfsPlan {
    len: u64,
    args: Vec<OsString>,
}

/// The image of `size_mb` at `path`: no reserved blocks and no journal (a sandbox's scratch
/// disk), inode tables zeroed lazily, no discard of the sparse file, and the root directory
/// owned by `root_owner` (the sandbox's root, a host uid of its id range).
fn mkfs_plan(path: &Path, size_mb: u64, root_owner: u32) -> MkfsPlan {
    let mut args: Vec<OsString> = ["-q", "-F", "-m", "0", "-O", "^has_journal", "-E"].map(OsString::from).into();
    args.push(format!("lazy_itable_init=1,nodiscard,root_owner={root_owner}:{root_owner}").into());
    args.push(path.into());
    MkfsPlan { len: size_mb * 1024 * 1024, args }
}

/// Makes a sparse ext4 image of `size_mb` whose root directory belongs to `root_owner`.
pub fn make_image(path: &Path, size_mb: u64, root_owner: u32) -> Result<(), DiskError> {
    let plan = mkfs_plan(path, size_mb, root_owner);
    let file = std::fs::File::create(path).map_err(io("cannot create", path))?;
    file.set_len(plan.len).map_err(io("cannot size", path))?;
    drop(file);
    let out = Command::new(MKFS).args(&plan.args).env("PATH", MKFS_SEARCH_PATH).output();
    let detail = match out {
        Ok(out) if out.status.success() => return Ok(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(err) => format!("cannot run mkfs.ext4 ({err}); install e2fsprogs or set local.disk_limit_mb = 0"),
    };
    let _ = std::fs::remove_file(path);
    Err(DiskError::Mkfs { path: path.to_owned(), detail })
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_config` of `<linux/loop.h>` (with its `struct loop_info64`).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
    reserved: [u64; 8],
}

/// The loop device configuration for the image open at `backing`: auto-clear, whole file, no
/// encryption (all else zero).
fn loop_config(backing: std::os::fd::RawFd) -> LoopConfig {
    // SAFETY: all-zero is a valid loop_config.
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = backing as u32;
    config.lo_flags = LO_FLAGS_AUTOCLEAR;
    config
}

/// Attaches the open `backing` image to a free loop device with auto-clear (the device is released
/// when its last user, the mounted filesystem, lets go of it) and returns the device, open.
fn attach_loop(backing: &std::fs::File) -> std::io::Result<(String, std::fs::File)> {
    let control = std::fs::OpenOptions::new().read(true).write(true).open("/dev/loop-control")?;
    let mut last_err = None;
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dev_path = format!("/dev/loop{n}");
        let dev = match std::fs::OpenOptions::new().read(true).write(true).open(&dev_path) {
            Ok(dev) => dev,
            Err(err) => {
                last_err = Some(err);
                continue;
            }
        };
        let config = loop_config(backing.as_raw_fd());
        // SAFETY: LOOP_CONFIGURE reads a loop_config we own.
        let ret = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &config as *const LoopConfig) };
        if ret != 0 {
            // Another process took this device between GET_FREE and CONFIGURE: try the next.
            last_err = Some(std::io::Error::last_os_error());
            continue;
        }
        return Ok((dev_path, dev));
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no free loop device")))
}

/// Attaches `image` to a free loop device (auto-clear: it is released when unmounted) and mounts
/// it at `target` in the caller's mount namespace (used when the disk could not be mounted ahead
/// of time, see [`mount_detached`]).
pub fn mount_image(image: &Path, target: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .with_context(|| format!("opening the disk image {}", image.display()))?;
    let (dev_path, dev) = attach_loop(&backing).context(
        "attaching the disk image to a loop device (the disk limit needs loop devices; or set local.disk_limit_mb = 0)",
    )?;
    let mounted =
        nix::mount::mount(Some(dev_path.as_str()), target, Some("ext4"), IMAGE_MOUNT_FLAGS, Some(NOINIT_ITABLE));
    // The mount holds the device; closing our descriptor lets auto-clear free it on unmount.
    drop(dev);
    mounted.with_context(|| format!("mounting the disk image on {dev_path}"))
}

/// How a sandbox's disk is mounted, by the sandbox ([`mount_image`]) or ahead of time
/// ([`mount_detached`]: [`DETACHED_MOUNT_ATTRS`]): no set-uid programs, no device nodes.
const IMAGE_MOUNT_FLAGS: nix::mount::MsFlags = nix::mount::MsFlags::MS_NOSUID.union(nix::mount::MsFlags::MS_NODEV);
/// The ext4 option of both mounts: a fresh sparse image reads as zeros, so no background
/// zeroing of its inode tables.
const NOINIT_ITABLE: &CStr = c"noinit_itable";

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// The attributes of the detached mount (those of [`IMAGE_MOUNT_FLAGS`]).
const DETACHED_MOUNT_ATTRS: libc::c_uint = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

/// One `fsconfig(2)` call that configures the detached mount's filesystem, and what its error
/// says failed.
#[derive(Debug, PartialEq, Eq)]
struct FsConfig {
    cmd: libc::c_uint,
    key: Option<&'static CStr>,
    value: Option<CString>,
    what: &'static str,
}

/// The `fsconfig(2)` calls, in order, that make the ext4 filesystem on the loop device
/// `dev_path`: its source, [`NOINIT_ITABLE`], then the superblock.
fn detached_config(dev_path: String) -> Result<Vec<FsConfig>, std::ffi::NulError> {
    let source = CString::new(dev_path)?;
    Ok(vec![
        FsConfig { cmd: FSCONFIG_SET_STRING, key: Some(c"source"), value: Some(source), what: "fsconfig(source)" },
        FsConfig { cmd: FSCONFIG_SET_FLAG, key: Some(NOINIT_ITABLE), value: None, what: "fsconfig(noinit_itable)" },
        FsConfig { cmd: FSCONFIG_CMD_CREATE, key: None, value: None, what: "fsconfig(create)" },
    ])
}

/// A descriptor returned by a system call, or its error.
fn owned_fd(ret: libc::c_long) -> std::io::Result<OwnedFd> {
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the call returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

fn fsconfig(fs: &OwnedFd, cmd: libc::c_uint, key: Option<&CStr>, value: Option<&CStr>) -> std::io::Result<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: fsconfig on our filesystem context with NUL-terminated strings (or nulls).
    let ret = unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, ptr(key), ptr(value), 0) };
    if ret != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Attaches `image` to a loop device and mounts its ext4 filesystem (nosuid, nodev) as a detached
/// mount: in no mount namespace, alive as long as the returned descriptor (or the mount namespace
/// it is moved into with [`attach_detached`]). Dropping the descriptor unmounts it and frees the
/// loop device.
pub fn mount_detached(image: &Path) -> Result<OwnedFd, DiskError> {
    let fail = |what: &'static str| move |source| DiskError::Mount { what, path: image.to_owned(), source };
    let backing = std::fs::OpenOptions::new().read(true).write(true).open(image).map_err(io("cannot open", image))?;
    let (dev_path, dev) = attach_loop(&backing).map_err(fail("attaching a loop device"))?;
    drop(backing);
    // SAFETY: fsopen with a NUL-terminated filesystem name.
    let fs = owned_fd(unsafe { libc::syscall(libc::SYS_fsopen, c"ext4".as_ptr(), FSOPEN_CLOEXEC) })
        .map_err(fail("fsopen(ext4)"))?;
    let config = detached_config(dev_path).map_err(|e| fail("device path")(std::io::Error::other(e)))?;
    for step in &config {
        fsconfig(&fs, step.cmd, step.key, step.value.as_deref()).map_err(fail(step.what))?;
    }
    // SAFETY: fsmount on our configured filesystem context.
    let mount =
        owned_fd(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, DETACHED_MOUNT_ATTRS) })
            .map_err(fail("fsmount"))?;
    // The superblock holds the device; closing ours lets auto-clear free it once unmounted.
    drop(dev);
    Ok(mount)
}

/// Moves a detached mount made by [`mount_detached`] onto `target` in the caller's mount namespace.
pub fn attach_detached(mount: OwnedFd, target: &Path) -> std::io::Result<()> {
    let dst = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: move_mount of a detached mount we own onto a NUL-terminated target path.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Used/total bytes of the filesystem at `path` (statvfs).
pub fn usage(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size();
    let total = st.blocks() * frag;
    Some((total.saturating_sub(st.blocks_free() * frag), total))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::Path;

    use super::*;

    #[test]
    fn mkfs_formats_a_sparse_image_of_the_limit_owned_by_the_sandboxs_root() {
        let plan = mkfs_plan(Path::new("/state/disk-pool/.x.tmp"), 512, 1_000_000_000);
        assert_eq!(plan.len, 512 * 1024 * 1024);
        let args: Vec<&str> = plan.args.iter().filter_map(|a| a.to_str()).collect();
        assert_eq!(
            args,
            [
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=1,nodiscard,root_owner=1000000000:1000000000",
                "/state/disk-pool/.x.tmp",
            ]
        );
        // The image is the last argument, whatever bytes its path has.
        let odd = Path::new("/s/-E x,root_owner=0:0");
        assert_eq!(mkfs_plan(odd, 1, 7).args.last(), Some(&OsString::from(odd)));
        assert_eq!(mkfs_plan(odd, 1, 7).args[7], OsString::from("lazy_itable_init=1,nodiscard,root_owner=7:7"));
    }

    #[test]
    fn a_pool_keeps_only_its_own_finished_images() {
        let prefix = pool_prefix(512, 1_000_000_000);
        let (tmp, done) = image_names(&prefix, 4242, 3);
        assert_eq!(done, "512m-1000000000-4242-3.img");
        assert!(is_pool_image(&done, &prefix));
        // An image whose mkfs did not finish (the provider crashed) is never reused.
        assert!(!is_pool_image(&tmp, &prefix), "{tmp}");
        // Nor one of another size or another owner, even one whose numbers start alike.
        for other in [pool_prefix(51, 1_000_000_000), pool_prefix(5120, 1_000_000_000), pool_prefix(512, 100_000_000)] {
            let (_, other_done) = image_names(&other, 4242, 3);
            assert!(!is_pool_image(&other_done, &prefix), "{other_done} taken by {prefix}");
        }
        assert!(!is_pool_image(&format!("{prefix}1-0.img.part"), &prefix));
    }

    #[test]
    fn the_detached_mount_sets_its_source_and_options_then_creates() {
        let config = detached_config("/dev/loop7".to_owned()).unwrap();
        let calls: Vec<(libc::c_uint, Option<&str>, Option<&str>)> = config
            .iter()
            .map(|c| (c.cmd, c.key.and_then(|k| k.to_str().ok()), c.value.as_deref().and_then(|v| v.to_str().ok())))
            .collect();
        assert_eq!(
            calls,
            [
                (FSCONFIG_SET_STRING, Some("source"), Some("/dev/loop7")),
                (FSCONFIG_SET_FLAG, Some("noinit_itable"), None),
                (FSCONFIG_CMD_CREATE, None, None),
            ]
        );
        assert!(detached_config("/dev/loop\0".to_owned()).is_err());
        // The kernel's numbers (<linux/mount.h>).
        assert_eq!((FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE), (0, 1, 6));
    }

    #[test]
    fn both_ways_of_mounting_a_disk_forbid_setuid_and_devices() {
        use nix::mount::MsFlags;
        assert_eq!(IMAGE_MOUNT_FLAGS, MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        assert_eq!(DETACHED_MOUNT_ATTRS, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        // <linux/mount.h>: MOUNT_ATTR_RDONLY 1, NOSUID 2, NODEV 4, NOEXEC 8.
        assert_eq!((MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV), (0x2, 0x4));
        assert_eq!(NOINIT_ITABLE.to_str(), Ok("noinit_itable"));
    }

    #[test]
    fn the_loop_device_config_matches_the_kernels_struct_and_clears_itself() {
        // struct loop_config: fd, block_size, struct loop_info64 (232 bytes), __u64 __reserved[8].
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
        assert_eq!(std::mem::offset_of!(LoopConfig, lo_device), 8);
        assert_eq!(std::mem::offset_of!(LoopConfig, lo_flags), 8 + 52);
        assert_eq!(std::mem::offset_of!(LoopConfig, lo_file_name), 8 + 56);
        assert_eq!(std::mem::offset_of!(LoopConfig, reserved), 8 + 232);
        let config = loop_config(9);
        assert_eq!((config.fd, config.lo_flags, config.block_size), (9, LO_FLAGS_AUTOCLEAR, 0));
        assert_eq!((config.lo_offset, config.lo_sizelimit, config.lo_encrypt_type), (0, 0, 0));
        // <linux/loop.h>: LO_FLAGS_AUTOCLEAR 4, LOOP_CONFIGURE 0x4C0A, LOOP_CTL_GET_FREE 0x4C82.
        assert_eq!((LO_FLAGS_AUTOCLEAR, LOOP_CONFIGURE, LOOP_CTL_GET_FREE), (4, 0x4C0A, 0x4C82));
    }
}
