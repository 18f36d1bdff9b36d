//! `Context`: one device, one in-memory kernel and program cache, buffers and a queue: the surface
//! user code and the attention workload are written against, identical on every backend.
//!
//! A `Context` holds its backend behind the backend seam (`crate::backend::dynamic`): one
//! non-generic [`ProgramManager`] over the device's [`DynBackend`](crate::backend::dynamic::DynBackend)
//! and the same device as a [`DynComputeBackend`]. A backend plugs in by implementing the typed
//! backend traits and opening in `ContextBuilder::build`. Handles (kernels, buffers) remember the
//! context that made them, so a handle passed to another context is a typed error, not undefined
//! behaviour.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::dynamic::DynComputeBackend;
use crate::backend::{ComputeBackend, DeviceImage, DeviceInfo, KernelObject, Pod};
use crate::cache::{BuildOptions, SpecConstants, StoreChain};
use crate::config::{BackendKind, Config, SealMode};
use crate::error::{Error, Result};

use super::buffer::{Buffer, BufferArg, RawBuffer};
use super::kernel::Kernel;
use super::lifecycle::{Background, Life};
use super::prefetch::{KernelRequest, Prefetch};
use super::program_manager::ProgramManager;
use super::queue::Queue;
use super::spirv_cache::SpirvStep;
use super::warm_start::{LoadOutcome, WarmStart, WarmStartReport};

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// What every handle on one context shares.
pub(crate) struct Shared {
    pub(crate) id: u64,
    /// The device's programs and kernels, through the seam's program half (shared with the
    /// background builds of specialized kernels, which hold it weakly: `lazy.rs`).
    pub(crate) programs: Arc<ProgramManager>,
    /// The same device, through the seam's compute half.
    pub(crate) compute: Arc<dyn DynComputeBackend>,
    pub(crate) warm: Option<Arc<WarmStart>>,
    pub(crate) background: Background,
}

/// A device with its own in-memory kernel and program cache (one `KernelProgramCache`, through one
/// `ProgramManager`). Cloning is cheap and shares everything.
///
/// Guarantees: within a context a kernel is built at most once while cached, and later requests get
/// the same kernel; a failed build returns the same error again; every SPIR-V image is validated
/// before the cache is consulted, so an invalid image leaves no trace in it. When the drop of the
/// last kpc object made from a context returns, kpc makes no further call on its device (see
/// [`Context::quiesce`]). `Send` and `Sync`: every method may be called from any thread at once.
#[derive(Clone)]
pub struct Context {
    // Field order is drop order: the warm start stops (and its running loads end) before the
    // handle on the context goes.
    /// Shared by the embedder's handles only; `None` in the handles kpc's own threads hold.
    pub(crate) _life: Option<Arc<Life>>,
    pub(crate) inner: Arc<Shared>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.device();
        f.debug_struct("Context")
            .field("id", &self.inner.id)
            .field(
                "device",
                &format_args!("{}:{} {}", d.backend, d.index, d.name),
            )
            .finish()
    }
}

impl Context {
    /// A context over `backend` (opened already) whose persistent layer is exactly `stores`.
    pub(crate) fn from_backend_with_stores<B: ComputeBackend>(
        backend: B,
        config: &Config,
        stores: StoreChain,
    ) -> Context {
        let warm = WarmStart::from_config(config, &backend.fingerprint().digest);
        // The warm start remembers what this context acquires by subscribing to its kernels.
        let stores = match &warm {
            Some(w) => stores.with_observer(w.clone()),
            None => stores,
        };
        let backend = Arc::new(backend);
        let inner = Arc::new(Shared {
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            programs: Arc::new(ProgramManager::with_stores(backend.clone(), config, stores)),
            compute: backend,
            warm: warm.clone(),
            background: Background::default(),
        });
        let (seal, budget) = (config.seal, config.build_budget);
        if let Some(w) = &warm {
            w.share_through(inner.programs.stores().stores().cloned().collect());
            // Weak: the loader must not keep a context alive that its owner dropped. A load holds
            // the context while it runs; the owner's last drop stops the loader and waits for the
            // loads running then (Life), so none outlives that drop.
            let ctx = Arc::downgrade(&inner);
            let sealer = ctx.clone();
            w.start_then(
                move |r| {
                    ctx.upgrade().map_or(Ok(LoadOutcome::Cancelled), |c| {
                        super::warm_start::load_if_stored(&c.programs, r)
                    })
                },
                // KPC_CACHE_SEAL: sealed once the warm-up is over (KPC_CACHE_BUILD_BUDGET: once
                // that many builds more have run).
                move || {
                    if let Some(c) = sealer.upgrade() {
                        c.programs.seal_after_warm_up(seal, budget);
                    }
                },
            );
        } else {
            // No warm start, no warm-up: sealed from the start (hits of every store still serve),
            // or the build budget counts from the start.
            inner.programs.seal_after_warm_up(seal, budget);
        }
        let lazy = inner.programs.lazy().clone();
        Context {
            _life: Some(Arc::new(Life { warm, lazy })),
            inner,
        }
    }

