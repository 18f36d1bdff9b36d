//! Descriptor-set and pipeline layouts for kpc's pipelines.
//!
//! NVIDIA's driver took 1.3-6 ms to create one program's two layouts on an H100, three to thirty
//! times the pipeline's own creation from cache data or binaries (BENCHMARKS.md, "Vulkan program
//! binaries"), so a warm process paid more for layouts than for its kernels. Every kernel whose
//! bindings are storage buffers numbered below [`STANDARD_BINDINGS`] and whose push constants fit
//! [`STANDARD_PUSH_BYTES`] (all of kpc's own) therefore shares one pair per device, made once: a
//! pipeline layout may declare bindings and push-constant bytes its shader does not use, and
//! descriptors a pipeline does not use need not be written. Other kernels get layouts of their own.

use ash::vk;

use crate::backend::spirv::{DescriptorKind, EntryPointInfo};
use crate::error::Result;

use super::vk_error::vk_err;

/// Storage-buffer bindings 0..STANDARD_BINDINGS in the shared set layout.
pub(crate) const STANDARD_BINDINGS: u32 = 16;
/// Push-constant bytes of the shared pipeline layout: the minimum every device supports.
pub(crate) const STANDARD_PUSH_BYTES: u32 = 128;

/// One pipeline's layouts.
pub(crate) struct Layouts {
    pub(crate) set: vk::DescriptorSetLayout,
    pub(crate) pipeline: vk::PipelineLayout,
    /// The device's shared pair: not the pipeline's to destroy.
    pub(crate) shared: bool,
    /// Descriptors of each type one set of `set` takes from a pool.
    pub(crate) storage: u32,
    pub(crate) uniform: u32,
}

/// The shared pair of a device, made on first use.
#[derive(Default)]
pub(crate) struct SharedLayouts(
    std::sync::OnceLock<Option<(vk::DescriptorSetLayout, vk::PipelineLayout)>>,
);

impl SharedLayouts {
    /// Destroys the pair, if it was made. The caller guarantees no pipeline uses it any more.
    pub(crate) fn destroy(&mut self, dev: &ash::Device) {
        if let Some(Some((set, pipeline))) = self.0.take() {
            // SAFETY: made on `dev`; every pipeline holds its device, so none is left that uses it
            // (the caller's guarantee), and each handle is destroyed once (`take`).
            unsafe {
                dev.destroy_pipeline_layout(pipeline, None);
                dev.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

fn fits_standard(limits: &vk::PhysicalDeviceLimits, entry: &EntryPointInfo) -> bool {
    entry.push_constant_bytes <= STANDARD_PUSH_BYTES
        && limits.max_push_constants_size >= STANDARD_PUSH_BYTES
        && limits.max_per_stage_descriptor_storage_buffers >= STANDARD_BINDINGS
        && limits.max_descriptor_set_storage_buffers >= STANDARD_BINDINGS
        && entry.bindings.iter().all(|b| {
            b.binding < STANDARD_BINDINGS && !matches!(b.kind, DescriptorKind::UniformBuffer)
        })
}

fn create(
    d: &ash::Device,
    bindings: &[vk::DescriptorSetLayoutBinding<'_>],
    push_bytes: u32,
) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
    let set_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(bindings);
    // SAFETY: plain object creation; the caller owns the handle.
    let set = unsafe { d.create_descriptor_set_layout(&set_info, None) }
        .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))?;
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .offset(0)
        .size(push_bytes)];
    let set_layouts = [set];
    let mut info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
    if push_bytes > 0 {
        info = info.push_constant_ranges(&ranges);
    }
    // SAFETY: as above; `set` is alive.
    match unsafe { d.create_pipeline_layout(&info, None) } {
        Ok(p) => Ok((set, p)),
        Err(e) => {
            // SAFETY: made just above and used by nothing.
            unsafe { d.destroy_descriptor_set_layout(set, None) };
            Err(vk_err("vkCreatePipelineLayout", e))
        }
    }
}

fn binding(n: u32, ty: vk::DescriptorType) -> vk::DescriptorSetLayoutBinding<'static> {
    vk::DescriptorSetLayoutBinding::default()
        .binding(n)
        .descriptor_type(ty)
        .descriptor_count(1)
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
}

/// The layouts on device `d` (with `limits`) for `entry`, whose bindings have `types`: the pair in
/// `shared` where it fits, else a pair of its own (which the pipeline destroys).
pub(crate) fn for_entry(
    d: &ash::Device,
    limits: &vk::PhysicalDeviceLimits,
    shared: &SharedLayouts,
    entry: &EntryPointInfo,
    types: &[vk::DescriptorType],
) -> Result<Layouts> {
    if fits_standard(limits, entry) {
        let shared = shared.0.get_or_init(|| {
            let all: Vec<_> = (0..STANDARD_BINDINGS)
                .map(|n| binding(n, vk::DescriptorType::STORAGE_BUFFER))
                .collect();
            // A failure falls back to layouts of each pipeline's own (reported there, if again).
            create(d, &all, STANDARD_PUSH_BYTES).ok()
        });
        if let Some((set, pipeline)) = *shared {
            return Ok(Layouts {
                set,
                pipeline,
                shared: true,
                storage: STANDARD_BINDINGS,
                uniform: 0,
            });
        }
    }
    let bindings: Vec<_> = entry
        .bindings
        .iter()
        .zip(types)
        .map(|(b, t)| binding(b.binding, *t))
        .collect();
    let (set, pipeline) = create(d, &bindings, entry.push_constant_bytes)?;
    let uniform = types
        .iter()
        .filter(|t| **t == vk::DescriptorType::UNIFORM_BUFFER)
        .count() as u32;
    Ok(Layouts {
        set,
        pipeline,
        shared: false,
        storage: types.len() as u32 - uniform,
        uniform,
    })
}
