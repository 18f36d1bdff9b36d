//! What a kernel handle keeps for the C structs that point into it: the arrays of
//! `kpc_vulkan_kernel_handles`, made once per handle and owned by it, so the pointers stay valid as
//! long as the handle does.

use ash::vk;

use crate::kpc_vulkan_binding;

/// The arrays a `kpc_vulkan_kernel_handles` points into, owned by the kernel handle.
pub(crate) struct VulkanArrays {
    pub(crate) set_layouts: Vec<u64>,
    pub(crate) bindings: Vec<kpc_vulkan_binding>,
    pub(crate) pipeline: u64,
    pub(crate) pipeline_layout: u64,
    pub(crate) push: Option<vk::PushConstantRange>,
    pub(crate) local_size: [u32; 3],
}
