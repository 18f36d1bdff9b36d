//! Programs (shader module + specialization + options, with a VkPipelineCache holding its pipelines)
//! and kernels (one compute pipeline per entry point).
//!
//! A program creates the pipeline of every entry point when it is built, not when a kernel is first
//! asked for. That is what puts the compiled pipelines into the program's VkPipelineCache, so that
//! `program_binary` (vkGetPipelineCacheData), which the runtime calls right after a build to persist
//! it, holds them; a lazily filled cache would persist an empty blob. kpc's images have one or two
//! entry points, so the extra pipelines cost little.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use crate::backend::spirv::{DescriptorKind, SpirvModule};
use crate::backend::{BufferParam, KernelInfo, ProgramOrigin};
use crate::cache::{CacheCost, SpecConstants};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::device::{Device, vk_err};
use super::device_check::build_error;
use super::pipeline_binary::BinaryData;
use super::pipeline_cache::Payload;

/// A compute pipeline with its layouts: a kernel. Shared between the program that made it and every
/// kernel handle and in-flight launch that uses it.
pub struct Pipeline {
    dev: Arc<Device>,
    pub(crate) raw: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) set_layout: vk::DescriptorSetLayout,
    /// Whether the layouts are the device's shared pair (see `layouts.rs`), not this pipeline's.
    pub(crate) shared_layout: bool,
    /// Storage and uniform descriptors one set of `set_layout` takes from a pool.
    pub(crate) set_storage: u32,
    pub(crate) set_uniform: u32,
    /// Descriptor type per buffer parameter, in launch order.
    pub(crate) descriptor_types: Vec<vk::DescriptorType>,
    pub(crate) info: KernelInfo,
    /// How long vkCreateComputePipelines took for it.
    pub(crate) create_time: Duration,
    /// How long its descriptor-set layout, pipeline layout and the driver's statistics took.
    pub(crate) set_layout_time: Duration,
    pub(crate) layout_time: Duration,
    pub(crate) stats_time: Duration,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("info", &self.info)
            .finish()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: launches keep their pipeline alive (Arc) until their fence signaled, so nothing
        // uses these objects now; null handles (a failed build) are ignored by Vulkan. Shared
        // layouts are the device's (destroyed with it).
        unsafe {
            self.dev.raw.destroy_pipeline(self.raw, None);
            if !self.shared_layout {
                self.dev.raw.destroy_pipeline_layout(self.layout, None);
                self.dev
                    .raw
                    .destroy_descriptor_set_layout(self.set_layout, None);
            }
        }
    }
}

/// A built Vulkan program: its pipelines, and the pipeline cache they were created through.
pub struct VulkanProgram {
    dev: Arc<Device>,
    pub(crate) cache: vk::PipelineCache,
    pub(crate) image: String,
    pub(crate) pipelines: Vec<Arc<Pipeline>>,
    /// The optimized module, for programs built with -O: persisted so that a load skips the optimizer.
    pub(crate) optimized: Option<Vec<u32>>,
    /// Bytes of the pipeline cache data right after the build, or of the pipeline binaries (what
    /// persisting it costs).
    pub(crate) cache_data_bytes: u64,
    /// Per pipeline, its VK_KHR_pipeline_binary binaries, on a device that persists those (`None`
    /// elsewhere: the pipeline cache is what persists).
    pub(crate) binaries: Option<Vec<Vec<BinaryData>>>,
    /// What it was built from (for cache blobs).
    pub(crate) origin: ProgramOrigin,
}

impl std::fmt::Debug for VulkanProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanProgram")
            .field("image", &self.image)
            .field(
                "kernels",
                &self
                    .pipelines
                    .iter()
                    .map(|p| &p.info.name)
                    .collect::<Vec<_>>(),
            )
            .field("cache_data_bytes", &self.cache_data_bytes)
            .finish()
    }
}

impl VulkanProgram {
    /// Its kernels' descriptions, in entry-point order.
    pub fn kernels(&self) -> impl Iterator<Item = &KernelInfo> {
        self.pipelines.iter().map(|p| &p.info)
    }