    /// The device, as discovery described it when the context was opened (fixed for its life).
    pub fn device(&self) -> &DeviceInfo {
        self.inner.compute.device_info()
    }

    /// The device's backend: which image format its kernels take ([`crate::kernels::shipped`]
    /// picks kpc's own for it).
    pub fn backend(&self) -> BackendKind {
        self.inner.programs.kind()
    }

    /// The configuration the context was made with; it does not change after creation (the seal
    /// in force is [`Context::seal_mode`]).
    pub fn config(&self) -> &Config {
        self.inner.programs.config()
    }

    /// The context's program manager: direct access for tools and tests (its backend, typed, through
    /// [`ProgramManager::backend_as`]).
    pub fn program_manager(&self) -> &ProgramManager {
        &self.inner.programs
    }

    /// The kernel `entry` of `image`, unspecialized and with default build options: from this
    /// context's memory cache, a store (the disk cache, ...), or a fresh build. The returned
    /// [`Kernel`] says which. [`Context::kernel_with`] takes spec constants and build options.
    ///
    /// Errors: as [`Context::kernel_with`].
    pub fn kernel(&self, image: &DeviceImage, entry: &str) -> Result<Kernel> {
        self.acquire(
            image,
            entry,
            &SpecConstants::new(),
            &BuildOptions::default(),
        )
    }

    /// The kernel `request` names (image, entry, spec constants, build options): from this
    /// context's memory cache, a store, or a fresh build. The returned [`Kernel`] says which.
    ///
    /// Guarantees: within a context the kernel is built at most once while cached; a failed build
    /// returns the same error again without building.
    ///
    /// A request with a generic fallback ([`KernelRequest::or_generic`]) never waits for the build of
    /// its specialized kernel: while no layer holds that one, the fallback is returned
    /// ([`Kernel::is_generic`]) and the specialized kernel builds in the background; see
    /// `src/runtime/lazy.rs`.
    ///
    /// Errors: [`Error::InvalidSpirv`] for an invalid SPIR-V image (nothing is cached for it);
    /// [`Error::UnknownKernel`] for an entry point the image lacks; [`Error::InvalidSpirv`] (Vulkan)
    /// or [`Error::InvalidArgument`] (OpenCL) for an image of the other backend, naming the image
    /// function to use ([`crate::kernels::shipped`] picks the right one); [`Error::Build`] and
    /// [`Error::InvalidArgument`] (bad spec constants) for a build that fails, returned again from
    /// the cache on later requests.
    pub fn kernel_with(&self, request: &KernelRequest) -> Result<Kernel> {
        if let Some(generic) = &request.generic {
            return self.acquire_lazy(request, generic);
        }
        self.acquire(
            &request.image,
            &request.entry,
            &request.spec,
            &request.options,
        )
    }

