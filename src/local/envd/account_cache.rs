//! Accounts resolved before, kept while the files they came from stay unchanged. Resolving a user
//! through glibc (`getpwnam_r`, `getgrouplist`) reads `/etc/nsswitch.conf`, `/etc/passwd`,
//! `/etc/group` and `/proc/sys/kernel/ngroups_max` again on every request: 17 system calls and
//! the parsing, about as much as the rest of envd's own work to start a command. Here a request
//! costs three `stat`s while the files are as they were.
//!
//! A cached account is used only while each file has the same device, inode, size, modification
//! and change time as when it was cached (a file that is missing stays missing). Any write to a
//! file changes its change time, which nobody can set; a replaced file has another inode. So that
//! a write in the same clock tick as the `stat` cannot go unseen on kernels with coarse
//! timestamps, nothing is cached while a file changed less than [`SETTLE`] ago.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a file must have been left alone before accounts read from it are kept.
pub const SETTLE: Duration = Duration::from_secs(1);

/// What identifies one version of a file, as far as `stat` can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

/// Values resolved from `N` watched files, by key, while the files' stamps hold.
pub struct AccountCache<K, V, const N: usize> {
    files: [PathBuf; N],
    settle: Duration,
    kept: Mutex<Option<Kept<K, V, N>>>,
}

/// Values, and the stamps the files had when they were resolved (`None`: missing or unreadable).
struct Kept<K, V, const N: usize> {
    stamps: [Option<Stamp>; N],
    values: HashMap<K, V>,
}

impl<K: Eq + Hash, V: Clone, const N: usize> AccountCache<K, V, N> {
    /// A cache of values that depend on `files` only.
    pub fn new(files: [PathBuf; N]) -> Self {
        Self::settling_for(files, SETTLE)
    }

    /// The same, with another settling time than [`SETTLE`].
    fn settling_for(files: [PathBuf; N], settle: Duration) -> Self {
        Self { files, settle, kept: Mutex::new(None) }
    }

    /// The value for `key`: the kept one while the files are unchanged and settled, else what
    /// `resolve` gives (kept when it succeeds and the files are settled; errors are never kept).
    pub fn get<Q, E>(&self, key: &Q, resolve: impl FnOnce(&Q) -> Result<V, E>) -> Result<V, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let stamps = self.files.each_ref().map(|path| stamp(path));
        let settled = settled(&stamps, SystemTime::now(), self.settle);
        {
            let mut kept = crate::sync::lock(&self.kept);
            match kept.as_ref() {
                Some(kept_now) if settled && kept_now.stamps == stamps => {
                    if let Some(value) = kept_now.values.get(key) {
                        return Ok(value.clone());
                    }
                }
                Some(_) => *kept = None,
                None => {}
            }
        }
        let value = resolve(key)?;
        if settled {
            let mut kept = crate::sync::lock(&self.kept);
            let kept = kept.get_or_insert_with(|| Kept { stamps, values: HashMap::new() });
            // Another request may have refilled it from other versions of the files meanwhile.
            if kept.stamps == stamps {
                kept.values.insert(key.to_owned(), value.clone());
            }
        }
        Ok(value)
    }
}

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
    Some(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
        ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
    })
}

