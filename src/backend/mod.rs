//! The backend layer: devices, fingerprints, building programs, serializing them to binaries and
//! back, kernels, buffers and launches. Backends know nothing of caching; the runtime layer decides
//! when to build and what to persist.
//!
//! Two traits split the work. [`Backend`] is the program part the cache layer drives (build, binary
//! out, binary in, kernel). [`ComputeBackend`] adds what running kernels needs (device description,
//! buffers, launches, events). [`dynamic`] erases both once, for every backend, so that the runtime
//! above it (its program manager, `Context`, user code and the attention workload) is written once
//! and is the same on every backend.

pub mod dynamic;
#[cfg(not(loom))]
pub mod glsl;
pub mod image;
#[cfg(not(loom))]
pub mod opencl;
pub mod pod;
#[cfg(not(loom))]
pub mod process;
#[cfg(not(loom))]
pub mod spirv;
#[cfg(not(loom))]
pub mod vulkan;

pub use image::{DeviceImage, ImageFormat};
pub use pod::Pod;

use std::any::Any;
use std::sync::Arc;

use crate::cache::{BuildOptions, CacheCost, Digest, SpecConstants};
use crate::config::BackendKind;
use crate::error::Result;

/// kpc's own binary-format version. It is part of every device fingerprint, so bumping it invalidates
/// every persisted binary at once.
pub const KPC_FORMAT_VERSION: u32 = 1;

/// What identifies a device and driver for the purpose of reusing a binary: every field that, if it
/// changed, could make an old binary wrong.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DeviceFingerprint {
    /// The backend.
    pub backend: BackendKind,
    /// Named fields (vendor id, device id, driver version, pipeline cache UUID, ...), in a fixed order.
    pub fields: Vec<(String, String)>,
    /// BLAKE3 over the backend, every field and kpc's cache format version.
    pub digest: Digest,
}

impl DeviceFingerprint {
    /// A fingerprint of `fields`; the digest covers their names and values and kpc's format version.
    pub fn new(backend: BackendKind, fields: Vec<(String, String)>) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"kpc-device-fingerprint");
        h.update(&KPC_FORMAT_VERSION.to_le_bytes());
        h.update(backend.to_string().as_bytes());
        for (k, v) in &fields {
            for part in [k.as_bytes(), v.as_bytes()] {
                h.update(&(part.len() as u64).to_le_bytes());
                h.update(part);
            }
        }
        DeviceFingerprint {
            backend,
            fields,
            digest: Digest(*h.finalize().as_bytes()),
        }
    }

    /// The fields as `name=value` lines: what a disk entry's `.src` stores and compares exactly.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "backend={}\nkpc_format={KPC_FORMAT_VERSION}\n",
            self.backend
        );
        for (k, v) in &self.fields {
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}

/// One device of one backend, as the runtime builds on it.
///
/// Program methods are called by the runtime's `ProgramManager` only on a cache miss; none of them
/// caches anything itself.
pub trait Backend: Send + Sync + 'static {
    /// A built program (Vulkan: shader module + pipeline cache; OpenCL: cl_program).
    type Program: CacheCost + Send + Sync + 'static;
    /// A kernel of a program, ready to launch (Vulkan: compute pipeline; OpenCL: cl_kernel).
    type Kernel: KernelObject;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The device and driver identity that binaries are keyed on.
    fn fingerprint(&self) -> &DeviceFingerprint;

    /// Builds `image` from scratch with these specialization constants and options.
    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<Self::Program>;

    /// The bytes to persist for `program`, or `None` when this backend has nothing worth persisting.
    fn program_binary(&self, program: &Self::Program) -> Result<Option<Vec<u8>>>;

    /// Recreates a program from bytes [`Backend::program_binary`] returned, possibly in another
    /// process. An `Err` means the binary was not usable (rejected by the driver, mismatched header):
    /// the runtime treats it as a miss and builds from scratch.
    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<Self::Program>;

    /// Whether recreating `program` from a binary ([`Backend::program_from_binary`]) spared the
    /// driver's compile: `Some(false)` where the driver reported that it compiled anyway (Vulkan:
    /// creation feedback without APPLICATION_PIPELINE_CACHE_HIT, as on lavapipe, whose pipeline cache
    /// is a stub), `Some(true)` where it reported that it did not, `None` where it does not say (the
    /// default). The runtime counts `Some(false)` loads apart from the build time hits saved.
    fn load_avoided_compile(&self, program: &Self::Program) -> Option<bool> {
        let _ = program;
        None
    }

    /// Creates the kernel for entry point `entry` of `program`.
    fn create_kernel(&self, program: &Arc<Self::Program>, entry: &str) -> Result<Self::Kernel>;
}

