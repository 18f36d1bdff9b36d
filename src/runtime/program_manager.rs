//! `ProgramManager`: turns (image, entry, spec constants, options) into cache keys and, on a miss,
//! orchestrates the build path: memory cache, then the persistent stores in order (a [`StoreChain`]:
//! local disk, read-only layers, an embedder's own stores), then the backend's build, which is stored
//! back into every writable store.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::cache_debug::{CacheDebugStats, DebugCounters};
use super::metrics;
use super::seal::{Seal, SealStats};
pub use super::source::{Acquired, Source};
#[cfg(not(loom))]
use super::spirv_cache::{SpirvCache, SpirvStats, SpirvStep};
use crate::backend::dynamic::{DynBackend, DynKernel, DynProgram};
use crate::backend::{Backend, DeviceImage};
use crate::cache::Local;
use crate::cache::events::{self, CacheEvent};
use crate::cache::store::LevelStats;
use crate::cache::{
    BuildOptions, CacheStats, Digest, DiskStats, KernelKey, KernelKeyRef, KernelProgramCache,
    MemCacheSettings, PersistentCache, ProgramKey, SpecConstants, Store, StoreChain, StoreKey,
};
use crate::config::{BackendKind, Config, SealMode, TraceFlags};
use crate::error::{Error, Result};

mod miss;

/// One context's programs and kernels on one backend device, whatever its backend (it drives the
/// device through the type-erased seam; the constructors take any [`Backend`]).
///
/// Guarantees: a program or kernel is built at most once per context while cached; every caller gets
/// the same `Arc`; a failed build returns the same error again without rebuilding. With stores (the disk
/// cache, read-only layers, an embedder's), a program missing from memory is loaded from a verified
/// persisted binary when one exists, and a freshly built one is persisted; no store's problem ever
/// fails a request.
pub struct ProgramManager {
    backend: Arc<dyn DynBackend>,
    /// The backend's kind and its fingerprint's digest, kept here so that a memory hit makes no
    /// call through the seam.
    kind: BackendKind,
    device: Digest,
    config: Config,
    cache: KernelProgramCache<DynProgram, DynKernel, crate::Error>,
    stores: StoreChain,
    /// The fingerprint's `describe()`, computed once: part of every disk key.
    device_description: String,
    /// Cache debug mode's comparisons (`KPC_CACHE_DEBUG`), subscribed to the chain's builds in
    /// debug mode.
    debug: Arc<DebugCounters>,
    /// Sealed mode: what a build after sealing does (`seal.rs`).
    seal: Seal,
    /// GLSL images' SPIR-V, in front of the program cache.
    #[cfg(not(loom))]
    spirv: SpirvCache,
    /// Publishes the counters through the `metrics` facade (`src/runtime/metrics.rs`).
    metrics: metrics::Publisher,
    /// Background builds of specialized kernels whose requests have a generic fallback (`lazy.rs`).
    #[cfg(not(loom))]
    lazy: Arc<super::lazy_pool::Lazy>,
}

impl fmt::Debug for ProgramManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgramManager")
            .field("backend", &self.kind)
            .field("cache", &self.cache)
            .finish()
    }
}

impl ProgramManager {
    /// A manager with an empty in-memory cache configured by `config`, and the stores `config` asks
    /// for: its own disk cache at `config`'s directory (none when `KPC_CACHE_PERSISTENT=0` or no
    /// directory resolves), then the read-only layers of `KPC_CACHE_READONLY_DIRS`.
    pub fn new<B: Backend>(backend: Arc<B>, config: &Config) -> Self {
        Self::with_stores(backend, config, StoreChain::from_config(config))
    }

    /// A manager that uses `disk` (shared with other managers, or `None` for none) as its local disk
    /// cache instead of opening its own, followed by `config`'s read-only layers.
    pub fn with_disk_cache<B: Backend>(
        backend: Arc<B>,
        config: &Config,
        disk: Option<PersistentCache>,
    ) -> Self {
        Self::with_stores(backend, config, StoreChain::with_local_disk(disk, config))
    }

