//! The one policy for a poisoned mutex or read-write lock: recover the data and go on.
//!
//! A `std::sync::Mutex` is poisoned when a thread panicked while holding it. Nothing in the
//! service panics on purpose (clippy denies `unwrap`, `expect` and `panic` outside tests), and every
//! value behind these mutexes (caches, tables of sandboxes, sessions and connections, counters) is
//! valid after any partial update, so a poisoned lock is recovered, never skipped: skipping would
//! quietly stop the work behind it (a deadline renewal, a cache eviction, a cleanup).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, recovering its data if a thread panicked while holding it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `lock`, recovering its data if a thread panicked while holding it.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `lock`, recovering its data if a thread panicked while holding it.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::lock;

    #[test]
    fn a_poisoned_mutex_is_recovered_with_its_data() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let poisoner = Arc::clone(&shared);
        let joined = std::thread::spawn(move || {
            let mut guard = lock(&poisoner);
            guard.push(2);
            panic!("poison the mutex while holding it");
        })
        .join();
        assert!(joined.is_err(), "the thread must have panicked");
        assert!(shared.is_poisoned());
        lock(&shared).push(3);
        assert_eq!(*lock(&shared), vec![1, 2, 3]);
    }
}