    /// Whether the driver reported that every pipeline came from the pipeline-cache data it was
    /// created with: `Some(false)` as soon as one was compiled, `None` where the driver gave no
    /// feedback for some pipeline and reported no compile.
    pub fn driver_cache_hit(&self) -> Option<bool> {
        let mut all = Some(true);
        for p in &self.pipelines {
            match p.info.driver_cache_hit {
                Some(false) => return Some(false),
                None => all = None,
                Some(true) => {}
            }
        }
        all
    }

    /// Total vkCreateComputePipelines time of its pipelines.
    pub fn pipeline_create_time(&self) -> Duration {
        self.pipelines.iter().map(|p| p.create_time).sum()
    }

    /// What persisting it stores: its pipeline binaries or pipeline cache data (and optimized
    /// SPIR-V) in kpc's container.
    pub fn binary(&self) -> Result<Vec<u8>> {
        if let Some(b) = &self.binaries {
            return Ok(super::pipeline_cache::encode(
                self.optimized.as_deref(),
                Payload::PipelineBinaries(&super::pipeline_binary::encode(b)),
            ));
        }
        // SAFETY: the cache is alive (owned by `self`); reading its data needs no external
        // synchronization, also while pipelines are created through it.
        let data = unsafe { self.dev.raw.get_pipeline_cache_data(self.cache) }
            .map_err(|e| vk_err("vkGetPipelineCacheData", e))?;
        Ok(super::pipeline_cache::encode(
            self.optimized.as_deref(),
            Payload::PipelineCache(&data),
        ))
    }
}

impl CacheCost for VulkanProgram {
    /// The SPIR-V the pipelines were made from (the image, and the optimizer's output with -O) plus
    /// the pipeline-cache data: the code kpc holds for the program. The driver's own memory for the
    /// compiled pipelines is not visible through Vulkan; it grows with the SPIR-V, which is why the
    /// image counts rather than the pipeline-cache data alone (a 32-byte stub on lavapipe, so a
    /// threshold never evicted there).
    fn cache_bytes(&self) -> u64 {
        let optimized = self.optimized.as_ref().map_or(0, |w| w.len() as u64 * 4);
        (self.origin.image_len + optimized + self.cache_data_bytes).max(1)
    }
}

impl Drop for VulkanProgram {
    fn drop(&mut self) {
        // SAFETY: the pipeline cache is used only while creating pipelines (done) and reading its
        // data (done under &self); pipelines do not depend on it after creation.
        unsafe { self.dev.raw.destroy_pipeline_cache(self.cache, None) };
    }
}

/// A kernel: one entry point's pipeline, and the program it belongs to. Holding the program keeps
/// its pipeline cache (what a cache blob serializes) alive with the kernel, after in-memory eviction
/// too; the pipeline is shared with the program, so this costs only the pipeline cache's memory.
#[derive(Debug, Clone)]
pub struct VulkanKernel {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) program: Arc<VulkanProgram>,
    /// Its raw handles, made at the first request and lent out from then on, so that asking for
    /// them on a hot path allocates nothing.
    pub(crate) handles: std::sync::OnceLock<super::kernel_handles::VulkanKernelHandles>,
}

impl crate::backend::KernelObject for VulkanKernel {
    fn info(&self) -> &KernelInfo {
        &self.pipeline.info
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn origin(&self) -> Option<&ProgramOrigin> {
        Some(&self.program.origin)
    }
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        self.program.binary().map(Some)
    }
}

/// Feedback the driver gave about one pipeline's creation.
pub(crate) struct Built {
    pub(crate) program: VulkanProgram,
    /// Per pipeline: `Some(hit)` where the driver reported feedback.
    pub(crate) feedback: Vec<Option<bool>>,
    /// Time in the checks against the device, and in handing pipeline binaries to the driver
    /// (vkCreatePipelineBinariesKHR) or taking them out after a build: for the build trace.
    pub(crate) check_time: Duration,
    pub(crate) binary_time: Duration,
}