/// What kind of device a backend exposes, as its API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// A discrete GPU.
    DiscreteGpu,
    /// A GPU sharing memory with the host.
    IntegratedGpu,
    /// A virtualized GPU.
    VirtualGpu,
    /// A CPU implementation (lavapipe, PoCL).
    Cpu,
    /// Anything else the API reports.
    Other,
}

impl DeviceType {
    /// Whether this is any kind of GPU.
    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            DeviceType::DiscreteGpu | DeviceType::IntegratedGpu | DeviceType::VirtualGpu
        )
    }
}

impl std::fmt::Display for DeviceType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceType::DiscreteGpu => "discrete-gpu",
            DeviceType::IntegratedGpu => "integrated-gpu",
            DeviceType::VirtualGpu => "virtual-gpu",
            DeviceType::Cpu => "cpu",
            DeviceType::Other => "other",
        })
    }
}

/// Device limits that kernels are tuned against (workgroup and tile sizes are chosen per device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceLimits {
    /// Most invocations (work-items) in one workgroup.
    pub max_workgroup_invocations: u32,
    /// Most invocations per dimension of one workgroup.
    pub max_workgroup_size: [u32; 3],
    /// Most workgroups per dimension of one launch.
    pub max_workgroup_count: [u32; 3],
    /// Bytes of workgroup-shared (local) memory.
    pub max_shared_memory_bytes: u32,
    /// Bytes of push constants (OpenCL: of scalar kernel arguments) one launch may pass.
    pub max_push_constant_bytes: u32,
    /// Subgroup (warp, wave, SIMD) width, where the API reports one.
    pub subgroup_size: Option<u32>,
    /// Whether compute kernels may exchange values across a subgroup (Vulkan: shuffle operations in
    /// the compute stage). Selects the vectorized decode kernel.
    pub subgroup_shuffle: bool,
    /// Whether storage buffers may hold 16-bit values (fp16 K/V).
    pub storage_16bit: bool,
    /// Whether the device multiplies 16x16 fp16 matrices into fp32 ones on its matrix units, one
    /// subgroup per product (Vulkan: VK_KHR_cooperative_matrix lists M=N=K=16, f16 x f16 + f32 -> f32
    /// at subgroup scope, and kpc enabled it with the Vulkan memory model). Selects the
    /// cooperative-matrix prefill kernel.
    pub cooperative_matrix_f16: bool,
    /// Whether, besides [`DeviceLimits::cooperative_matrix_f16`], the device lists the same 16x16x16
    /// fp16 product into fp16 accumulators (the fp16-accumulate GEMM variant needs it).
    pub cooperative_matrix_f16_acc: bool,
    /// The largest workgroup that may own workgroup-scope matrices, where the device also has what
    /// `attn_prefill_cm2` uses of VK_NV_cooperative_matrix2 (workgroup scope, flexible dimensions,
    /// reductions, conversions, per-element operations, tensor addressing) enabled besides
    /// [`DeviceLimits::cooperative_matrix_f16`]; 0 otherwise. Selects that prefill kernel.
    pub cooperative_matrix2_workgroup: u32,
    /// Whether kernels may compute in fp16.
    pub float16_arithmetic: bool,
    /// Whether launches can be timed on the device (timestamp queries, profiling events).
    pub timestamps: bool,
    /// Whether the device keeps every kernel's buffer accesses inside the bound buffer (Vulkan's
    /// `robustBufferAccess`, enabled). Then [`crate::Queue::submit`] launches any kernel safely;
    /// without it only kernels with declared access bounds do. OpenCL has no such guarantee.
    pub robust_buffer_access: bool,
}

