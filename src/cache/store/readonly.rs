//! [`ReadOnlyStore`]: any store, looked up and never changed.
//!
//! What `KPC_CACHE_READONLY_DIRS` is made of: cache directories baked into a container image or shared
//! from a read-only mount, searched after the local cache. The wrapper never forwards a put, a lock or
//! a removal, and asks the store it wraps for [`Access::ReadOnly`] lookups, so a disk cache under it
//! records no access time, quarantines or removes nothing and creates no lock file: the directory tree
//! is byte for byte what it was, whatever the lookups found.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Access, BuildLock, PutOutcome, Removal, Store, StoreEntry, StoreHit, StoreKind, StoreStats,
    StoreWarnings, WarnCause,
};
use crate::cache::store::StoreKey;

/// `inner`, read-only. Its hits are still verified by `inner` (a disk cache's checksums and key
/// records; [`StoreHit::unseal`] for others); a corrupt entry is a miss and stays where it is.
pub struct ReadOnlyStore {
    inner: Arc<dyn Store>,
    warnings: StoreWarnings,
}

impl fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadOnlyStore").field(&self.inner).finish()
    }
}

impl ReadOnlyStore {
    /// `inner`, never written, locked, evicted or repaired through this wrapper.
    pub fn new(inner: Arc<dyn Store>) -> ReadOnlyStore {
        let warnings = StoreWarnings::new(format!("readonly:{}", inner.name()));
        ReadOnlyStore { inner, warnings }
    }

    /// Sends this layer's warnings to `sink` (a context's callback).
    pub(crate) fn set_sink(&mut self, sink: crate::warnings::Sink) {
        self.warnings.set_sink(sink);
    }
}

impl Store for ReadOnlyStore {
    fn name(&self) -> String {
        format!("readonly:{}", self.inner.name())
    }

    fn kind(&self) -> StoreKind {
        StoreKind::ReadOnly
    }

    fn get(&self, key: &StoreKey, _access: Access) -> Option<StoreHit> {
        self.inner.get(key, Access::ReadOnly)
    }

    fn note_recompiled(&self, build_time: Duration) {
        self.inner.note_recompiled(build_time);
    }

    fn lock_for_build(&self, _key: &StoreKey) -> BuildLock {
        BuildLock::NotOffered
    }

    fn put(&self, _key: &StoreKey, _bytes: &[u8], _build_time: Duration) -> PutOutcome {
        PutOutcome::Skipped
    }

    fn remove(&self, _key: &StoreKey, what: Removal<'_>) -> bool {
        if let Removal::Refused { reason, .. } = what {
            // Nothing can be done about it here; the chain stops asking this layer for the key for the
            // rest of the request, and the layer's owner should hear of it.
            self.warnings.warn(
                WarnCause::Rejected,
                &format_args!(
                    "the backend refused a verified binary of this read-only layer ({reason}); left in place"
                ),
            );
        }
        false
    }

    fn explain_miss(&self, key: &StoreKey) -> Option<super::explain::MissExplanation> {
        self.inner.explain_miss(key)
    }

    fn list(&self) -> io::Result<Vec<StoreEntry>> {
        self.inner.list()
    }

    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}
