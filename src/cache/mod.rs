//! The cache layer. It knows nothing of Vulkan or OpenCL: it stores built objects under opaque keys
//! in memory (`KernelProgramCache`) and opaque binaries in persistent stores.
//!
//! The persistent layer is a seam: a [`StoreChain`] of [`Store`]s (get, lock-for-build, put, remove,
//! list), looked up in order after memory. The on-disk `PersistentCache` (`disk/`) is the first
//! implementation and the local, read-write level; `KPC_CACHE_READONLY_DIRS` adds disk caches wrapped
//! in a [`ReadOnlyStore`]; an embedder adds its own stores (see `store/`).

pub mod build_result;
pub mod bundle;
pub mod check;
pub mod counters;
pub mod disk;
pub mod events;
pub mod front;
pub mod journal;
pub mod kernel_program_cache;
pub mod keys;
pub mod metrics;
pub mod pass_gate;
pub mod store;
pub mod sync;

pub use build_result::{
    BuildError, BuildFailure, BuildMap, BuildResult, BuildState, MAX_TRANSIENT_RETRIES, Served,
    get_or_build,
};
pub use counters::CacheStats;
pub use disk::{DiskStats, PersistentCache};
pub use front::Local;
pub use kernel_program_cache::{CacheCost, KernelProgramCache, MemCacheSettings};
pub use keys::{
    BuildOptions, Digest, KernelKey, KernelKeyRef, ProgramKey, SpecConstants, SpecValue,
};
pub use store::{Removal, Store, StoreChain, StoreHit, StoreKey, StoreKind, StoreStats};