/// What a program's pipelines are made from.
pub(crate) enum Source<'a> {
    /// SPIR-V (the optimized module where there is one, else the module itself; validated),
    /// through a pipeline cache that starts from `initial_cache` (pipeline-cache devices; empty for
    /// a build).
    Spirv { initial_cache: &'a [u8] },
    /// Per entry point, the pipeline binaries a warm load hands back (pipeline-binary devices).
    Binaries(Vec<Vec<BinaryData>>),
}

/// Builds `module` into a program from `source`. On a device that persists pipeline binaries, a
/// build from SPIR-V captures them (and a load keeps the ones it was given), so the program can be
/// persisted again.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build(
    dev: &Arc<Device>,
    image: &str,
    module: &SpirvModule,
    optimized: Option<Vec<u32>>,
    spec: &SpecConstants,
    source: Source<'_>,
    origin: ProgramOrigin,
) -> Result<Built> {
    let check_start = Instant::now();
    super::device_check::check_against_device(dev, image, module, spec)?;
    let specialization = module.specialization(image, spec)?;
    let check_time = check_start.elapsed();
    let mut binary_time = Duration::ZERO;
    let map_entries: Vec<vk::SpecializationMapEntry> = specialization
        .entries
        .iter()
        .map(|&(id, offset, size)| vk::SpecializationMapEntry {
            constant_id: id,
            offset,
            size,
        })
        .collect();
    let spec_info = vk::SpecializationInfo::default()
        .map_entries(&map_entries)
        .data(&specialization.data);
    let d = &dev.raw;

    let mut program = VulkanProgram {
        dev: dev.clone(),
        cache: vk::PipelineCache::null(),
        image: image.to_string(),
        pipelines: Vec::new(),
        optimized,
        cache_data_bytes: 0,
        binaries: None,
        origin,
    };
    let binary_path = dev.pipeline_binary.as_ref();
    let mut feedback = Vec::new();
    let (initial_cache, loaded) = match source {
        Source::Spirv { initial_cache } => (initial_cache, None),
        Source::Binaries(b) => (&[][..], Some(b)),
    };
    if let Some(loaded) = loaded {
        let Some(path) = binary_path else {
            return Err(build_error(
                image,
                -1,
                "pipeline binaries given to a device that does not load them".into(),
            ));
        };
        if loaded.len() != module.entry_points.len() {
            return Err(build_error(
                image,
                -1,
                format!(
                    "{} sets of pipeline binaries for {} entry points",
                    loaded.len(),
                    module.entry_points.len()
                ),
            ));
        }
        for (entry, bins) in module.entry_points.iter().zip(&loaded) {
            let t = Instant::now();
            let uploaded = path.fns.upload(bins)?;
            binary_time += t.elapsed();
            let with = PipelineFrom::Binaries(uploaded.info());
            let (p, fb) = create_pipeline(dev, image, with, entry, spec, &spec_info)?;
            drop(uploaded);
            program.pipelines.push(Arc::new(p));
            feedback.push(fb);
        }
        program.cache_data_bytes = binary_bytes(&loaded);
        program.binaries = Some(loaded);
        return Ok(Built {
            program,
            feedback,
            check_time,
            binary_time,
        });
    }
    let words = program.optimized.as_deref().unwrap_or(&module.words);
    if binary_path.is_none() {
        // No VK_PIPELINE_CACHE_CREATE_EXTERNALLY_SYNCHRONIZED_BIT: the cache stays internally
        // synchronized for vkCreateComputePipelines and vkGetPipelineCacheData, so programs built
        // concurrently (Context::prefetch) need no lock; each program also has a cache of its own.
        let cache_info = vk::PipelineCacheCreateInfo::default().initial_data(initial_cache);
        // SAFETY: the initial data passed check_pipeline_cache_header against this device (or is
        // empty); `program` owns the cache and destroys it in Drop.
        program.cache = unsafe { d.create_pipeline_cache(&cache_info, None) }
            .map_err(|e| vk_err("vkCreatePipelineCache", e))?;
    }

    let module_info = vk::ShaderModuleCreateInfo::default().code(words);
    // SAFETY: `words` passed spirv-tools validation for a Vulkan environment this device supports.
    let shader = unsafe { d.create_shader_module(&module_info, None) }.map_err(|e| {
        if e == vk::Result::ERROR_INVALID_SHADER_NV {
            build_error(
                image,
                e.as_raw(),
                "the driver rejected the shader module".into(),
            )
        } else {
            vk_err("vkCreateShaderModule", e)
        }
    })?;
    let mut captured = Vec::new();
    let result = (|| {
        for entry in &module.entry_points {
            let with = match binary_path {
                Some(_) => PipelineFrom::Capture(shader),
                None => PipelineFrom::Cache(program.cache, shader),
            };
            let (p, fb) = create_pipeline(dev, image, with, entry, spec, &spec_info)?;
            let p = Arc::new(p);
            program.pipelines.push(p.clone());
            feedback.push(fb);
            if let Some(path) = binary_path {
                let t = Instant::now();
                captured.push(path.fns.capture(p.raw)?);
                binary_time += t.elapsed();
            }
        }
        Ok::<(), Error>(())
    })();
    // SAFETY: pipelines do not need their shader module after creation; nothing else uses it.
    unsafe { d.destroy_shader_module(shader, None) };
    result?;
    if binary_path.is_some() {
        program.cache_data_bytes = binary_bytes(&captured);
        program.binaries = Some(captured);
        return Ok(Built {
            program,
            feedback,
            check_time,
            binary_time,
        });
    }
    // SAFETY: the cache is alive and no pipeline is being created through it now.
    program.cache_data_bytes = unsafe { d.get_pipeline_cache_data(program.cache) }
        .map_err(|e| vk_err("vkGetPipelineCacheData", e))?
        .len() as u64;
    Ok(Built {
        program,
        feedback,
        check_time,
        binary_time,
    })
}

