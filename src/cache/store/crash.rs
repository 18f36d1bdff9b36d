//! Crash records as the chain sees them: a stored binary that crashed a process loading it is
//! refused ([`CrashedLoading`]), and the local level that keeps the loading records (the disk cache,
//! `src/cache/disk/loading.rs`) guards each load ([`LocalLevel`]).

use std::any::Any;
use std::fmt;
use std::path::PathBuf;

use super::StoreKey;

/// A stored binary that crashed a process while it was being loaded: refuse it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashedLoading {
    /// The quarantine marker naming it.
    pub marker: PathBuf,
}

impl std::fmt::Display for CrashedLoading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "crashed-loading: this binary crashed a process that was loading it (quarantined as {})",
            self.marker.display()
        )
    }
}

/// What the chain asks of its local level beyond storage: the crash guard around each load, and the
/// warning for a build it could not serialize. The disk cache implements it.
pub(crate) trait LocalLevel: Send + Sync + fmt::Debug {
    /// Right before `bytes` (a hit for `key`) go to the driver: refused when they crashed a process
    /// that loaded them before, else a record of the load held until the returned guard drops.
    fn begin_load(
        &self,
        key: &StoreKey,
        bytes: &[u8],
    ) -> Result<Option<Box<dyn Send>>, CrashedLoading>;

    /// Whether `bytes` for `key` crashed a process that loaded them before.
    fn crashed_before(&self, key: &StoreKey, bytes: &[u8]) -> bool;

    /// The backend could not serialize a built program (warned once).
    fn note_serialize_failure(&self, reason: &dyn fmt::Display);

    /// The level itself, for the owner that knows its type.
    fn as_any(&self) -> &dyn Any;
}
