//! `ProgramManager`: turns (image, entry, spec constants, options) into cache keys and, on a miss,
//! orchestrates the build path: memory cache, then (with the disk cache) a persisted binary, then the
//! backend's build.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, DeviceImage};
use crate::cache::{
    BuildOptions, CacheStats, KernelKey, KernelKeyRef, KernelProgramCache, MemCacheSettings,
    ProgramKey, SpecConstants,
};
use crate::config::{Config, TraceFlags};
use crate::error::Result;

/// Which layer served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The in-memory cache (including waiting for another thread's build).
    Memory,
    /// A persisted binary from the disk cache.
    Disk,
    /// Built from the device image.
    Built,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::Built => "built",
        })
    }
}

/// A cached object with where it came from and how long acquiring it took.
#[derive(Debug)]
pub struct Acquired<T> {
    /// The shared object.
    pub value: Arc<T>,
    /// The layer that served it.
    pub source: Source,
    /// Wall time of the whole acquisition.
    pub elapsed: Duration,
}

/// One context's programs and kernels on one backend device.
///
/// Guarantees: a program or kernel is built at most once per context while cached; every caller gets
/// the same `Arc`; a failed build returns the same error again without rebuilding.
pub struct ProgramManager<B: Backend> {
    backend: Arc<B>,
    config: Config,
    cache: KernelProgramCache<B::Program, B::Kernel, crate::Error>,
}

impl<B: Backend> fmt::Debug for ProgramManager<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgramManager")
            .field("backend", &self.backend.kind())
            .field("cache", &self.cache)
            .finish()
    }
}

impl<B: Backend> ProgramManager<B> {
    /// A manager with an empty in-memory cache configured by `config`.
    pub fn new(backend: Arc<B>, config: &Config) -> Self {
        ProgramManager {
            backend,
            config: config.clone(),
            cache: KernelProgramCache::new(MemCacheSettings::from(config)),
        }
    }

    /// The backend device.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
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
            device: self.backend.fingerprint().digest,
            options: options.clone(),
        }
    }

    /// The built program for `image`, from memory, disk or a fresh build.
    pub fn program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Acquired<B::Program>> {
        let start = Instant::now();
        let source = Cell::new(Source::Memory);
        let key = self.program_key(image, spec, options);
        let value = self.cache.get_or_build_program(&key, || {
            let (p, s) = self.build_program(image, spec, options)?;
            source.set(s);
            Ok(p)
        })?;
        Ok(Acquired {
            value,
            source: source.get(),
            elapsed: start.elapsed(),
        })
    }

    /// The kernel `entry` of `image`. A hit is one lookup in the kernel map; on a miss the program is
    /// acquired first (from any layer) and the kernel created from it.
    pub fn kernel(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Acquired<B::Kernel>> {
        let start = Instant::now();
        let view = KernelKeyRef {
            image: image.digest(),
            spec,
            device: self.backend.fingerprint().digest,
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
            let p = self.program(image, spec, options)?;
            source.set(p.source);
            self.backend.create_kernel(&p.value, entry)
        })?;
        Ok(Acquired {
            value,
            source: source.get(),
            elapsed: start.elapsed(),
        })
    }

    /// The in-memory cache's counters.
    pub fn memory_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<(B::Program, Source)> {
        let start = Instant::now();
        let r = self.backend.build_program(image, spec, options);
        if self.config.trace.contains(TraceFlags::BUILDS) {
            tracing::info!(
                target: "kpc::build",
                backend = %self.backend.kind(),
                image = image.name(),
                ok = r.is_ok(),
                ms = start.elapsed().as_secs_f64() * 1e3,
                "build program"
            );
        }
        Ok((r?, Source::Built))
    }
}