    /// A manager with the stores `config` asks for (as [`ProgramManager::new`]) followed by `store`,
    /// the embedder's own: looked up after them, written after them, and a hit from it copied to the
    /// local disk.
    pub fn with_store<B: Backend>(backend: Arc<B>, config: &Config, store: Arc<dyn Store>) -> Self {
        Self::with_stores(
            backend,
            config,
            StoreChain::from_config(config).with_store(store),
        )
    }

    /// A manager with exactly the stores of `stores`, in its order (nothing from `config` is added;
    /// [`StoreChain::from_config`] gives what it would add).
    pub fn with_stores<B: Backend>(backend: Arc<B>, config: &Config, stores: StoreChain) -> Self {
        Self::erased(backend, config, stores)
    }

    /// As [`ProgramManager::with_stores`], for a backend already behind the seam.
    pub fn erased(backend: Arc<dyn DynBackend>, config: &Config, stores: StoreChain) -> Self {
        let fingerprint = backend.fingerprint();
        let device_description = fingerprint.describe();
        let debug = Arc::new(DebugCounters::new(config.trace.contains(TraceFlags::DISK)));
        let mut stores = stores.with_observer(Arc::new(metrics::Counting));
        if config.cache_debug {
            stores = stores.with_observer(debug.clone());
        }
        let cache = KernelProgramCache::new(MemCacheSettings::from(config));
        cache.on_evict(events::evictions_to(stores.observers()));
        ProgramManager {
            kind: backend.kind(),
            device: fingerprint.digest,
            backend,
            config: config.clone(),
            cache,
            stores,
            device_description,
            debug,
            seal: Seal::default(),
            #[cfg(not(loom))]
            spirv: SpirvCache::default(),
            metrics: metrics::Publisher::default(),
            #[cfg(not(loom))]
            lazy: Arc::default(),
        }
    }

    /// The background builds of specialized kernels (`lazy.rs`).
    #[cfg(not(loom))]
    pub(crate) fn lazy(&self) -> &Arc<super::lazy_pool::Lazy> {
        &self.lazy
    }

    /// The seal itself (`seal.rs`).
    pub(crate) fn seal_state(&self) -> &Seal {
        &self.seal
    }

    /// The local disk cache, if on.
    pub fn disk_cache(&self) -> Option<&PersistentCache> {
        self.stores.local_disk()
    }