/// Whether every present file last changed at least `settle` before `now`.
fn settled(stamps: &[Option<Stamp>], now: SystemTime, settle: Duration) -> bool {
    let Ok(now) = now.duration_since(UNIX_EPOCH) else { return false };
    let limit = i128::try_from(now.saturating_sub(settle).as_nanos()).unwrap_or(i128::MAX);
    stamps.iter().flatten().all(|s| s.ctime_ns < limit)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::Write;

    use super::*;

    const TEST_SETTLE: Duration = Duration::from_millis(100);

    /// Waits until the files are settled (a change time cannot be set back).
    fn let_settle() {
        std::thread::sleep(TEST_SETTLE + Duration::from_millis(20));
    }

    #[test]
    fn a_value_is_kept_until_a_watched_file_changes_in_any_way() {
        let dir = tempfile::tempdir().unwrap();
        let (passwd, group) = (dir.path().join("passwd"), dir.path().join("group"));
        std::fs::write(&passwd, "bob:x:1234\n").unwrap();
        let cache = AccountCache::settling_for([passwd.clone(), group.clone()], TEST_SETTLE);
        let calls = Cell::new(0);
        let resolve = |key: &str| -> Result<String, ()> {
            calls.set(calls.get() + 1);
            Ok(format!("{key}@{}", std::fs::read_to_string(&passwd).unwrap_or_default().trim()))
        };

        // Fresh files: resolved every time, nothing kept.
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1234".into()));
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1234".into()));
        assert_eq!(calls.get(), 2);

        let_settle();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1234".into()));
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1234".into()));
        assert_eq!(calls.get(), 3, "settled and unchanged: kept");

        // Rewritten in place, same size, at once: seen.
        let mut file = std::fs::OpenOptions::new().write(true).truncate(true).open(&passwd).unwrap();
        file.write_all(b"bob:x:1235\n").unwrap();
        drop(file);
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(calls.get(), 4);

        // Rewritten again, and settled before the next request: seen (the stamps differ).
        let_settle();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(calls.get(), 5);
        std::fs::write(&passwd, "bob:x:1236\n").unwrap();
        let_settle();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1236".into()));
        assert_eq!(calls.get(), 6);
        std::fs::write(&passwd, "bob:x:1235\n").unwrap();

        // A file that appears (the missing group file) is a change too.
        let_settle();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(calls.get(), 7);
        std::fs::write(&group, "bob:x:1234:\n").unwrap();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(calls.get(), 8);

        // Replaced by a rename (as useradd and sed -i do): seen.
        let_settle();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:1235".into()));
        assert_eq!(calls.get(), 9);
        let staged = dir.path().join("passwd.new");
        std::fs::write(&staged, "bob:x:4321\n").unwrap();
        std::fs::rename(&staged, &passwd).unwrap();
        assert_eq!(cache.get("bob", resolve), Ok("bob@bob:x:4321".into()));
        assert_eq!(calls.get(), 10);
    }

    #[test]
    fn errors_are_never_kept() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "root:x:0\n").unwrap();
        let_settle();
        let cache: AccountCache<String, u32, 1> = AccountCache::settling_for([passwd], TEST_SETTLE);
        let calls = Cell::new(0);
        let missing = |_: &str| -> Result<u32, &str> {
            calls.set(calls.get() + 1);
            Err("no such user")
        };
        assert_eq!(cache.get("ghost", missing), Err("no such user"));
        assert_eq!(cache.get("ghost", missing), Err("no such user"));
        assert_eq!(calls.get(), 2);
        assert_eq!(cache.get("root", |_| Ok::<u32, &str>(0)), Ok(0));
        assert_eq!(cache.get("root", |_| Err("not asked")), Ok(0));
    }

    #[test]
    fn recently_changed_files_are_not_settled() {
        let changed_at = |ctime_ns: i128| Some(Stamp { dev: 1, ino: 2, size: 3, mtime_ns: 0, ctime_ns });
        let now = UNIX_EPOCH + Duration::from_secs(100);
        let second = 1_000_000_000;
        assert!(settled(&[changed_at(98 * second), None], now, SETTLE));
        assert!(!settled(&[changed_at(98 * second), changed_at(100 * second)], now, SETTLE));
        assert!(!settled(&[changed_at(99 * second + second / 2)], now, SETTLE));
        assert!(settled(&[None, None], now, SETTLE));
        // A modification time set into the future (touch -d) does not matter: only the change time.
        let future_mtime = Some(Stamp { dev: 1, ino: 2, size: 3, mtime_ns: 500 * second, ctime_ns: 90 * second });
        assert!(settled(&[future_mtime], now, SETTLE));
    }
}
