//! The raw Vulkan handles a kernel lends an embedder: made once per kernel (by `interop.rs`) and kept
//! with it (`program.rs`).

use ash::vk;

/// The raw handles of one kpc kernel, for recording a dispatch in the embedder's own command buffer.
///
/// Lifetime: they belong to kpc and stay valid while the [`crate::Kernel`] they came from (or any
/// clone of it) is alive, also after the context evicted it from memory or was dropped: the kernel
/// holds the pipeline, its layouts and the device by reference count. Keep a clone of the kernel
/// until every command buffer recorded with them has finished executing; never destroy them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VulkanKernelHandles {
    /// The compute pipeline.
    pub pipeline: vk::Pipeline,
    /// Its layout: bind descriptor sets and push constants with it.
    pub pipeline_layout: vk::PipelineLayout,
    /// Its descriptor set layouts, by set number (kpc uses set 0 only).
    pub descriptor_set_layouts: Vec<vk::DescriptorSetLayout>,
    /// The bindings of set 0 as (binding, descriptor type), in kpc's launch-argument order: what a
    /// descriptor pool for the kernel must provide.
    pub bindings: Vec<(u32, vk::DescriptorType)>,
    /// The push-constant range (compute stage, offset 0), or `None` when the kernel takes none.
    pub push_constant_range: Option<vk::PushConstantRange>,
    /// The workgroup size after specialization.
    pub local_size: [u32; 3],
}
