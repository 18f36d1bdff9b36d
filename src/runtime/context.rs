//! `Context`: one device, one in-memory kernel and program cache, buffers and a queue: the surface
//! user code and the attention workload are written against, identical on every backend.
//!
//! A `Context` erases its backend behind an object-safe trait implemented once, generically, for
//! every [`ComputeBackend`]; a backend plugs in by implementing that trait and opening in
//! [`Context::with_device`]. Handles (kernels, buffers) remember the context that made them, so a
//! handle passed to another context is a typed error, not undefined behaviour.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::{
    BackendStats, ComputeBackend, DeviceImage, DeviceInfo, KernelInfo, KernelObject, Launch, Pod,
};
use crate::cache::Local;
use crate::cache::{BuildOptions, CacheStats, DiskStats, SpecConstants, StoreChain};
use crate::config::{BackendKind, Config};
use crate::error::{Error, Result};

use super::buffer::{Buffer, RawBuffer};
use super::cache_debug::CacheDebugStats;
use super::lifecycle::{Background, Life};
use super::prefetch::{KernelRequest, Prefetch};
use super::program_manager::{ProgramManager, Source};
use super::queue::{EventImpl, Queue};
use super::spirv_cache::{SpirvStats, SpirvStep};
use super::warm_start::{LoadOutcome, WarmStart, WarmStartReport};

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// A type-erased buffer handle: the backend's buffer type inside.
pub(crate) type AnyBuffer = Arc<dyn Any + Send + Sync>;

/// One launch with erased handles, checked by the queue against the kernel's description.
pub(crate) struct ErasedLaunch<'a> {
    pub(crate) kernel: &'a dyn KernelObject,
    pub(crate) groups: [u32; 3],
    pub(crate) buffers: Vec<AnyBuffer>,
    pub(crate) push_constants: &'a [u8],
}

/// What a `Context` needs from its backend, object safe.
pub(crate) trait ContextImpl: Send + Sync + 'static {
    fn id(&self) -> u64;
    fn device(&self) -> &DeviceInfo;
    fn config(&self) -> &Config;
    fn kernel(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<(Arc<dyn KernelObject>, Source, Duration)>;
    fn kernel_from_binary(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<(Arc<dyn KernelObject>, Source, Duration)>;
    fn create_buffer(&self, bytes: u64) -> Result<AnyBuffer>;
    fn write(&self, buffer: &AnyBuffer, offset: u64, data: &[u8]) -> Result<()>;
    fn read(&self, buffer: &AnyBuffer, offset: u64, out: &mut [u8]) -> Result<()>;
    fn submit(&self, launches: &[ErasedLaunch<'_>]) -> Result<Box<dyn EventImpl>>;
    fn finish(&self) -> Result<()>;
    fn memory_stats(&self) -> CacheStats;
    fn backend_stats(&self) -> BackendStats;
    fn debug_stats(&self) -> CacheDebugStats;
    fn disk_stats(&self) -> Option<DiskStats>;
    fn store_stats(&self) -> Vec<crate::cache::store::LevelStats>;
    fn as_any(&self) -> &dyn Any;
    fn warm_start(&self) -> Option<&Arc<WarmStart>>;
    fn load_if_stored(&self, request: &KernelRequest) -> Result<LoadOutcome>;
    fn background(&self) -> &Background;
    fn glsl_spirv(&self, image: &DeviceImage) -> Result<Option<(DeviceImage, SpirvStep)>>;
    fn spirv_stats(&self) -> SpirvStats;
}

struct Inner<B: ComputeBackend> {
    id: u64,
    programs: ProgramManager<B>,
    warm: Option<Arc<WarmStart>>,
    background: Background,
}

fn foreign(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what} belongs to another context (or another backend)"
    ))
}

impl<B: ComputeBackend> Inner<B> {
    fn buffer<'a>(&self, b: &'a AnyBuffer) -> Result<&'a B::Buffer> {
        b.downcast_ref::<B::Buffer>()
            .ok_or_else(|| foreign("a buffer"))
    }
}