fn binary_bytes(b: &[Vec<BinaryData>]) -> u64 {
    b.iter().flatten().map(|b| b.data.len() as u64).sum()
}

/// How one pipeline is created.
enum PipelineFrom {
    /// From the shader module, through the program's pipeline cache.
    Cache(vk::PipelineCache, vk::ShaderModule),
    /// From the shader module, keeping the driver's data for vkCreatePipelineBinariesKHR.
    Capture(vk::ShaderModule),
    /// From pipeline binaries handed to the driver (the shader module is ignored then).
    Binaries(super::pipeline_binary::InfoKhr),
}

fn create_pipeline(
    dev: &Arc<Device>,
    image: &str,
    from: PipelineFrom,
    entry: &crate::backend::spirv::EntryPointInfo,
    spec: &SpecConstants,
    spec_info: &vk::SpecializationInfo<'_>,
) -> Result<(Pipeline, Option<bool>)> {
    let d = &dev.raw;
    let descriptor_types: Vec<vk::DescriptorType> = entry
        .bindings
        .iter()
        .map(|b| match b.kind {
            DescriptorKind::UniformBuffer => vk::DescriptorType::UNIFORM_BUFFER,
            _ => vk::DescriptorType::STORAGE_BUFFER,
        })
        .collect();
    let mut p = Pipeline {
        dev: dev.clone(),
        raw: vk::Pipeline::null(),
        layout: vk::PipelineLayout::null(),
        set_layout: vk::DescriptorSetLayout::null(),
        shared_layout: false,
        set_storage: 0,
        set_uniform: 0,
        descriptor_types: descriptor_types.clone(),
        info: KernelInfo {
            name: entry.name.clone(),
            buffers: entry
                .bindings
                .iter()
                .map(|b| BufferParam {
                    binding: b.binding,
                    name: b.name.clone(),
                    read_only: b.read_only,
                    min_bytes: b.min_bytes,
                })
                .collect(),
            push_constant_bytes: entry.push_constant_bytes,
            local_size: entry.local_size_with(spec),
            driver_cache_hit: None,
            driver_stats: Vec::new(),
        },
        create_time: Duration::ZERO,
        set_layout_time: Duration::ZERO,
        layout_time: Duration::ZERO,
        stats_time: Duration::ZERO,
    };
    let layouts_start = Instant::now();
    let l = super::layouts::for_entry(
        &dev.raw,
        &dev.limits,
        &dev.shared_layouts,
        entry,
        &descriptor_types,
    )?;
    p.set_layout = l.set;
    p.layout = l.pipeline;
    p.shared_layout = l.shared;
    p.set_storage = l.storage;
    p.set_uniform = l.uniform;
    p.set_layout_time = layouts_start.elapsed();
    let layouts_start = Instant::now();
    p.layout_time = layouts_start.elapsed();

    let name = std::ffi::CString::new(entry.name.as_str()).map_err(|_| {
        build_error(
            image,
            -1,
            format!("entry point name {:?} contains NUL", entry.name),
        )
    })?;
    let (cache, shader) = match &from {
        PipelineFrom::Cache(c, s) => (*c, *s),
        PipelineFrom::Capture(s) => (vk::PipelineCache::null(), *s),
        PipelineFrom::Binaries(_) => (vk::PipelineCache::null(), vk::ShaderModule::null()),
    };
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(shader)
        .name(&name)
        .specialization_info(spec_info);
    let mut whole = vk::PipelineCreationFeedback::default();
    let mut stages = [vk::PipelineCreationFeedback::default()];
    let mut fb_info = vk::PipelineCreationFeedbackCreateInfo::default()
        .pipeline_creation_feedback(&mut whole)
        .pipeline_stage_creation_feedbacks(&mut stages);
    let mut info = vk::ComputePipelineCreateInfo::default()
        .stage(stage)
        .layout(p.layout);
    if dev.feedback {
        info = info.push_next(&mut fb_info);
    }
    if dev.executable_stats.is_some() {
        info = info.flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
    }
    // With VkPipelineCreateFlags2CreateInfoKHR chained, the driver reads the flags from it alone.
    let mut flags2 = vk::PipelineCreateFlags2CreateInfoKHR::default().flags(
        super::pipeline_binary::CAPTURE_DATA
            | vk::PipelineCreateFlags2KHR::from_raw(info.flags.as_raw().into()),
    );
    let capture = matches!(from, PipelineFrom::Capture(_));
    let mut binaries = match from {
        PipelineFrom::Binaries(b) => Some(b),
        _ => None,
    };
    let from_binaries = binaries.is_some();
    if capture {
        info = info.push_next(&mut flags2);
    }
    if let Some(b) = binaries.as_mut() {
        info = info.push_next(b);
    }
    let start = Instant::now();
    // SAFETY: every handle in `info` is alive; the specialization data matches the module's declared
    // constants (checked by `specialization`); the workgroup size and push constants are within the
    // device's limits (checked by `check_against_device`); binaries and the capture flag come with
    // a null pipeline cache, on a device with VK_KHR_pipeline_binary enabled.
    let created = unsafe { d.create_compute_pipelines(cache, &[info], None) };
    p.create_time = start.elapsed();
    p.raw = match created {
        Ok(v) => v[0],
        Err((_, e)) => {
            return Err(match vk_err("vkCreateComputePipelines", e) {
                oom @ Error::OutOfResources { .. } => oom,
                _ if from_binaries => Error::BinaryRejected {
                    backend: BackendKind::Vulkan,
                    image: image.to_string(),
                    reason: format!(
                        "the driver refused the pipeline binaries of entry point {:?}: {e}",
                        entry.name
                    ),
                },
                _ => build_error(
                    image,
                    e.as_raw(),
                    format!(
                        "vkCreateComputePipelines failed for entry point {:?}: {e}",
                        entry.name
                    ),
                ),
            });
        }
    };
    // A pipeline made from binaries compiled nothing: the specification has the driver use their
    // data instead of recalculating it.
    let hit = if from_binaries {
        Some(true)
    } else {
        (dev.feedback
            && whole
                .flags
                .contains(vk::PipelineCreationFeedbackFlags::VALID))
        .then(|| {
            whole
                .flags
                .contains(vk::PipelineCreationFeedbackFlags::APPLICATION_PIPELINE_CACHE_HIT)
        })
    };
    p.info.driver_cache_hit = hit;
    let stats_start = Instant::now();
    p.info.driver_stats = super::pipeline_stats::executable_stats(dev, p.raw);
    p.stats_time = stats_start.elapsed();
    Ok((p, hit))
}
