//! The Vulkan backend, on ash with the loader opened at run time.
//!
//! - A program is a shader module + specialization constants + build options; building it creates
//!   the compute pipeline of every entry point through the program's own VkPipelineCache (see
//!   `program.rs` for why eagerly). A kernel is one entry point's pipeline.
//! - A program persists as its vkGetPipelineCacheData blob in a small kpc container
//!   (`pipeline_cache.rs`); before a blob reaches vkCreatePipelineCache its
//!   VkPipelineCacheHeaderVersionOne is checked against this device, and a mismatch is a miss.
//! - Where the driver supports VK_EXT_pipeline_creation_feedback, each pipeline records whether the
//!   driver reported APPLICATION_PIPELINE_CACHE_HIT: in `KernelInfo::driver_cache_hit`, in
//!   `BackendStats`, and in `kpc::build` trace events.
//! - Buffers are device-local with staging copies on a GPU, host-visible and mapped on a CPU device.
//!
//! Every SPIR-V image is validated by spirv-tools (`DeviceImage::spirv_module`) before a build hands it
//! to the driver. Loading a persisted binary does not validate again: the binary exists only because
//! an image with the same digest was validated and built before (see `program_from_binary`).

mod batch;
mod capability_check;
mod coopmat2;
mod device;
mod device_check;
mod dispatch;
mod features;
mod instance;
mod interop;
mod kernel_handles;
mod layouts;
pub mod pipeline_binary;
pub mod pipeline_cache;
mod pipeline_stats;
mod program;
mod queue_lock;
mod record;
mod submit;
mod submit_profile;
mod transfer;
mod validation;
mod vk_error;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{
    Backend, BackendLaunch, BackendStats, ComputeBackend, DeviceFingerprint, DeviceImage,
    DeviceInfo, ProgramOrigin,
};
use crate::cache::{BuildOptions, SpecConstants};
use crate::config::{BackendKind, Config, TraceFlags};
use crate::error::{Error, Result};

use device::{BufferPlace, Device};
pub use device::{VulkanBuffer, devices_created};
pub use features::VulkanFeatures;
pub use instance::devices;
pub use interop::VulkanHandles;
pub use kernel_handles::VulkanKernelHandles;
pub use pipeline_cache::CacheIdentity;
pub use program::{VulkanKernel, VulkanProgram};
pub use queue_lock::{VulkanQueueLock, queue_lock_sharers};
use submit::{Record, Submitter};
pub use validation::{validation_enabled, validation_errors};

/// Where buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BufferStrategy {
    /// Host-visible mapped memory on a CPU device; device-local memory with staging copies otherwise.
    #[default]
    Auto,
    /// Device-local memory with staging copies on every device. Lets tests run the GPU path on a CPU
    /// driver.
    Staging,
}

/// How to open a Vulkan device.
/// Non-exhaustive: `VulkanOptions::default().buffers(..)`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct VulkanOptions {
    /// Where buffers live.
    pub buffers: BufferStrategy,
}

impl VulkanOptions {
    /// Sets [`VulkanOptions::buffers`].
    pub fn buffers(mut self, buffers: BufferStrategy) -> Self {
        self.buffers = buffers;
        self
    }
}

/// The build options the Vulkan backend understands. Anything else is refused rather than silently
/// ignored, since an option a user believes in but kpc drops would still split the cache key.
const ACCEPTED_OPTIONS: &[&str] = &["-O"];

fn check_options(image: &DeviceImage, options: &BuildOptions) -> Result<()> {
    match options
        .as_str()
        .split(' ')
        .find(|o| !o.is_empty() && !ACCEPTED_OPTIONS.contains(o))
    {
        None => Ok(()),
        Some(o) => Err(Error::InvalidArgument(format!(
            "build option {o:?} for image {:?} is not a Vulkan build option; accepted: {}",
            image.name(),
            ACCEPTED_OPTIONS.join(" ")
        ))),
    }
}

/// Bytes moved per staging copy: bounds the host memory an upload or download of a large buffer
/// takes.
const STAGING_CHUNK: u64 = 64 << 20;
/// The smallest staging buffer allocated, so that small copies of varying sizes share one.
const STAGING_KEEP: u64 = 1 << 20;

#[derive(Default)]
struct Counters {
    programs_built: AtomicU64,
    programs_loaded: AtomicU64,
    programs_loaded_recompiled: AtomicU64,
    binaries_rejected: AtomicU64,
    driver_cache_hits: AtomicU64,
    driver_cache_misses: AtomicU64,
    driver_cache_unknown: AtomicU64,
    launches: AtomicU64,
    batches: AtomicU64,
}

