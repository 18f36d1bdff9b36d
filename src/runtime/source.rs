//! Which layer served a kernel, program or SPIR-V module: what every acquisition reports.

use crate::cache::StoreKind;

/// Which layer served a request. Every layer below memory verified the binary (checksums, and the
/// MAC or signature a configuration asks for) before the driver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The in-memory cache (including waiting for another thread's build).
    Memory,
    /// A persisted binary from the local disk cache.
    Disk,
    /// A persisted binary from a read-only layer (`KPC_CACHE_READONLY_DIRS`), copied to the local disk.
    ReadOnly,
    /// A persisted binary from another store (an embedder's own), copied to the first writable store
    /// above it.
    Store,
    /// A persisted binary from the remote tier (`KPC_CACHE_REMOTE`), verified and copied to the
    /// local disk.
    Remote,
    /// Built from the device image.
    Built,
    /// Loaded from a cache blob the caller supplied (`Context::kernel_from_blob`).
    Blob,
}

impl Source {
    /// A stable lower-case name: `memory`, `disk`, `readonly`, `store`, `remote`, `built`, `blob`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::ReadOnly => "readonly",
            Source::Store => "store",
            Source::Remote => "remote",
            Source::Built => "built",
            Source::Blob => "blob",
        }
    }

    /// The kind of store this source is, `None` for what no store served (memory, a build, a blob):
    /// the inverse of [`Source::of_store`].
    pub(crate) fn store_kind(self) -> Option<StoreKind> {
        match self {
            Source::Disk => Some(StoreKind::Disk),
            Source::ReadOnly => Some(StoreKind::ReadOnly),
            Source::Store => Some(StoreKind::Other),
            Source::Remote => Some(StoreKind::Remote),
            Source::Memory | Source::Built | Source::Blob => None,
        }
    }

    /// What a hit from a store of `kind` reports.
    pub fn of_store(kind: StoreKind) -> Source {
        match kind {
            StoreKind::Disk => Source::Disk,
            StoreKind::ReadOnly => Source::ReadOnly,
            StoreKind::Other => Source::Store,
            StoreKind::Remote => Source::Remote,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A cached object with where it came from and how long acquiring it took.
#[derive(Debug)]
#[non_exhaustive]
pub struct Acquired<T> {
    /// The shared object.
    pub value: std::sync::Arc<T>,
    /// The layer that served it.
    pub source: Source,
    /// Wall time of the whole acquisition.
    pub elapsed: std::time::Duration,
}