/// One device as discovery reports it, before anything is opened on it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// Its backend.
    pub backend: BackendKind,
    /// Its position in the backend's enumeration order: what `KPC_DEVICE=vulkan:N` names.
    pub index: usize,
    /// The device name the driver reports.
    pub name: String,
    /// What kind of device it is.
    pub device_type: DeviceType,
    /// The driver's name and version, in words.
    pub driver: String,
    /// The API version the device supports (Vulkan `1.3.230`, OpenCL `OpenCL 3.0 ...`).
    pub api_version: String,
    /// What binaries built on it are keyed on.
    pub fingerprint: DeviceFingerprint,
    /// Limits kernels are tuned against.
    pub limits: DeviceLimits,
    /// `None` when kpc can run on it; otherwise why not (too old an API version, no compute queue).
    pub unusable: Option<String>,
}

impl DeviceInfo {
    /// A usable device described by its backend, enumeration index, name and fingerprint, with
    /// every other field empty or default; for a backend implemented outside kpc and for tests,
    /// which then set the public fields they know.
    pub fn new(
        backend: BackendKind,
        index: usize,
        name: impl Into<String>,
        fingerprint: DeviceFingerprint,
    ) -> Self {
        DeviceInfo {
            backend,
            index,
            name: name.into(),
            device_type: DeviceType::Other,
            driver: String::new(),
            api_version: String::new(),
            fingerprint,
            limits: DeviceLimits::default(),
            unusable: None,
        }
    }
}

/// One buffer parameter of a kernel, in launch-argument order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BufferParam {
    /// Vulkan: the binding number in descriptor set 0. OpenCL: the kernel argument index.
    pub binding: u32,
    /// The parameter's name where the image records one (may be empty).
    pub name: String,
    /// Whether the kernel only reads it.
    pub read_only: bool,
    /// The fewest bytes a bound buffer must have (the fixed part of the block; a runtime-sized array
    /// counts as empty).
    pub min_bytes: u64,
}

/// What launching a kernel needs to know about it: its parameters and workgroup shape.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelInfo {
    /// The entry point name.
    pub name: String,
    /// Buffer parameters, in the order a launch passes them.
    pub buffers: Vec<BufferParam>,
    /// Bytes of push constants a launch must pass, exactly. OpenCL maps these bytes onto the
    /// kernel's scalar arguments in order, each at its natural alignment (the std430 rule).
    pub push_constant_bytes: u32,
    /// The workgroup size after specialization: a launch is a grid of workgroups of this size.
    pub local_size: [u32; 3],
    /// Whether the driver reported that this kernel's pipeline came from the pipeline-cache data kpc
    /// handed it (VK_EXT_pipeline_creation_feedback's APPLICATION_PIPELINE_CACHE_HIT). `None` where
    /// the driver does not say.
    pub driver_cache_hit: Option<bool>,
    /// What the driver reports about the compiled kernel, as (name, value) pairs: registers per
    /// invocation, shared memory, instruction counts and the like (Vulkan:
    /// VK_KHR_pipeline_executable_properties). Empty where the driver reports nothing.
    pub driver_stats: Vec<(String, String)>,
}

impl KernelInfo {
    /// A kernel `name` of workgroup size `local_size` with no buffers, no push constants and no
    /// driver feedback; for a backend implemented outside kpc and for tests, which then set the
    /// public fields they know.
    pub fn new(name: impl Into<String>, local_size: [u32; 3]) -> Self {
        KernelInfo {
            name: name.into(),
            buffers: Vec::new(),
            push_constant_bytes: 0,
            local_size,
            driver_cache_hit: None,
            driver_stats: Vec::new(),
        }
    }
}

