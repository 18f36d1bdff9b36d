//! `Kernel`: a kernel acquired through a `Context`, ready to launch on it, with where it came from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{KernelInfo, KernelObject};
use crate::error::{Error, Result};

use super::source::Source;
use super::spirv_cache::SpirvStep;

/// A kernel ready to launch on the context that acquired it, with where it came from. Cloning is
/// cheap and shares the compiled kernel; a kernel keeps its program alive after its context evicts
/// it or is dropped. `Send` and `Sync`: it may be launched from several threads at once. Its
/// accessors only read what was recorded when it was acquired.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) obj: Arc<dyn KernelObject>,
    pub(crate) context: u64,
    pub(crate) source: Source,
    pub(crate) elapsed: Duration,
    /// For a kernel of a GLSL image: how its SPIR-V was obtained.
    pub(crate) spirv: Option<SpirvStep>,
    /// The digest of its image when it was built with no build options: what its declared access
    /// bounds are looked up by (options can change what the code does, so none apply otherwise).
    pub(crate) declared: Option<crate::cache::Digest>,
    /// Whether it is the generic fallback of a request that named one (`lazy.rs`).
    pub(crate) generic: bool,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("info", self.obj.info())
            .field("source", &self.source)
            .field("elapsed", &self.elapsed)
            .field("generic", &self.generic)
            .finish()
    }
}

impl Kernel {
    /// Its parameters and workgroup shape: what [`crate::Queue::submit`] checks a launch against.
    pub fn info(&self) -> &KernelInfo {
        self.obj.info()
    }

    /// Its entry point name.
    pub fn name(&self) -> &str {
        &self.obj.info().name
    }

    /// Which layer served this request for it: memory, a store (disk, read-only layer, an embedder's),
    /// or a fresh build.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether it is the generic fallback of a request that named one
    /// ([`crate::KernelRequest::or_generic`]), served while the specialized kernel builds in the
    /// background: launch it with the fallback's parameters. `false` for the specialized kernel and
    /// for every request without a fallback.
    pub fn is_generic(&self) -> bool {
        self.generic
    }

    /// How long acquiring it took (for a GLSL image, the SPIR-V step included).
    pub fn acquire_time(&self) -> Duration {
        self.elapsed
    }

    /// For a kernel of a GLSL image, how this request got its SPIR-V: compiled
    /// ([`Source::Built`]), or from memory or a store; `None` for other images.
    pub fn spirv_step(&self) -> Option<SpirvStep> {
        self.spirv
    }

    /// Whether the driver reported its pipeline as served from kpc's pipeline-cache data (`None`
    /// where the driver does not say).
    pub fn driver_cache_hit(&self) -> Option<bool> {
        self.obj.info().driver_cache_hit
    }

    /// What the driver reports about the compiled kernel (registers, shared memory, ...), as
    /// (name, value) pairs; empty where it reports nothing.
    pub fn driver_stats(&self) -> &[(String, String)] {
        &self.obj.info().driver_stats
    }

    /// Whether [`crate::Queue::submit`] can launch it on a device without robust buffer access:
    /// its image and entry point have declared access bounds
    /// ([`crate::runtime::declare_access_bounds`]; kpc's shipped `saxpy`, `copy` and `read` have)
    /// and it was built with no build options.
    pub fn has_access_bounds(&self) -> bool {
        self.access_bounds().is_some()
    }

    pub(crate) fn access_bounds(&self) -> Option<Arc<[super::bounds::BufferBound]>> {
        self.declared
            .as_ref()
            .and_then(|d| super::bounds::lookup(d, self.name()))
    }

    /// The workgroup counts that cover `global` work-items per dimension with this kernel's local
    /// size (rounded up; the kernel bounds-checks the tail).
    ///
    /// Errors: [`Error::InvalidArgument`] when a count does not fit in 32 bits.
    pub fn groups_for(&self, global: [u64; 3]) -> Result<[u32; 3]> {
        let local = self.info().local_size;
        let mut g = [0u32; 3];
        for k in 0..3 {
            g[k] = u32::try_from(global[k].div_ceil(u64::from(local[k].max(1)))).map_err(|_| {
                Error::InvalidArgument(format!(
                    "{} work-items in dimension {k} need more than 2^32 workgroups of {}",
                    global[k], local[k]
                ))
            })?;
        }
        Ok(g)
    }
}
