//! Waiting for an object-store fleet lock (`object_lock.rs`): the same protocol as the Redis one —
//! take the key's lock, or wait (bounded by `KPC_CACHE_LOCK_TIMEOUT`) polling the remote for the
//! entry its holder publishes — with the lease object in place of `SET NX`.

use std::time::{Duration, Instant};

use super::super::names::{lock_name, token};
use super::super::object_lock::ObjectLocks;
use super::RemoteStore;
use crate::cache::store::{BuildLock, LockGuard, StoreKey, WarnCause};

impl RemoteStore {
    pub(super) fn wait_for_lease(&self, locks: &ObjectLocks, key: &StoreKey) -> BuildLock {
        let (name, token) = (lock_name(key), token());
        let deadline = Instant::now() + self.lock_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            match locks.try_acquire(&name, &token) {
                Ok(true) => {
                    let held = locks.hold(name, token);
                    // Check again even on a first try: between this process's remote miss and this
                    // lease, another machine may have built, published and released the key.
                    if let Some(hit) = self.fetch_as(key, true) {
                        return BuildLock::Published(hit);
                    }
                    return BuildLock::Held(LockGuard::new(held));
                }
                Ok(false) => {}
                Err(f) => {
                    if !f.skipped {
                        self.shared.counters.error();
                        self.shared.warnings.warn(
                            f.cause,
                            &format_args!("the fleet build lock failed ({})", f.detail),
                        );
                    }
                    return BuildLock::Unavailable;
                }
            }
            if let Some(done) = self.wait_for_holder(key, deadline, &mut pause) {
                return done;
            }
        }
    }

    /// One wait while another machine holds `key`'s fleet lock (either kind): past `deadline` the
    /// lock is given up (counted, warned once); else a pause that doubles up to 200 ms, then a look
    /// for the entry the holder publishes. `None`: still nothing, try the lock again.
    pub(in crate::cache::store::remote) fn wait_for_holder(
        &self,
        key: &StoreKey,
        deadline: Instant,
        pause: &mut Duration,
    ) -> Option<BuildLock> {
        let now = Instant::now();
        if now >= deadline {
            self.shared.counters.error();
            self.shared.warnings.warn(
                WarnCause::LockTimeout,
                &format_args!(
                    "another machine held the fleet build lock of {} past KPC_CACHE_LOCK_TIMEOUT ({:?})",
                    key.digest(),
                    self.lock_timeout
                ),
            );
            return Some(BuildLock::Unavailable);
        }
        std::thread::sleep((*pause).min(deadline - now));
        *pause = (*pause * 2).min(Duration::from_millis(200));
        self.fetch_as(key, true).map(BuildLock::Published)
    }
}