    /// The local disk cache's counters, or `None` when it is off.
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.stores.local_disk().map(PersistentCache::stats)
    }

    /// Why the configured local disk cache is off: its root cannot be used (`None` otherwise).
    pub fn disk_unusable(&self) -> Option<&str> {
        self.stores.local_unusable()
    }

    /// The persistent stores, in lookup order.
    pub fn stores(&self) -> &StoreChain {
        &self.stores
    }

    /// What each store did for this manager, in lookup order.
    pub fn store_stats(&self) -> Vec<LevelStats> {
        self.stores.stats()
    }

    /// The disk key of `image` built with `spec` and `options` on this device.
    pub fn disk_key(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> StoreKey {
        StoreKey::new(
            &self.device_description,
            self.device,
            image.digest(),
            image.bytes().len() as u64,
            &spec.canonical_bytes(),
            options.as_str(),
        )
        .with_label(image.name())
    }

    /// The validated SPIR-V image of a GLSL image, through this manager's SPIR-V cache and stores,
    /// with how it was obtained; `None` for any other image, which
    /// is built as it is.
    ///
    /// Errors: [`crate::Error::GlslCompile`] (cached), [`crate::Error::InvalidSpirv`], and
    /// [`crate::Error::InvalidArgument`] for a GLSL image on a backend other than Vulkan.
    #[cfg(not(loom))]
    pub fn glsl_spirv(&self, image: &DeviceImage) -> Result<Option<(DeviceImage, SpirvStep)>> {
        if image.format() != crate::backend::ImageFormat::Glsl {
            return Ok(None);
        }
        if self.kind != BackendKind::Vulkan {
            return Err(crate::Error::InvalidArgument(format!(
                "GLSL image {:?} needs a Vulkan context; this one is {}",
                image.name(),
                self.kind
            )));
        }
        self.spirv
            .resolve(image, &self.stores, &self.config, &self.seal)
            .map(Some)
    }

    /// What the SPIR-V cache did for this manager.
    #[cfg(not(loom))]
    pub fn spirv_stats(&self) -> SpirvStats {
        self.spirv.stats()
    }

    /// The backend device, behind the seam.
    pub fn backend(&self) -> &Arc<dyn DynBackend> {
        &self.backend
    }

    /// The backend device, when it is a `B`: typed access for tools and tests.
    pub fn backend_as<B: Backend>(&self) -> Option<&B> {
        self.backend.as_any().downcast_ref::<B>()
    }

    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The program key of `image` built with `spec` and `options` on this device.
    pub fn program_key(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> ProgramKey {
        ProgramKey {
            image: image.digest(),
            spec: spec.clone(),
            device: self.device,
            options: options.clone(),
        }
    }

    /// The built program for `image`, from memory, a store (disk, read-only layer, an embedder's) or
    /// a fresh build.
    pub fn program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Acquired<DynProgram>> {
        self.program_for(image, spec, options, None)
    }

    /// [`ProgramManager::program`], for the kernel `entry` when one is known (named if sealed mode
    /// reports or refuses its build).
    fn program_for(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        entry: Option<&str>,
    ) -> Result<Acquired<DynProgram>> {
        let start = Instant::now();
        let source = Cell::new(Source::Memory);
        let key = self.program_key(image, spec, options);
        let value = self.cache.get_or_build_program(&key, || {
            let (p, s) = self.build_program(image, spec, options, entry)?;
            source.set(s);
            Ok(p)
        })?;
        let source = source.get();
        if source != Source::Memory {
            // A miss paid for a lookup or a build: telling it and publishing the snapshot deltas
            // costs nothing next to that. Memory hits are published with the deltas.
            let from = source.store_kind();
            self.stores.emit(&CacheEvent::ProgramServed { from });
            self.publish_metrics();
        }
        Ok(Acquired {
            value,
            source,
            elapsed: start.elapsed(),
        })
    }

    /// Publishes this manager's counters through the `metrics` facade:
    /// what the hit path counts (memory hits) and the stores' counters, as differences since the
    /// last call. Called at every miss and by `Context::stats`; an embedder that scrapes between misses
    /// may call it to bring memory hits up to date.
    pub fn publish_metrics(&self) {
        self.metrics
            .publish(self.memory_stats(), self.disk_stats(), &self.store_stats());
    }

    /// The kernel `entry` of `image`. A hit is one lookup in the kernel map; on a miss the program is
    /// acquired first (from any layer) and the kernel created from it.
    pub fn kernel(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Acquired<DynKernel>> {
        let start = Instant::now();
        let view = KernelKeyRef {
            image: image.digest(),
            spec,
            device: self.device,
            options,
            entry,
        };
        if let Some(r) = self.cache.kernel_hit(&view) {
            return r.map(|value| Acquired {
                value,
                source: Source::Memory,
                elapsed: start.elapsed(),
            });
        }
        let source = Cell::new(Source::Memory);
        let key = KernelKey::new(self.program_key(image, spec, options), entry);
        let value = self.cache.get_or_build_kernel(&key, || {
            let p = self.program_for(image, spec, options, Some(entry))?;
            source.set(p.source);
            self.retry_out_of_resources("kernel creation", || {
                self.backend.create_kernel(&p.value, entry)
            })
        })?;
        let source = source.get();
        // Only first acquisitions (a hit is Memory) are told, so hits cost one branch.
        if source != Source::Memory {
            self.stores.emit(&CacheEvent::KernelServed {
                from: source.store_kind(),
                image,
                entry,
                spec,
                options,
            });
        }
        Ok(Acquired {
            value,
            source,
            elapsed: start.elapsed(),
        })
    }

    /// The kernel from memory if it is built and cached there, behind a handle of the calling
    /// thread's own; `None` otherwise (nothing is built or loaded).
    #[inline]
    pub(crate) fn kernel_hit_local(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Option<Arc<Local<DynKernel>>> {
        let view = KernelKeyRef {
            image: image.digest(),
            spec,
            device: self.device,
            options,
            entry,
        };
        self.cache.kernel_local(&view)
    }

    /// As [`ProgramManager::kernel`], but the kernel comes behind a handle of the calling thread's own
    /// (`Local`): a repeated hit on one thread writes no cache line other threads use, so hits scale
    /// with threads. What `Context::kernel` uses.
    #[inline]
    pub fn kernel_local(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Acquired<Local<DynKernel>>> {
        let start = Instant::now();
        let view = KernelKeyRef {
            image: image.digest(),
            spec,
            device: self.device,
            options,
            entry,
        };
        if let Some(value) = self.cache.kernel_local(&view) {
            return Ok(Acquired {
                value,
                source: Source::Memory,
                elapsed: start.elapsed(),
            });
        }
        let a = self.kernel(image, entry, spec, options)?;
        Ok(Acquired {
            value: Arc::new(Local::new(a.value)),
            source: a.source,
            elapsed: start.elapsed(),
        })
    }

    /// The kernel `entry` of a program recreated from `binary` (bytes [`Backend::program_binary`]
    /// made for this key, already verified by the caller), which then serves later requests from
    /// memory. When the program is in memory already, that one serves and `binary` is not used
    /// ([`Source::Memory`]); otherwise the source is [`Source::Blob`]. The binary is loaded before
    /// the cache is touched, so one the backend refuses leaves no cached failure behind.
    pub fn kernel_from_binary(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<Acquired<DynKernel>> {
        let start = Instant::now();
        let key = self.program_key(image, spec, options);
        let mut loaded = if self.cache.contains_program(&key) {
            None
        } else {
            let p = Arc::new(self.retry_out_of_resources("binary load", || {
                self.backend
                    .program_from_binary(image, spec, options, binary)
            })?);
            // The entry point is checked before the program enters the memory cache: a binary
            // refused for it must leave nothing there, or a later genuine binary for the key
            // would be answered from memory instead of loaded and checked.
            drop(self.backend.create_kernel(&p, entry)?);
            let kept = || {
                Error::Panicked(format!(
                    "the {} backend kept a reference to a program it was only asked to make a \
                     kernel of",
                    self.kind
                ))
            };
            let p = Arc::try_unwrap(p).map_err(|_| kept())?;
            if p.is_shared() {
                return Err(kept());
            }
            Some(p)
        };
        let source = Cell::new(Source::Memory);
        let program = self
            .cache
            .get_or_build_program(&key, || match loaded.take() {
                Some(p) => {
                    source.set(Source::Blob);
                    Ok(p)
                }
                // Evicted between the check and here: what any request for the key would do.
                None => self
                    .build_program(image, spec, options, Some(entry))
                    .map(|(p, s)| {
                        source.set(s);
                        p
                    }),
            })?;
        let kernel_key = KernelKey::new(key, entry);
        let value = self.cache.get_or_build_kernel(&kernel_key, || {
            self.retry_out_of_resources("kernel creation", || {
                self.backend.create_kernel(&program, entry)
            })
        })?;
        Ok(Acquired {
            value,
            source: source.get(),
            elapsed: start.elapsed(),
        })
    }

    /// The in-memory cache itself.
    pub fn memory_cache(&self) -> &KernelProgramCache<DynProgram, DynKernel, crate::Error> {
        &self.cache
    }

    /// The in-memory cache's counters.
    pub fn memory_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Cache debug mode's comparisons so far (all zero unless `KPC_CACHE_DEBUG=1`).
    pub fn debug_stats(&self) -> CacheDebugStats {
        self.debug.snapshot()
    }

    /// Seals this manager: from now on a build is reported (`warn`) or refused (`error`) as
    /// `mode` says; [`SealMode::Off`] unseals.
    pub fn seal(&self, mode: SealMode) {
        self.seal.set(mode);
    }

    /// What ends a warm-up: `mode` in force now, or, with a build `budget`, after that many builds
    /// more (`KPC_CACHE_SEAL`, `KPC_CACHE_BUILD_BUDGET`).
    pub fn seal_after_warm_up(&self, mode: SealMode, budget: Option<u64>) {
        match budget {
            Some(builds) => self.seal.start_budget(builds, mode),
            None if mode != SealMode::Off => self.seal.set(mode),
            None => {}
        }
    }

    /// What sealing did so far, and the mode in force.
    pub fn seal_stats(&self) -> SealStats {
        self.seal.stats()
    }
}