    pub(crate) fn acquire(
        &self,
        image: &DeviceImage,
        entry: &str,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Kernel> {
        // A GLSL image becomes its SPIR-V image here, through the SPIR-V cache; from then on it is
        // keyed, built and cached as that SPIR-V.
        // Access bounds are declared for the image the caller names (a GLSL image's, not its SPIR-V's).
        let declared = options.as_str().is_empty().then(|| image.digest());
        let resolved = self.glsl_spirv(image)?;
        let (image, spirv) = match &resolved {
            Some((spirv_image, step)) => (spirv_image, Some(*step)),
            None => (image, None),
        };
        self.check_entry(image, entry)?;
        let a = self
            .inner
            .programs
            .kernel_local(image, entry, spec, options)?;
        Ok(Kernel {
            obj: a.value as Arc<dyn KernelObject>,
            context: self.inner.id,
            source: a.source,
            elapsed: a.elapsed + spirv.map_or(Duration::ZERO, |s| s.elapsed),
            spirv,
            declared,
            generic: false,
        })
    }

    /// [`Context::kernel_with`] for a request with a generic fallback: both images resolved and
    /// checked as [`Context::acquire`] does, then [`ProgramManager::kernel_or_generic`].
    fn acquire_lazy(&self, specialized: &KernelRequest, generic: &KernelRequest) -> Result<Kernel> {
        let resolve = |r: &KernelRequest| -> Result<(
            KernelRequest,
            Option<SpirvStep>,
            Option<crate::cache::Digest>,
        )> {
            let declared = r.options.as_str().is_empty().then(|| r.image.digest());
            let resolved = self.glsl_spirv(&r.image)?;
            let (image, step) = match resolved {
                Some((spirv_image, step)) => (spirv_image, Some(step)),
                None => (r.image.clone(), None),
            };
            self.check_entry(&image, &r.entry)?;
            let req = KernelRequest {
                image,
                entry: r.entry.clone(),
                spec: r.spec.clone(),
                options: r.options.clone(),
                generic: None,
            };
            Ok((req, step, declared))
        };
        let (s, s_step, s_declared) = resolve(specialized)?;
        let (g, g_step, g_declared) = resolve(generic)?;
        let got = self.inner.programs.kernel_or_generic(&s, &g)?;
        let a = got.acquired;
        let (spirv, declared) = if got.generic {
            (g_step, g_declared)
        } else {
            (s_step, s_declared)
        };
        Ok(Kernel {
            obj: a.value as Arc<dyn KernelObject>,
            context: self.inner.id,
            source: a.source,
            elapsed: a.elapsed + spirv.map_or(Duration::ZERO, |s| s.elapsed),
            spirv,
            declared,
            generic: got.generic,
        })
    }

    /// The SPIR-V image of a GLSL image through this context's SPIR-V cache; `None` for others.
    pub(crate) fn glsl_spirv(
        &self,
        image: &DeviceImage,
    ) -> Result<Option<(DeviceImage, SpirvStep)>> {
        self.inner.programs.glsl_spirv(image)
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

    /// The context's queue. Every queue handle of a context is the same in-order queue; a handle
    /// keeps the device alive after the context's other handles are dropped.
    pub fn queue(&self) -> Queue {
        Queue {
            backend: self.inner.compute.clone(),
            context: self.inner.id,
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
        let handle = self.inner.compute.create_buffer(bytes)?;
        Ok(Buffer::new(
            RawBuffer {
                handle,
                bytes,
                context: self.inner.id,
            },
            len,
            self.inner.compute.clone(),
        ))
    }

    /// Whether `buffer` was made on this context (or a clone of it): only such buffers may be passed
    /// to its kernels ([`Queue::submit`] refuses the others).
    pub fn owns(&self, buffer: &dyn BufferArg) -> bool {
        buffer.raw().context == self.inner.id
    }

    /// A device buffer holding a copy of `data`; the copy has finished when it returns.
    ///
    /// Errors: as [`Context::buffer`], and a device failure of the copy (the buffer is dropped).
    pub fn buffer_from<T: Pod>(&self, data: &[T]) -> Result<Buffer<T>> {
        let b = self.buffer::<T>(data.len())?;
        b.write(data)?;
        Ok(b)
    }

    /// Blocks until everything submitted to this context's queue has finished.
    ///
    /// Errors: [`Error::Backend`] for a device failure.
    pub fn finish(&self) -> Result<()> {
        self.inner.compute.finish()
    }

    /// Acquires every request's kernel at once, on a pool of worker threads (one per core, at most
    /// one per request): disk loads and cold builds of different programs overlap. Each request goes
    /// through [`Context::kernel`], so single flight holds: a key also requested elsewhere meanwhile
    /// is built once. [`Prefetch::wait`] gives one result per request, in order, each with its own
    /// error; dropping the handle cancels the requests not yet begun and waits for the running ones.
    pub fn prefetch(&self, requests: impl IntoIterator<Item = KernelRequest>) -> Prefetch<Kernel> {
        self.prefetch_impl(requests.into_iter().collect())
    }

    /// Seals the context: from now on an acquisition that no layer (memory, disk, read-only layer,
    /// remote, an embedder's store, a blob) can serve is reported and built (`warn`), refused
    /// with [`Error::Sealed`] without building (`error`), or, for a request with a generic
    /// fallback, served the fallback without building the specialized kernel (`generic`), as
    /// `KPC_CACHE_SEAL` ([`Config::seal`]) says; with that off, an explicit seal fails closed
    /// (`error`). Returns the mode put in force. With `KPC_CACHE_SEAL` set, a context seals itself
    /// when its warm start has finished; this seals it now. The seal holds for every handle on the
    /// context.
    pub fn seal(&self) -> SealMode {
        let mode = match self.config().seal {
            SealMode::Off => SealMode::Error,
            m => m,
        };
        self.seal_with(mode);
        mode
    }

    /// Puts `mode` in force now, for every handle on the context, whatever the configuration says;
    /// [`SealMode::Off`] unseals.
    pub fn seal_with(&self, mode: SealMode) {
        self.inner.programs.seal(mode);
    }

    /// The seal in force ([`SealMode::Off`] while not sealed).
    pub fn seal_mode(&self) -> SealMode {
        self.inner.programs.seal_stats().mode
    }

    /// Blocks until the warm start begun at creation (`KPC_CACHE_PREFETCH`, [`Config::warm_start`])
    /// has loaded every remembered kernel it could, and returns what it did; `None` when warm start
    /// is off for this context.
    pub fn wait_warm_start(&self) -> Option<WarmStartReport> {
        self.inner.warm.as_ref().and_then(|w| w.wait())
    }

    /// Writes the warm-start manifest now (it is also written when the last handle on the context is
    /// dropped): returns how many kernels it lists, or `None` when warm start is off or there was
    /// nothing new to write.
    ///
    /// Errors: [`Error::Io`] when the manifest cannot be written (the context is unaffected).
    pub fn save_warm_start(&self) -> Result<Option<usize>> {
        match &self.inner.warm {
            Some(w) => w.save(),
            None => Ok(None),
        }
    }
}