/// One opened Vulkan device: the [`Backend`] and [`ComputeBackend`] of kpc's Vulkan path.
pub struct VulkanBackend {
    // Field order is drop order: the submitter waits for in-flight work before the device goes.
    submitter: Submitter,
    /// The last staging buffer, kept for the next host copy: allocating host-visible memory per
    /// write cost about a millisecond on NVIDIA, more than the copy of a KV-cache row.
    staging: parking_lot::Mutex<Option<Arc<VulkanBuffer>>>,
    dev: Arc<Device>,
    info: DeviceInfo,
    place: BufferPlace,
    trace: bool,
    counters: Counters,
}

impl std::fmt::Debug for VulkanBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanBackend")
            .field("device", &self.info.name)
            .field("index", &self.info.index)
            .finish()
    }
}

impl VulkanBackend {
    /// Opens device `index` of [`devices`] with a compute queue.
    ///
    /// Errors: [`Error::Unavailable`] when there is no loader, driver or such device, or the device
    /// cannot run kpc (its reason is in the message); [`Error::NoSuchDevice`] for an index past the
    /// last device.
    pub fn open(index: usize, config: &Config) -> Result<VulkanBackend> {
        VulkanBackend::open_with(index, config, &VulkanOptions::default())
    }

    /// [`VulkanBackend::open`] with explicit options.
    pub fn open_with(
        index: usize,
        config: &Config,
        options: &VulkanOptions,
    ) -> Result<VulkanBackend> {
        let inst = instance::instance()?;
        let pds = instance::physical_devices(&inst)?;
        if index >= pds.len() {
            return Err(Error::NoSuchDevice {
                selector: format!("vulkan:{index}"),
                available: pds
                    .iter()
                    .map(|p| format!("vulkan:{} {}", p.info.index, p.info.name))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
        let pd = pds[index].clone();
        if let Some(why) = &pd.info.unusable {
            return Err(instance::unavailable(format!(
                "device {index} ({}): {why}",
                pd.info.name
            )));
        }
        let dev = Arc::new(Device::open(inst, &pd)?);
        let mut info = pd.info;
        // Discovery's fingerprint is final for a pipeline-cache device; one described as loading
        // binaries gets the driver's key (or, where the path could not be opened, the cache kind).
        if pd.pipeline_binaries {
            info.fingerprint = pipeline_binary::fingerprint_for(
                &info.fingerprint,
                dev.pipeline_binary
                    .as_ref()
                    .map(|p| p.global_key.as_slice()),
            );
        }
        let place = match (options.buffers, info.device_type) {
            (BufferStrategy::Auto, crate::backend::DeviceType::Cpu) => BufferPlace::HostVisible,
            _ => BufferPlace::DeviceLocal,
        };
        Ok(VulkanBackend {
            submitter: Submitter::new(&dev, None)?,
            staging: parking_lot::Mutex::new(None),
            dev,
            info,
            place,
            trace: config.trace.contains(TraceFlags::BUILDS),
            counters: Counters::default(),
        })
    }

    /// The fingerprint cache entries of device `index` are keyed by. It is the discovered one except
    /// on a device that persists pipeline binaries, whose fingerprint also holds the driver's
    /// global pipeline key, readable only from an open device: that device is opened (and kept
    /// for the next context, as every device kpc opens).
    ///
    /// Errors: as [`VulkanBackend::open`].
    pub fn cache_fingerprint(index: usize, config: &Config) -> Result<DeviceFingerprint> {
        let inst = instance::instance()?;
        let pds = instance::physical_devices(&inst)?;
        match pds.get(index) {
            Some(pd) if !pd.pipeline_binaries => Ok(pd.info.fingerprint.clone()),
            _ => Ok(VulkanBackend::open(index, config)?.info.fingerprint.clone()),
        }
    }

    /// What a pipeline-cache blob made on this device carries in its header.
    pub fn cache_identity(&self) -> CacheIdentity {
        self.dev.identity
    }

    /// Whether the driver reports pipeline-creation feedback (cache hits) at all.
    pub fn has_creation_feedback(&self) -> bool {
        self.dev.feedback
    }

    /// Whether buffers are host-visible (mapped) rather than device-local with staging.
    pub fn host_visible_buffers(&self) -> bool {
        self.place == BufferPlace::HostVisible
    }

    /// Counts the driver's feedback and, with `KPC_CACHE_TRACE` builds on, traces each pipeline's
    /// creation and where the program's time went (`before`: decoding and reflecting a stored
    /// binary, zero for a build).
    fn record_feedback(&self, image: &str, built: &program::Built, how: &str, before: Duration) {
        let program = &built.program;
        if self.trace {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let sum = |f: fn(&program::Pipeline) -> Duration| {
                ms(program.pipelines.iter().map(|p| f(p)).sum())
            };
            tracing::info!(
                target: "kpc::build",
                backend = "vulkan",
                image,
                how,
                decode_reflect_ms = ms(before),
                check_ms = ms(built.check_time),
                binaries_ms = ms(built.binary_time),
                set_layout_ms = sum(|p| p.set_layout_time),
                pipeline_layout_ms = sum(|p| p.layout_time),
                create_ms = sum(|p| p.create_time),
                stats_ms = sum(|p| p.stats_time),
                "program steps"
            );
        }
        for (p, fb) in program.pipelines.iter().zip(&built.feedback) {
            let c = match fb {
                Some(true) => &self.counters.driver_cache_hits,
                Some(false) => &self.counters.driver_cache_misses,
                None => &self.counters.driver_cache_unknown,
            };
            c.fetch_add(1, Ordering::Relaxed);
            if self.trace {
                tracing::info!(
                    target: "kpc::build",
                    backend = "vulkan",
                    image,
                    entry = p.info.name.as_str(),
                    how,
                    ms = p.create_time.as_secs_f64() * 1e3,
                    driver_cache_hit = ?fb,
                    "vkCreateComputePipelines"
                );
            }
        }
    }
}

impl Backend for VulkanBackend {
    type Program = VulkanProgram;
    type Kernel = VulkanKernel;

    fn kind(&self) -> BackendKind {
        BackendKind::Vulkan
    }

    fn fingerprint(&self) -> &DeviceFingerprint {
        &self.info.fingerprint
    }

    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<VulkanProgram> {
        check_options(image, options)?;
        let module = image.spirv_module()?;
        let optimized = options
            .has("-O")
            .then(|| crate::backend::spirv::optimize(image.name(), &module.words))
            .transpose()?;
        let built = program::build(
            &self.dev,
            image.name(),
            module,
            optimized,
            spec,
            program::Source::Spirv { initial_cache: &[] },
            ProgramOrigin::new(&self.info.fingerprint, image, spec, options),
        )?;
        self.counters.programs_built.fetch_add(1, Ordering::Relaxed);
        self.record_feedback(image.name(), &built, "built", Duration::ZERO);
        Ok(built.program)
    }

    fn program_binary(&self, program: &VulkanProgram) -> Result<Option<Vec<u8>>> {
        program.binary().map(Some)
    }

    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<VulkanProgram> {
        let reject = |reason: String| {
            self.counters
                .binaries_rejected
                .fetch_add(1, Ordering::Relaxed);
            Error::BinaryRejected {
                backend: BackendKind::Vulkan,
                image: image.name().to_string(),
                reason,
            }
        };
        check_options(image, options)?;
        let decode_start = Instant::now();
        let blob = pipeline_cache::decode(binary).map_err(reject)?;
        // The fingerprint keeps entries of the other kind from being looked up here; a blob that
        // still arrives (copied by hand, forged) is refused before the driver sees it.
        let binaries = match (blob.payload, &self.dev.pipeline_binary) {
            (pipeline_cache::Payload::PipelineCache(data), None) => {
                pipeline_cache::check_pipeline_cache_header(data, &self.dev.identity)
                    .map_err(reject)?;
                None
            }
            (pipeline_cache::Payload::PipelineBinaries(data), Some(_)) => {
                Some(pipeline_binary::decode(data).map_err(reject)?)
            }
            (payload, path) => {
                return Err(reject(format!(
                    "a {} entry on a device that loads {}",
                    payload.kind(),
                    if path.is_some() {
                        pipeline_cache::PIPELINE_BINARY_KIND
                    } else {
                        pipeline_cache::PIPELINE_CACHE_KIND
                    }
                )));
            }
        };
        // No spirv-tools pass here: a binary is persisted only after a build, which validated an image
        // with this digest (the persisted key compares it exactly), so validating again would only add
        // its cost (0.2-0.5 ms) to the disk-hit path it exists to make fast. Reflection (what the
        // pipelines' layouts need) is cheap.
        let module = image.spirv_reflection()?;
        let optimized = match (options.has("-O"), blob.optimized_spirv) {
            (true, Some(bytes)) => {
                // The optimizer's output, validated when it was produced (see `spirv::optimize`) and
                // as trustworthy as the pipeline cache data beside it: both were written by kpc after a
                // successful build and checksummed by the disk layer. Only its shape is checked.
                let words = crate::backend::spirv::words_from_bytes(image.name(), bytes)
                    .map_err(|e| reject(e.to_string()))?;
                Some(words)
            }
            (false, None) => None,
            (true, None) => {
                return Err(reject(
                    "built with -O but the binary holds no optimized SPIR-V".into(),
                ));
            }
            (false, Some(_)) => {
                return Err(reject(
                    "the binary holds optimized SPIR-V but -O was not given".into(),
                ));
            }
        };
        let before = decode_start.elapsed();
        let how = if binaries.is_some() {
            "from pipeline binaries"
        } else {
            "from pipeline cache data"
        };
        let source = match binaries {
            Some(b) => program::Source::Binaries(b),
            None => program::Source::Spirv {
                initial_cache: blob.payload.bytes(),
            },
        };
        let built = program::build(
            &self.dev,
            image.name(),
            module,
            optimized,
            spec,
            source,
            ProgramOrigin::new(&self.info.fingerprint, image, spec, options),
        )?;
        self.counters
            .programs_loaded
            .fetch_add(1, Ordering::Relaxed);
        if built.program.driver_cache_hit() == Some(false) {
            self.counters
                .programs_loaded_recompiled
                .fetch_add(1, Ordering::Relaxed);
        }
        self.record_feedback(image.name(), &built, how, before);
        Ok(built.program)
    }

    fn load_avoided_compile(&self, program: &VulkanProgram) -> Option<bool> {
        program.driver_cache_hit()
    }

    fn create_kernel(&self, program: &Arc<VulkanProgram>, entry: &str) -> Result<VulkanKernel> {
        program
            .pipelines
            .iter()
            .find(|p| p.info.name == entry)
            .map(|p| VulkanKernel {
                pipeline: p.clone(),
                program: program.clone(),
                handles: std::sync::OnceLock::new(),
            })
            .ok_or_else(|| Error::UnknownKernel {
                image: program.image.clone(),
                entry: entry.to_string(),
                available: program
                    .pipelines
                    .iter()
                    .map(|p| p.info.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl ComputeBackend for VulkanBackend {
    type Buffer = VulkanBuffer;
    type Event = Arc<Record>;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn create_buffer(&self, bytes: u64) -> Result<VulkanBuffer> {
        VulkanBuffer::new(&self.dev, bytes, self.place)
    }

    fn write_buffer(&self, buffer: &VulkanBuffer, offset: u64, data: &[u8]) -> Result<()> {
        self.write(buffer, offset, data)
    }

    fn read_buffer(&self, buffer: &VulkanBuffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read(buffer, offset, out)
    }

    unsafe fn import_buffer(
        &self,
        foreign: &crate::backend::ForeignBuffer,
    ) -> Result<VulkanBuffer> {
        use ash::vk::{self, Handle};
        match *foreign {
            crate::backend::ForeignBuffer::Vulkan {
                buffer,
                memory,
                offset,
                size,
            } => {
                // SAFETY: the caller's contract (ComputeBackend::import_buffer) is import's.
                unsafe {
                    VulkanBuffer::import(
                        &self.dev,
                        vk::Buffer::from_raw(buffer),
                        vk::DeviceMemory::from_raw(memory),
                        offset,
                        size,
                    )
                }
            }
            crate::backend::ForeignBuffer::OpenCl { .. } => Err(Error::InvalidArgument(
                "an OpenCL cl_mem cannot be imported into a Vulkan context".into(),
            )),
        }
    }

    fn submit(&self, launches: &[BackendLaunch<'_, Self>]) -> Result<Arc<Record>> {
        self.dispatch(launches)
    }

    fn wait(&self, event: &Arc<Record>) -> Result<()> {
        event.wait()
    }

    fn launch_intervals(&self, event: &Arc<Record>) -> Result<Option<Vec<(u64, u64)>>> {
        event.launch_intervals()
    }

    fn finish(&self) -> Result<()> {
        self.submitter.finish()
    }

    fn stats(&self) -> BackendStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        BackendStats {
            programs_built: l(&c.programs_built),
            programs_loaded: l(&c.programs_loaded),
            programs_loaded_recompiled: l(&c.programs_loaded_recompiled),
            binaries_rejected: l(&c.binaries_rejected),
            driver_cache_hits: l(&c.driver_cache_hits),
            driver_cache_misses: l(&c.driver_cache_misses),
            driver_cache_unknown: l(&c.driver_cache_unknown),
            launches: l(&c.launches),
            batches: l(&c.batches),
        }
    }
}
