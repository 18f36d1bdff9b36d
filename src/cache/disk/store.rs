//! The disk cache as a [`Store`]: the first implementation of the store seam, and the one the others
//! are measured against. Every operation is the disk protocol described in `mod.rs`, unchanged:
//! verified reads, the key's `flock` build lock (single flight across processes), leaf locks for
//! writers and removers, eviction after puts.
//!
//! The trait's methods share names with the inherent ones they wrap (which keep their own signatures
//! and counting): `Store::get(&cache, key, access)` calls the trait's.

use std::io;
use std::time::Duration;

use super::stats::bump;
use super::{Lookup, PersistentCache, PutOutcome, StoreKey, WarnCause};
use crate::cache::store::{
    Access, BuildLock, LockGuard, Provenance, Removal, Store, StoreEntry, StoreHit, StoreKind,
    StoreStats,
};

impl Store for PersistentCache {
    fn name(&self) -> String {
        format!("disk:{}", self.root().display())
    }

    fn kind(&self) -> StoreKind {
        StoreKind::Disk
    }

    fn get(&self, key: &StoreKey, access: Access) -> Option<StoreHit> {
        let hit = match access {
            Access::ReadWrite => PersistentCache::get(self, key),
            Access::ReadOnly => self.get_read_only(key),
        }?;
        let build_time = hit.build_time();
        Some(StoreHit::verified(hit.into_bytes(), build_time))
    }

    fn lock_for_build(&self, key: &StoreKey) -> BuildLock {
        match PersistentCache::lock_for_build(self, key) {
            Lookup::Hit(hit) => {
                let build_time = hit.build_time();
                BuildLock::Published(StoreHit::verified(hit.into_bytes(), build_time))
            }
            // A key outside the image size limits is never stored here, so this store has nothing to
            // single-flight: a later store may.
            Lookup::Miss(guard) if !guard.persists() => BuildLock::NotOffered,
            Lookup::Miss(guard) if guard.holds_lock() => BuildLock::Held(LockGuard::new(guard)),
            Lookup::Miss(_) => BuildLock::Unavailable,
        }
    }

    fn note_recompiled(&self, build_time: Duration) {
        PersistentCache::note_recompiled(self, build_time);
    }

    fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
        // The lookup that preceded this put already counted a key outside the size limits as skipped;
        // counting it again would make one request two.
        if !self.persists_image_of_size(key.image_len()) {
            return PutOutcome::Skipped;
        }
        PersistentCache::put(self, key, bytes, build_time)
    }

    fn put_copy(
        &self,
        key: &StoreKey,
        bytes: &[u8],
        build_time: Duration,
        provenance: Option<&Provenance>,
    ) -> PutOutcome {
        if !self.persists_image_of_size(key.image_len()) {
            return PutOutcome::Skipped;
        }
        PersistentCache::put_copy(self, key, bytes, build_time, provenance)
    }

    fn remove(&self, key: &StoreKey, what: Removal<'_>) -> bool {
        match what {
            Removal::Any => PersistentCache::remove(self, key, None),
            Removal::Refused { bytes, reason } => {
                let i = &self.inner;
                bump(&i.counters.rejected, 1);
                i.warned.warn(
                    &i.s.warnings,
                    WarnCause::Rejected,
                    &self.entry_dir(key),
                    &format_args!("the backend refused a verified binary ({reason})"),
                );
                i.trace(|| {
                    tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), %reason, "rejected")
                });
                PersistentCache::remove(self, key, Some(bytes))
            }
        }
    }

    fn explain_miss(&self, key: &StoreKey) -> Option<super::MissExplanation> {
        Some(PersistentCache::explain_miss(self, key))
    }

    fn list(&self) -> io::Result<Vec<StoreEntry>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter_map(|e| {
                Some(StoreEntry {
                    record: e.record?,
                    bytes: e.bytes,
                    last_access: Some(e.last_access),
                })
            })
            .collect())
    }

    fn stats(&self) -> StoreStats {
        PersistentCache::stats(self).into()
    }
}