/// A thread's own handle is the kernel to everything downstream: launches and interop recover the
/// backend's type through `as_any`, which answers for the kernel inside.
impl<K: KernelObject> KernelObject for Local<K> {
    fn info(&self) -> &KernelInfo {
        (**self).info()
    }
    fn as_any(&self) -> &dyn Any {
        (**self).as_any()
    }
    fn origin(&self) -> Option<&crate::backend::ProgramOrigin> {
        (**self).origin()
    }
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        (**self).program_binary()
    }
}

struct BackendEvent<B: ComputeBackend> {
    backend: Arc<B>,
    event: B::Event,
}

impl<B: ComputeBackend> EventImpl for BackendEvent<B> {
    fn wait(&self) -> Result<()> {
        self.backend.wait(&self.event)
    }
    fn launch_intervals(&self) -> Result<Option<Vec<(u64, u64)>>> {
        self.backend.launch_intervals(&self.event)
    }
}

impl<B: ComputeBackend> ContextImpl for Inner<B> {
    fn id(&self) -> u64 {
        self.id
    }
    fn device(&self) -> &DeviceInfo {
        self.programs.backend().device_info()
    }
    fn config(&self) -> &Config {
        self.programs.config()
    }
    fn glsl_spirv(&self, image: &DeviceImage) -> Result<Option<(DeviceImage, SpirvStep)>> {
        self.programs.glsl_spirv(image)
    }
    fn spirv_stats(&self) -> SpirvStats {
        self.programs.spirv_stats()
    }
    fn kernel(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<(Arc<dyn KernelObject>, Source, Duration)> {
        let a = self.programs.kernel_local(image, entry, spec, options)?;
        Ok((a.value as Arc<dyn KernelObject>, a.source, a.elapsed))
    }
    fn kernel_from_binary(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<(Arc<dyn KernelObject>, Source, Duration)> {
        let a = self
            .programs
            .kernel_from_binary(image, entry, spec, options, binary)?;
        Ok((a.value as Arc<dyn KernelObject>, a.source, a.elapsed))
    }
    fn create_buffer(&self, bytes: u64) -> Result<AnyBuffer> {
        Ok(Arc::new(self.programs.backend().create_buffer(bytes)?))
    }
    fn write(&self, buffer: &AnyBuffer, offset: u64, data: &[u8]) -> Result<()> {
        self.programs
            .backend()
            .write_buffer(self.buffer(buffer)?, offset, data)
    }
    fn read(&self, buffer: &AnyBuffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.programs
            .backend()
            .read_buffer(self.buffer(buffer)?, offset, out)
    }
    fn submit(&self, launches: &[ErasedLaunch<'_>]) -> Result<Box<dyn EventImpl>> {
        let mut typed = Vec::with_capacity(launches.len());
        for l in launches {
            let kernel = l
                .kernel
                .as_any()
                .downcast_ref::<B::Kernel>()
                .ok_or_else(|| foreign("a kernel"))?;
            let buffers = l
                .buffers
                .iter()
                .map(|b| {
                    b.clone()
                        .downcast::<B::Buffer>()
                        .map_err(|_| foreign("a buffer"))
                })
                .collect::<Result<Vec<_>>>()?;
            typed.push(Launch {
                kernel,
                groups: l.groups,
                buffers,
                push_constants: l.push_constants,
            });
        }
        let backend = self.programs.backend().clone();
        let event = backend.submit(&typed)?;
        Ok(Box::new(BackendEvent { backend, event }))
    }
    fn finish(&self) -> Result<()> {
        self.programs.backend().finish()
    }
    fn memory_stats(&self) -> CacheStats {
        self.programs.memory_stats()
    }
    fn backend_stats(&self) -> BackendStats {
        self.programs.backend().stats()
    }
    fn debug_stats(&self) -> CacheDebugStats {
        self.programs.debug_stats()
    }
    fn disk_stats(&self) -> Option<DiskStats> {
        self.programs.disk_stats()
    }
    fn store_stats(&self) -> Vec<crate::cache::store::LevelStats> {
        self.programs.store_stats()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn warm_start(&self) -> Option<&Arc<WarmStart>> {
        self.warm.as_ref()
    }
    fn load_if_stored(&self, request: &KernelRequest) -> Result<LoadOutcome> {
        super::warm_start::load_if_stored(&self.programs, request)
    }
    fn background(&self) -> &Background {
        &self.background
    }
}

/// A device with its own in-memory kernel and program cache (one `KernelProgramCache`, through one
/// `ProgramManager`). Cloning is cheap and shares everything.
///
/// Guarantees: within a context a kernel is built at most once while cached, and later requests get
/// the same kernel; a failed build returns the same error again; every SPIR-V image is validated
/// before the cache is consulted, so an invalid image leaves no trace in it. When the drop of the
/// last kpc object made from a context returns, kpc makes no further call on its device (see
/// `lifecycle.rs` and [`Context::quiesce`]).
#[derive(Clone)]
pub struct Context {
    // Field order is drop order: the warm start stops (and its running loads end) before the
    // handle on the context goes.
    /// Shared by the embedder's handles only; `None` in the handles kpc's own threads hold.
    pub(crate) _life: Option<Arc<Life>>,
    pub(crate) inner: Arc<dyn ContextImpl>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.inner.device();
        f.debug_struct("Context")
            .field("id", &self.inner.id())
            .field(
                "device",
                &format_args!("{}:{} {}", d.backend, d.index, d.name),
            )
            .finish()
    }
}

impl Context {
    /// A context on the device `config.device` (`KPC_DEVICE`) selects.
    ///
    /// Errors: as [`super::select_device`] and [`Context::with_device`].
    pub fn new(config: &Config) -> Result<Context> {
        let device = super::device::select_device(&config.device)?;
        Context::with_device(&device, config)
    }

    /// A context on `device` (one that discovery reported).
    ///
    /// Errors: [`Error::Unavailable`] when the device cannot be opened.
    pub fn with_device(device: &DeviceInfo, config: &Config) -> Result<Context> {
        Context::with_device_and_stores(device, config, StoreChain::from_config(config))
    }

    /// A context on `device` whose persistent layer is exactly `stores` (see
    /// [`Context::from_backend_with_stores`]).
    ///
    /// Errors: [`Error::Unavailable`] when the device cannot be opened.
    pub fn with_device_and_stores(
        device: &DeviceInfo,
        config: &Config,
        stores: StoreChain,
    ) -> Result<Context> {
        match device.backend {
            BackendKind::Vulkan => Ok(Context::from_backend_with_stores(
                crate::backend::vulkan::VulkanBackend::open(device.index, config)?,
                config,
                stores,
            )),
            BackendKind::OpenCl => Ok(Context::from_backend_with_stores(
                crate::backend::opencl::OpenClBackend::open(device.index, config)?,
                config,
                stores,
            )),
        }
    }

    /// A context on a backend device opened by the caller (for example with backend-specific
    /// options).
    pub fn from_backend<B: ComputeBackend>(backend: B, config: &Config) -> Context {
        Context::from_backend_with_stores(backend, config, StoreChain::from_config(config))
    }

    /// A context on a backend device opened by the caller whose persistent layer is exactly `stores`,
    /// looked up in order after the context's memory cache: for an embedder that keeps binaries in its
    /// own storage. `StoreChain::from_config(config).with_store(mine)` keeps kpc's disk cache and
    /// read-only layers in front of the embedder's store (hits from it are copied to the local disk);
    /// `StoreChain::new().with_store(mine)` uses the embedder's store alone.
    pub fn from_backend_with_stores<B: ComputeBackend>(
        backend: B,
        config: &Config,
        stores: StoreChain,
    ) -> Context {
        let warm = WarmStart::from_config(config, &backend.fingerprint().digest);
        let inner: Arc<dyn ContextImpl> = Arc::new(Inner {
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            programs: ProgramManager::with_stores(Arc::new(backend), config, stores),
            warm: warm.clone(),
            background: Background::default(),
        });
        if let Some(w) = &warm {
            // Weak: the loader must not keep a context alive that its owner dropped. A load holds
            // the context while it runs; the owner's last drop stops the loader and waits for the
            // loads running then (Life), so none outlives that drop.
            let ctx = Arc::downgrade(&inner);
            w.start(move |r| {
                ctx.upgrade()
                    .map_or(Ok(LoadOutcome::Cancelled), |c| c.load_if_stored(r))
            });
        }
        Context {
            _life: Some(Arc::new(Life { warm })),
            inner,
        }
    }

    /// The device.
    pub fn device(&self) -> &DeviceInfo {
        self.inner.device()
    }

    /// The device's backend.
    pub fn backend(&self) -> BackendKind {
        self.inner.device().backend
    }

    /// The configuration the context was made with.
    pub fn config(&self) -> &Config {
        self.inner.config()
    }

    /// The context's program manager, when its backend is `B`: direct access for tools and tests.
    pub fn program_manager<B: ComputeBackend>(&self) -> Option<&ProgramManager<B>> {
        self.inner
            .as_any()
            .downcast_ref::<Inner<B>>()
            .map(|i| &i.programs)
    }

    /// The kernel `entry` of `image`, specialized with `spec` and built with `options`: from this
    /// context's memory cache, the disk cache, or a fresh build. The returned [`Kernel`] says which.
    ///
    /// Errors: [`Error::InvalidSpirv`] for an invalid SPIR-V image (nothing is cached for it);
    /// [`Error::UnknownKernel`] for an entry point the image lacks; [`Error::Build`] and
    /// [`Error::InvalidArgument`] (bad spec constants) for a build that fails, returned again from the
    /// cache on later requests.
    pub fn kernel(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Kernel> {
        // A GLSL image becomes its SPIR-V image here, through the SPIR-V cache; from then on it is
        // keyed, built and cached as that SPIR-V.
        let resolved = self.glsl_spirv(image)?;
        let (image, spirv) = match &resolved {
            Some((spirv_image, step)) => (spirv_image, Some(*step)),
            None => (image, None),
        };
        self.check_entry(image, entry)?;
        let (obj, source, elapsed) = self.inner.kernel(image, entry, spec, options)?;
        // Only first acquisitions (a hit is Memory) pay for remembering, so hits cost one branch.
        if source != Source::Memory
            && let Some(w) = self.inner.warm_start()
        {
            w.record(&KernelRequest {
                image: image.clone(),
                entry: entry.to_string(),
                spec: spec.clone(),
                options: options.clone(),
            });
        }
        Ok(Kernel {
            obj,
            context: self.inner.id(),
            source,
            elapsed: elapsed + spirv.map_or(Duration::ZERO, |s| s.elapsed),
            spirv,
        })
    }

    /// The SPIR-V image of a GLSL image through this context's SPIR-V cache; `None` for others.
    pub(crate) fn glsl_spirv(
        &self,
        image: &DeviceImage,
    ) -> Result<Option<(DeviceImage, SpirvStep)>> {
        self.inner.glsl_spirv(image)
    }

    /// What this context's SPIR-V cache did for GLSL images: compiles, compile errors, hits from
    /// memory and from stores.
    pub fn spirv_stats(&self) -> SpirvStats {
        self.inner.spirv_stats()
    }

    /// Answers an unknown entry point of a Vulkan image without building or caching anything.
    pub(crate) fn check_entry(&self, image: &DeviceImage, entry: &str) -> Result<()> {
        if self.backend() == BackendKind::Vulkan {
            // Reflection only: validation belongs to the build path (the backend validates before a
            // cold build, and an invalid image's failure is never cached), so a kernel served from memory
            // or from a persisted binary does not pay spirv-tools for an image an earlier build validated.
            let module = image.spirv_reflection()?;
            // An unknown entry point is the caller's mistake, not the program's: answer it without
            // building or caching anything.
            module.entry(image.name(), entry)?;
        }
        Ok(())
    }

    /// The context's queue. Every queue handle of a context is the same in-order queue.
    pub fn queue(&self) -> Queue {
        Queue {
            ctx: self.inner.clone(),
        }
    }

    /// A device buffer of `len` elements (contents undefined until written).
    ///
    /// Errors: [`Error::Size`] when `len` elements do not fit in 64 bits of bytes;
    /// [`Error::OutOfResources`] when the device has no room.
    pub fn buffer<T: Pod>(&self, len: usize) -> Result<Buffer<T>> {
        let bytes = (len as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| Error::Size {
                what: "buffer".into(),
                got: format!("{len} elements"),
                expected: "a byte size below 2^64".into(),
            })?;
        let handle = self.inner.create_buffer(bytes)?;
        Ok(Buffer::new(
            RawBuffer {
                handle,
                bytes,
                context: self.inner.id(),
            },
            len,
            self.inner.clone(),
        ))
    }

    /// A device buffer holding a copy of `data`.
    pub fn buffer_from<T: Pod>(&self, data: &[T]) -> Result<Buffer<T>> {
        let b = self.buffer::<T>(data.len())?;
        b.write(data)?;
        Ok(b)
    }

    /// Blocks until everything submitted to this context's queue has finished.
    pub fn finish(&self) -> Result<()> {
        self.inner.finish()
    }

    /// The in-memory cache's counters.
    pub fn memory_stats(&self) -> CacheStats {
        self.inner.memory_stats()
    }

    /// The backend's counters (programs built and loaded, driver pipeline-cache hits, launches).
    pub fn backend_stats(&self) -> BackendStats {
        self.inner.backend_stats()
    }

    /// Cache debug mode's comparisons of fresh builds with cached binaries (all zero unless
    /// `KPC_CACHE_DEBUG=1`).
    pub fn cache_debug_stats(&self) -> CacheDebugStats {
        self.inner.debug_stats()
    }

    /// The local disk cache's counters, or `None` when it is off.
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.inner.disk_stats()
    }

    /// Acquires every request's kernel at once, on a pool of worker threads (one per core, at most
    /// one per request): disk loads and cold builds of different programs overlap. Each request goes
    /// through [`Context::kernel`], so single flight holds: a key also requested elsewhere meanwhile
    /// is built once. [`Prefetch::wait`] gives one result per request, in order, each with its own
    /// error; dropping the handle cancels the requests not yet begun and waits for the running ones.
    pub fn prefetch(&self, requests: impl IntoIterator<Item = KernelRequest>) -> Prefetch<Kernel> {
        self.prefetch_impl(requests.into_iter().collect())
    }

    /// Blocks until the warm start begun at creation (`KPC_CACHE_PREFETCH`, [`Config::warm_start`])
    /// has loaded every remembered kernel it could, and returns what it did; `None` when warm start
    /// is off for this context.
    pub fn wait_warm_start(&self) -> Option<WarmStartReport> {
        self.inner.warm_start().and_then(|w| w.wait())
    }

    /// Writes the warm-start manifest now (it is also written when the last handle on the context is
    /// dropped): returns how many kernels it lists, or `None` when warm start is off or there was
    /// nothing new to write.
    ///
    /// Errors: [`Error::Io`] when the manifest cannot be written (the context is unaffected).
    pub fn save_warm_start(&self) -> Result<Option<usize>> {
        match self.inner.warm_start() {
            Some(w) => w.save(),
            None => Ok(None),
        }
    }

    /// What each persistent store (local disk, read-only layers, remote) did for this context, in
    /// lookup order.
    pub fn store_stats(&self) -> Vec<crate::cache::store::LevelStats> {
        self.inner.store_stats()
    }
}

/// A kernel ready to launch on the context that acquired it, with where it came from.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) obj: Arc<dyn KernelObject>,
    pub(crate) context: u64,
    pub(crate) source: Source,
    pub(crate) elapsed: Duration,
    /// For a kernel of a GLSL image: how its SPIR-V was obtained.
    pub(crate) spirv: Option<SpirvStep>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("info", self.obj.info())
            .field("source", &self.source)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

impl Kernel {
    /// Its parameters and workgroup shape.
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
