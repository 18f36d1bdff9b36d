//! [`ContextStats`]: everything a context counts, in one snapshot.

use crate::backend::BackendStats;
use crate::cache::store::{LevelStats, StoreKind};
use crate::cache::{CacheStats, DiskStats};
use crate::config::BackendKind;

use super::cache_debug::CacheDebugStats;
use super::context::Context;
use super::lazy::LazyStats;
use super::seal::SealStats;
use super::spirv_cache::SpirvStats;

/// A context's counters at one moment, shaped like the C API's `kpc_stats` (whose fields are the
/// first four here: backend, memory, disk, backend counters) plus what only Rust callers see.
///
/// Each part is read on its own, without a lock across them: a request that runs meanwhile may be
/// counted in one part and not yet in another.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextStats {
    /// The context's backend.
    pub backend: BackendKind,
    /// The in-memory cache's counters.
    pub memory: CacheStats,
    /// The local disk cache's counters, or `None` when it is off (the C API then reports zeros).
    pub disk: Option<DiskStats>,
    /// Why the configured local disk cache is off although one was asked for: its root cannot be
    /// used (a regular file, a directory that cannot be created). `None` when it is on, or was
    /// turned off (`KPC_CACHE_PERSISTENT=0`).
    pub disk_unusable: Option<String>,
    /// The backend's own counters (programs built and loaded, driver pipeline-cache hits,
    /// launches).
    pub backend_counters: BackendStats,
    /// What each persistent store after the local disk (read-only layers, an embedder's, remote) did
    /// for this context, in lookup order. The local disk is [`ContextStats::disk`] alone, so that
    /// summing the parts counts every lookup once.
    pub stores: Vec<LevelStats>,
    /// What the SPIR-V cache did for GLSL images: compiles, compile errors, hits from memory and from
    /// stores.
    pub spirv: SpirvStats,
    /// Cache debug mode's comparisons of fresh builds with cached binaries (all zero unless
    /// `KPC_CACHE_DEBUG=1`).
    pub cache_debug: CacheDebugStats,
    /// Sealed mode: the seal in force, builds after sealing (`warn`) and acquisitions refused
    /// (`error`).
    pub seal: SealStats,
    /// Generic fallbacks ([`crate::KernelRequest::or_generic`]): served, swapped for the
    /// specialized kernel, background builds, their time and failures.
    pub lazy: LazyStats,
}

impl Context {
    /// Every counter of this context, in one snapshot (see [`ContextStats`]).
    pub fn stats(&self) -> ContextStats {
        let programs = &self.inner.programs;
        programs.publish_metrics();
        let disk = programs.disk_stats();
        let mut stores = programs.store_stats();
        // The chain puts the local disk first; its counters are `disk`'s, reported once.
        if disk.is_some()
            && let Some(i) = stores.iter().position(|l| l.kind == StoreKind::Disk)
        {
            stores.remove(i);
        }
        ContextStats {
            backend: programs.kind(),
            memory: programs.memory_stats(),
            disk,
            disk_unusable: programs.disk_unusable().map(str::to_string),
            backend_counters: self.inner.compute.stats(),
            stores,
            spirv: programs.spirv_stats(),
            cache_debug: programs.debug_stats(),
            seal: programs.seal_stats(),
            lazy: programs.lazy_stats(),
        }
    }
}