/// Counters a compute backend keeps about itself (the cache layer keeps its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Programs built from a device image.
    pub programs_built: u64,
    /// Programs recreated from a persisted binary.
    pub programs_loaded: u64,
    /// Of those, programs the driver compiled anyway (it reported no pipeline-cache hit for some
    /// kernel): loaded, but no compile saved.
    pub programs_loaded_recompiled: u64,
    /// Persisted binaries rejected before reaching the driver (header mismatch, corruption) or by it.
    pub binaries_rejected: u64,
    /// Kernels (pipelines) the driver reported as served from the supplied pipeline-cache data.
    pub driver_cache_hits: u64,
    /// Kernels the driver reported as compiled despite any supplied data.
    pub driver_cache_misses: u64,
    /// Kernels for which the driver gave no feedback.
    pub driver_cache_unknown: u64,
    /// Launches submitted.
    pub launches: u64,
    /// Batches submitted ([`crate::Queue::submit`] calls, each of any number of launches). On a
    /// Vulkan device kpc opened several close batches may still share one `vkQueueSubmit`.
    pub batches: u64,
}

/// What a program was built from: every part of its persistent key. kpc's backends record it when
/// they build or load a program (a cold path), so that a kernel can later say what it is and be
/// serialized into a cache blob without the image, and without costing the hit path anything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProgramOrigin {
    /// The device and driver it was built for.
    pub device: DeviceFingerprint,
    /// The image's name (informational; not part of the key).
    pub image_name: String,
    /// Digest of the image bytes.
    pub image_digest: Digest,
    /// Length of the image in bytes.
    pub image_len: u64,
    /// Its specialization constants.
    pub spec: SpecConstants,
    /// Its normalized build options.
    pub options: BuildOptions,
}

impl ProgramOrigin {
    /// The origin of `image` built with `spec` and `options` on the device `device` describes.
    pub fn new(
        device: &DeviceFingerprint,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Self {
        ProgramOrigin {
            device: device.clone(),
            image_name: image.name().to_string(),
            image_digest: image.digest(),
            image_len: image.bytes().len() as u64,
            spec: spec.clone(),
            options: options.clone(),
        }
    }
}

/// A kernel as the runtime holds it: whatever the backend's kernel type is, it can describe itself
/// and be recognized again when launched.
pub trait KernelObject: Any + Send + Sync {
    /// What launching it needs.
    fn info(&self) -> &KernelInfo;
    /// Itself, for the backend to recover its own type at launch.
    fn as_any(&self) -> &dyn Any;
    /// What its program was built from, where the backend keeps it (kpc's backends do).
    fn origin(&self) -> Option<&ProgramOrigin> {
        None
    }
    /// Its program serialized exactly as [`Backend::program_binary`] does (what a cache blob
    /// carries); `Ok(None)` where the backend persists nothing or does not keep the program.
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

/// One kernel launch: a grid of `groups` workgroups of the kernel's local size, with buffer arguments
/// in [`KernelInfo::buffers`] order and push-constant bytes. The one launch descriptor of every
/// layer, generic over what holds the kernel (`K`) and the buffers (`A`), as wgpu's descriptors are
/// over their labels: [`crate::LaunchDesc`] at the surface (a runtime kernel and borrowed buffer
/// arguments, checked by [`crate::Queue::submit`]), `DynLaunch` behind the type-erased
/// seam, and [`BackendLaunch`] in a backend's own types.
///
/// Exhaustive on purpose, as wgpu's descriptors: a caller writes it as a literal, and each of the
/// four fields is required for every launch.
#[derive(Clone, Copy)]
pub struct Launch<'a, K: ?Sized, A> {
    /// The kernel. A backend keeps alive whatever of it the device uses until the launch finishes.
    pub kernel: &'a K,
    /// Workgroups per dimension.
    pub groups: [u32; 3],
    /// Buffer arguments, in [`KernelInfo::buffers`] order; a backend keeps them alive until the
    /// launch has finished.
    pub buffers: A,
    /// Push-constant bytes, exactly [`KernelInfo::push_constant_bytes`] long.
    pub push_constants: &'a [u8],
}

/// [`Launch`] in backend `B`'s own kernel and buffer types: what [`ComputeBackend::submit`] takes.
pub type BackendLaunch<'a, B> =
    Launch<'a, <B as Backend>::Kernel, Vec<Arc<<B as ComputeBackend>::Buffer>>>;

/// A device that runs kernels: the part of a backend beyond building programs.
///
/// Ordering: every method behaves as on an in-order queue. A launch starts after everything submitted
/// before it has finished; `write_buffer` and `read_buffer` are synchronous and ordered after every
/// earlier launch. Methods may be called from many threads at once.
pub trait ComputeBackend: Backend {
    /// A device buffer of bytes.
    type Buffer: Send + Sync + 'static;
    /// A submitted batch of launches that can be waited on and timed.
    type Event: Send + Sync + 'static;

