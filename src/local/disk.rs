//! Per-sandbox disk limit (`local.disk_limit_mb`): every sandbox writes (its
//! overlay upper layers, `/tmp`, `/home`, `/root`) into its own sparse ext4
//! image of that size, loop-mounted inside the sandbox's mount namespace, so
//! writes past the limit fail with `ENOSPC` inside while the host's free space
//! only shrinks by what was really written. The host side keeps a small pool
//! of formatted images (`STATE/disk-pool`) so creating a sandbox does not wait
//! for `mkfs`; the sandbox side attaches the image to a free loop device with
//! auto-clear, so the device goes away with the sandbox's mount namespace.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Formatted images kept ready.
const POOL_SIZE: usize = 8;

/// Errors of making or attaching an image.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("mkfs.ext4 failed for {path}: {detail}")]
    Mkfs { path: PathBuf, detail: String },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io { what, path: path.to_owned(), source }
}

/// The provider's pool of ready images of one size, owned by one host uid (the sandboxes' root).
pub struct DiskPool {
    dir: PathBuf,
    size_mb: u64,
    root_owner: u32,
    refilling: AtomicBool,
    taken: Mutex<u64>,
}

impl DiskPool {
    /// Prepares the pool directory (dropping images of another size or owner) and makes one image,
    /// which proves `mkfs.ext4` works here.
    pub fn new(state_dir: &Path, size_mb: u64, root_owner: u32) -> Result<DiskPool, DiskError> {
        let dir = state_dir.join("disk-pool");
        std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
        let pool = DiskPool { dir, size_mb, root_owner, refilling: AtomicBool::new(false), taken: Mutex::new(0) };
        if let Ok(entries) = std::fs::read_dir(&pool.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with(&pool.prefix()) || !name.ends_with(".img") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        if pool.ready().is_empty() {
            pool.make_one()?;
        }
        Ok(pool)
    }

    fn prefix(&self) -> String {
        format!("{}m-{}-", self.size_mb, self.root_owner)
    }

    /// The limit in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_mb * 1024 * 1024
    }

    fn ready(&self) -> Vec<PathBuf> {
        let prefix = self.prefix();
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn make_one(&self) -> Result<PathBuf, DiskError> {
        let n = {
            let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
            *taken += 1;
            *taken
        };
        let name = format!("{}{}-{n}", self.prefix(), std::process::id());
        let tmp = self.dir.join(format!(".{name}.tmp"));
        make_image(&tmp, self.size_mb, self.root_owner)?;
        let done = self.dir.join(format!("{name}.img"));
        std::fs::rename(&tmp, &done).map_err(io("cannot rename", &tmp))?;
        Ok(done)
    }

    /// Moves a ready image to `dest` (making one on the spot if the pool is empty).
    pub fn take(&self, dest: &Path) -> Result<(), DiskError> {
        for image in self.ready() {
            if std::fs::rename(&image, dest).is_ok() {
                return Ok(());
            }
        }
        let image = self.make_one()?;
        std::fs::rename(&image, dest).map_err(io("cannot move", &image))
    }

    /// Tops the pool up to its size (one refill at a time; call from a blocking thread).
    pub fn refill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        while self.ready().len() < POOL_SIZE {
            if let Err(err) = self.make_one() {
                tracing::warn!(%err, "cannot refill the sandbox disk image pool");
                break;
            }
        }
        self.refilling.store(false, Ordering::Release);
    }
}

/// Makes a sparse ext4 image of `size_mb` whose root directory belongs to `root_owner`.
pub fn make_image(path: &Path, size_mb: u64, root_owner: u32) -> Result<(), DiskError> {
    let file = std::fs::File::create(path).map_err(io("cannot create", path))?;
    file.set_len(size_mb * 1024 * 1024).map_err(io("cannot size", path))?;
    drop(file);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
        .arg("-E")
        .arg(format!("lazy_itable_init=1,nodiscard,root_owner={root_owner}:{root_owner}"))
        .arg(path)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output();
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

/// Attaches `image` to a free loop device (auto-clear: it is released when unmounted) and mounts
/// it at `target` in the caller's mount namespace.
pub fn mount_image(image: &Path, target: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .with_context(|| format!("opening the disk image {}", image.display()))?;
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .context("opening /dev/loop-control (the disk limit needs loop devices; or set local.disk_limit_mb = 0)")?;
    let mut last_err = None;
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("LOOP_CTL_GET_FREE");
        }
        let dev_path = format!("/dev/loop{n}");
        let dev = match std::fs::OpenOptions::new().read(true).write(true).open(&dev_path) {
            Ok(dev) => dev,
            Err(err) => {
                last_err = Some(err);
                continue;
            }
        };
        // SAFETY: all-zero is a valid loop_config.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = backing.as_raw_fd() as u32;
        config.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE reads a loop_config we own.
        let ret = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &config as *const LoopConfig) };
        if ret != 0 {
            // Another sandbox took this device between GET_FREE and CONFIGURE: try the next.
            last_err = Some(std::io::Error::last_os_error());
            continue;
        }
        let mounted = nix::mount::mount(
            Some(dev_path.as_str()),
            target,
            Some("ext4"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            None::<&str>,
        );
        // The mount holds the device; closing our descriptor lets auto-clear free it on unmount.
        drop(dev);
        return mounted.with_context(|| format!("mounting the disk image on {dev_path}"));
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no free loop device"))).context("attaching the disk image")
}

/// Used/total bytes of the filesystem at `path` (statvfs).
pub fn usage(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size();
    let total = st.blocks() * frag;
    Some((total.saturating_sub(st.blocks_free() * frag), total))
}
