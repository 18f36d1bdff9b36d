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

use crate::backend::spirv::{DescriptorKind, SpirvModule, required_vulkan};
use crate::backend::{BufferParam, KernelInfo, ProgramOrigin};
use crate::cache::{CacheCost, SpecConstants};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::device::{Device, vk_err};

/// A compute pipeline with its layouts: a kernel. Shared between the program that made it and every
/// kernel handle and in-flight launch that uses it.
pub struct Pipeline {
    dev: Arc<Device>,
    pub(crate) raw: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) set_layout: vk::DescriptorSetLayout,
    /// Descriptor type per buffer parameter, in launch order.
    pub(crate) descriptor_types: Vec<vk::DescriptorType>,
    pub(crate) info: KernelInfo,
    /// How long vkCreateComputePipelines took for it.
    pub(crate) create_time: Duration,
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
        // uses these objects now; null handles (a failed build) are ignored by Vulkan.
        unsafe {
            self.dev.raw.destroy_pipeline(self.raw, None);
            self.dev.raw.destroy_pipeline_layout(self.layout, None);
            self.dev
                .raw
                .destroy_descriptor_set_layout(self.set_layout, None);
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
    /// Bytes of the pipeline cache data right after the build (what persisting it costs).
    pub(crate) cache_data_bytes: u64,
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

    /// What persisting it stores: its pipeline cache data (and optimized SPIR-V) in kpc's container.
    pub fn binary(&self) -> Result<Vec<u8>> {
        // SAFETY: the cache is alive (owned by `self`); reading its data needs no external
        // synchronization, also while pipelines are created through it.
        let data = unsafe { self.dev.raw.get_pipeline_cache_data(self.cache) }
            .map_err(|e| vk_err("vkGetPipelineCacheData", e))?;
        Ok(super::pipeline_cache::encode(
            self.optimized.as_deref(),
            &data,
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

fn build_error(image: &str, code: i32, message: String) -> Error {
    Error::Build {
        backend: BackendKind::Vulkan,
        image: image.to_string(),
        code,
        message,
        log: String::new(),
    }
}

/// Checks everything about `module` with `spec` that the device must accept, so that nothing
/// undefined reaches vkCreateComputePipelines: SPIR-V version, capabilities and extensions against
/// what the device enabled, workgroup size, descriptors and push constants against its limits.
fn check_against_device(
    dev: &Device,
    image: &str,
    module: &SpirvModule,
    spec: &SpecConstants,
) -> Result<()> {
    let (maj, min) = required_vulkan(module.version);
    let needs = vk::make_api_version(0, maj, min, 0);
    let spirv14_ok = module.version == (1, 4) && dev.spirv_1_4_ext;
    if dev.api_version < needs && !spirv14_ok {
        return Err(build_error(
            image,
            vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
            format!(
                "SPIR-V {}.{} needs Vulkan {maj}.{min}; the device supports {}",
                module.version.0,
                module.version.1,
                super::instance::version_string(dev.api_version)
            ),
        ));
    }
    dev.caps.check(image, &module.needs)?;
    let l = &dev.limits;
    for e in &module.entry_points {
        let ls = e.local_size_with(spec);
        let invocations = ls.iter().map(|&v| u64::from(v)).product::<u64>();
        if ls.contains(&0)
            || (0..3).any(|k| ls[k] > l.max_compute_work_group_size[k])
            || invocations > u64::from(l.max_compute_work_group_invocations)
        {
            return Err(build_error(
                image,
                vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
                format!(
                    "entry point {:?}: workgroup size {}x{}x{} is outside the device's limits \
                     (at most {:?} per dimension and {} invocations)",
                    e.name,
                    ls[0],
                    ls[1],
                    ls[2],
                    l.max_compute_work_group_size,
                    l.max_compute_work_group_invocations
                ),
            ));
        }
        if e.push_constant_bytes > l.max_push_constants_size {
            return Err(build_error(
                image,
                vk::Result::ERROR_INITIALIZATION_FAILED.as_raw(),
                format!(
                    "entry point {:?}: {} bytes of push constants, the device allows {}",
                    e.name, e.push_constant_bytes, l.max_push_constants_size
                ),
            ));
        }
        for b in &e.bindings {
            if b.set != 0 {
                return Err(build_error(
                    image,
                    -1,
                    format!(
                        "entry point {:?}: binding {} is in descriptor set {}; kpc binds set 0 only",
                        e.name, b.binding, b.set
                    ),
                ));
            }
            if let DescriptorKind::Unsupported(what) = &b.kind {
                return Err(build_error(
                    image,
                    -1,
                    format!(
                        "entry point {:?}: binding {} is a {what}; kpc binds storage and uniform buffers only",
                        e.name, b.binding
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Feedback the driver gave about one pipeline's creation.
pub(crate) struct Built {
    pub(crate) program: VulkanProgram,
    /// Per pipeline: `Some(hit)` where the driver reported feedback.
    pub(crate) feedback: Vec<Option<bool>>,
}

/// Builds `module` (already validated; `words` is what to compile: the module itself or its
/// optimized form) into a program whose pipeline cache starts from `initial_cache`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build(
    dev: &Arc<Device>,
    image: &str,
    module: &SpirvModule,
    words: &[u32],
    optimized: bool,
    spec: &SpecConstants,
    initial_cache: &[u8],
    origin: ProgramOrigin,
) -> Result<Built> {
    check_against_device(dev, image, module, spec)?;
    let specialization = module.specialization(image, spec)?;
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
        optimized: optimized.then(|| words.to_vec()),
        cache_data_bytes: 0,
        origin,
    };
    // No VK_PIPELINE_CACHE_CREATE_EXTERNALLY_SYNCHRONIZED_BIT: the cache stays internally synchronized
    // for vkCreateComputePipelines and vkGetPipelineCacheData, so programs built concurrently
    // (Context::prefetch) need no lock; each program also has a cache of its own.
    let cache_info = vk::PipelineCacheCreateInfo::default().initial_data(initial_cache);
    // SAFETY: the initial data passed check_pipeline_cache_header against this device (or is empty);
    // `program` owns the cache and destroys it in Drop.
    program.cache = unsafe { d.create_pipeline_cache(&cache_info, None) }
        .map_err(|e| vk_err("vkCreatePipelineCache", e))?;

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
    let mut feedback = Vec::new();
    let result = (|| {
        for entry in &module.entry_points {
            let (p, fb) =
                create_pipeline(dev, image, program.cache, shader, entry, spec, &spec_info)?;
            program.pipelines.push(Arc::new(p));
            feedback.push(fb);
        }
        Ok::<(), Error>(())
    })();
    // SAFETY: pipelines do not need their shader module after creation; nothing else uses it.
    unsafe { d.destroy_shader_module(shader, None) };
    result?;
    // SAFETY: the cache is alive and no pipeline is being created through it now.
    program.cache_data_bytes = unsafe { d.get_pipeline_cache_data(program.cache) }
        .map_err(|e| vk_err("vkGetPipelineCacheData", e))?
        .len() as u64;
    Ok(Built { program, feedback })
}

fn create_pipeline(
    dev: &Arc<Device>,
    image: &str,
    cache: vk::PipelineCache,
    shader: vk::ShaderModule,
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
    };
    let bindings: Vec<vk::DescriptorSetLayoutBinding> = entry
        .bindings
        .iter()
        .zip(&descriptor_types)
        .map(|(b, t)| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b.binding)
                .descriptor_type(*t)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let set_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
    // SAFETY: plain object creation; `p` owns the handle.
    p.set_layout = unsafe { d.create_descriptor_set_layout(&set_info, None) }
        .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))?;
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .offset(0)
        .size(entry.push_constant_bytes)];
    let set_layouts = [p.set_layout];
    let mut layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
    if entry.push_constant_bytes > 0 {
        layout_info = layout_info.push_constant_ranges(&ranges);
    }
    // SAFETY: as above.
    p.layout = unsafe { d.create_pipeline_layout(&layout_info, None) }
        .map_err(|e| vk_err("vkCreatePipelineLayout", e))?;

    let name = std::ffi::CString::new(entry.name.as_str()).map_err(|_| {
        build_error(
            image,
            -1,
            format!("entry point name {:?} contains NUL", entry.name),
        )
    })?;
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
    let start = Instant::now();
    // SAFETY: every handle in `info` is alive; the specialization data matches the module's declared
    // constants (checked by `specialization`); the workgroup size and push constants are within the
    // device's limits (checked by `check_against_device`).
    let created = unsafe { d.create_compute_pipelines(cache, &[info], None) };
    p.create_time = start.elapsed();
    p.raw = match created {
        Ok(v) => v[0],
        Err((_, e)) => {
            return Err(match vk_err("vkCreateComputePipelines", e) {
                oom @ Error::OutOfResources { .. } => oom,
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
    let hit = (dev.feedback
        && whole
            .flags
            .contains(vk::PipelineCreationFeedbackFlags::VALID))
    .then(|| {
        whole
            .flags
            .contains(vk::PipelineCreationFeedbackFlags::APPLICATION_PIPELINE_CACHE_HIT)
    });
    p.info.driver_cache_hit = hit;
    p.info.driver_stats = executable_stats(dev, p.raw);
    Ok((p, hit))
}

/// The driver's statistics about `pipeline`'s compiled code, "name" or "executable: name" where it
/// has several executables; empty where the extension is off or a query fails (they only inform).
fn executable_stats(dev: &Device, pipeline: vk::Pipeline) -> Vec<(String, String)> {
    use super::instance::c_chars;
    let Some(ext) = dev.executable_stats.as_ref() else {
        return Vec::new();
    };
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: `pipeline` is alive and was created with CAPTURE_STATISTICS on a device with the
    // extension enabled.
    let executables = unsafe { ext.get_pipeline_executable_properties(&info) }.unwrap_or_default();
    let several = executables.len() > 1;
    let mut out = Vec::new();
    for (i, e) in executables.iter().enumerate() {
        let exec = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(i as u32);
        // SAFETY: as above; `i` indexes the executables the driver listed.
        let stats = unsafe { ext.get_pipeline_executable_statistics(&exec) }.unwrap_or_default();
        for s in stats {
            // SAFETY: `format` says which member of the union the driver wrote.
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                        (s.value.b32 != 0).to_string()
                    }
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                    _ => continue,
                }
            };
            let name = c_chars(&s.name);
            let name = if several {
                format!("{}: {name}", c_chars(&e.name))
            } else {
                name
            };
            out.push((name, value));
        }
    }
    out
}