    /// The device, as discovery reported it.
    fn device_info(&self) -> &DeviceInfo;

    /// A buffer of `bytes` bytes (contents undefined).
    fn create_buffer(&self, bytes: u64) -> crate::Result<Self::Buffer>;

    /// Copies `data` into `buffer` at byte `offset`, after every earlier launch has finished. The
    /// caller has checked the range.
    fn write_buffer(&self, buffer: &Self::Buffer, offset: u64, data: &[u8]) -> crate::Result<()>;

    /// Copies from `buffer` at byte `offset` into `out`, after every earlier launch has finished. The
    /// caller has checked the range.
    fn read_buffer(&self, buffer: &Self::Buffer, offset: u64, out: &mut [u8]) -> crate::Result<()>;

    /// Submits launches, in order, as one batch. The caller has checked argument counts and push
    /// sizes against [`KernelInfo`]; the backend checks what only it knows (device limits).
    fn submit(&self, launches: &[BackendLaunch<'_, Self>]) -> crate::Result<Self::Event>;

    /// Blocks until the batch has finished.
    fn wait(&self, event: &Self::Event) -> crate::Result<()>;

    /// Waits, then returns each launch's device start and end, in nanoseconds from an origin common
    /// to the batch, or `None` where the device cannot time launches.
    fn launch_intervals(&self, event: &Self::Event) -> crate::Result<Option<Vec<(u64, u64)>>>;

    /// Blocks until everything submitted so far has finished.
    fn finish(&self) -> crate::Result<()>;

    /// This backend's counters.
    fn stats(&self) -> BackendStats;

    /// A buffer over memory the embedder owns, used in place, never freed
    /// by kpc. The default refuses: the backend imports nothing.
    ///
    /// # Safety
    /// As [`crate::runtime::Context::import_vulkan_buffer`] and
    /// [`crate::runtime::Context::import_opencl_buffer`]: the handle is a live buffer of this
    /// backend's device, of at least the size given, that outlives every kpc use of it.
    unsafe fn import_buffer(&self, foreign: &ForeignBuffer) -> crate::Result<Self::Buffer> {
        let _ = foreign;
        Err(crate::Error::InvalidArgument(format!(
            "the {} backend {:?} imports no buffers",
            self.device_info().backend,
            self.device_info().name
        )))
    }
}

/// An embedder's own buffer, named by its API's handles, for [`ComputeBackend::import_buffer`].
#[derive(Debug, Clone, Copy)]
pub enum ForeignBuffer {
    /// A `VkBuffer` (its raw handle) created on the context's `VkDevice` with storage-buffer and
    /// transfer source and destination usage, bound to `memory`; kpc uses `size` bytes from byte
    /// `offset` of it.
    Vulkan {
        /// The `VkBuffer`, as its raw 64-bit handle.
        buffer: u64,
        /// The `VkDeviceMemory` it is bound to, as its raw handle (not null).
        memory: u64,
        /// The first byte kpc uses: a multiple of the device's `minStorageBufferOffsetAlignment`.
        offset: u64,
        /// Bytes kpc uses from `offset`.
        size: u64,
    },
    /// A `cl_mem` buffer of the context's `cl_context`; kpc uses its first `size` bytes.
    OpenCl {
        /// The `cl_mem`, as a pointer-sized value. kpc retains it while it uses it.
        mem: usize,
        /// Bytes kpc uses.
        size: u64,
    },
}
