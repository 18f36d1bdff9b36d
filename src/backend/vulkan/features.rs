//! The optional device features and extensions kpc knows: what a device supports, what kpc enables
//! on a device it opens (everything it checks shaders for, where the device has it), and what an
//! embedder declares for its own device. One struct, [`VulkanFeatures`], says all three, so that
//! `capability_check.rs` checks shaders the same way on owned and borrowed devices.

use ash::vk;

/// Optional features and extensions enabled on a device. kpc fills it for a device it opens itself
/// (every field the device supports is enabled); an embedder fills it for its own device in
/// [`super::VulkanHandles::enabled`]. Every field defaults to `false`: kpc then uses no optional
/// feature, and a kernel whose SPIR-V needs one is refused with [`crate::Error::Unsupported`] before
/// the driver sees it. A field an embedder sets for something the device does not support is refused
/// with [`crate::Error::InvalidArgument`] (it cannot have been enabled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VulkanFeatures {
    /// `VkPhysicalDeviceFeatures::robustBufferAccess`: a kernel's out-of-bounds buffer accesses
    /// stay inside the buffer (reads return values from the buffer or zero, writes land inside it
    /// or are dropped). kpc enables it on the devices it opens where the device has it (unless
    /// `KPC_VULKAN_ROBUST_ACCESS=0`); with it on, [`crate::Queue::submit`] launches any kernel
    /// safely. Without it, only kernels with declared access bounds launch safely.
    pub robust_buffer_access: bool,
    /// `VkPhysicalDeviceFeatures::shaderInt16` (SPIR-V `Int16`).
    pub shader_int16: bool,
    /// `VkPhysicalDeviceFeatures::shaderInt64` (SPIR-V `Int64`).
    pub shader_int64: bool,
    /// `VkPhysicalDeviceFeatures::shaderFloat64` (SPIR-V `Float64`).
    pub shader_float64: bool,
    /// `storageBuffer16BitAccess` (SPIR-V `StorageBuffer16BitAccess`): fp16 K/V in the attention
    /// kernels.
    pub storage_buffer_16bit_access: bool,
    /// `uniformAndStorageBuffer16BitAccess`.
    pub uniform_and_storage_buffer_16bit_access: bool,
    /// `storagePushConstant16`.
    pub storage_push_constant16: bool,
    /// `shaderFloat16` (Vulkan 1.2; SPIR-V `Float16`).
    pub shader_float16: bool,
    /// `shaderInt8` (Vulkan 1.2; SPIR-V `Int8`).
    pub shader_int8: bool,
    /// `storageBuffer8BitAccess` (Vulkan 1.2).
    pub storage_buffer_8bit_access: bool,
    /// `uniformAndStorageBuffer8BitAccess` (Vulkan 1.2).
    pub uniform_and_storage_buffer_8bit_access: bool,
    /// `hostQueryReset` (Vulkan 1.2): kpc resets its timestamp pools from the host.
    pub host_query_reset: bool,
    /// `vulkanMemoryModel` (Vulkan 1.2).
    pub vulkan_memory_model: bool,
    /// VK_KHR_cooperative_matrix with its `cooperativeMatrix` feature (the cooperative-matrix
    /// prefill kernel also needs `vulkan_memory_model`, `shader_float16` and
    /// `storage_buffer_16bit_access`).
    pub cooperative_matrix: bool,
    /// VK_EXT_pipeline_creation_feedback (core, hence implied, from Vulkan 1.3): kpc reports driver
    /// pipeline-cache hits.
    pub pipeline_creation_feedback: bool,
    /// VK_KHR_spirv_1_4 (core from Vulkan 1.2): SPIR-V 1.4 modules on a 1.1 device.
    pub spirv_1_4: bool,
    /// VK_KHR_pipeline_executable_properties with `pipelineExecutableInfo`: the driver's statistics
    /// about each kernel, in `KernelInfo::driver_stats`.
    pub pipeline_executable_info: bool,
    /// `shaderSubgroupExtendedTypes` (Vulkan 1.2): subgroup operations on 8-, 16- and 64-bit
    /// integers and 16-bit floats.
    pub shader_subgroup_extended_types: bool,
    /// `storagePushConstant8` (Vulkan 1.2; SPIR-V `StoragePushConstant8`).
    pub storage_push_constant8: bool,
    /// `shaderBufferInt64Atomics` (Vulkan 1.2; SPIR-V `Int64Atomics` on buffers).
    pub shader_buffer_int64_atomics: bool,
    /// `shaderSharedInt64Atomics` (Vulkan 1.2; SPIR-V `Int64Atomics` on shared memory).
    pub shader_shared_int64_atomics: bool,
    /// `variablePointersStorageBuffer` (SPIR-V `VariablePointersStorageBuffer`).
    pub variable_pointers_storage_buffer: bool,
    /// `variablePointers` (SPIR-V `VariablePointers`).
    pub variable_pointers: bool,
    /// `vulkanMemoryModelDeviceScope` (Vulkan 1.2; SPIR-V `VulkanMemoryModelDeviceScope`).
    pub vulkan_memory_model_device_scope: bool,
    /// `shaderIntegerDotProduct` (Vulkan 1.3; SPIR-V `DotProduct*`).
    pub shader_integer_dot_product: bool,
    /// VK_KHR_pipeline_binary with `pipelineBinaries`, and VK_KHR_maintenance5 with `maintenance5`
    /// (which it requires; Vulkan 1.3 devices only): kpc persists pipeline binaries instead of
    /// pipeline-cache data (`KPC_VULKAN_PIPELINE_BINARY`).
    pub pipeline_binary: bool,
    /// VK_NV_cooperative_matrix2 with `cooperativeMatrixWorkgroupScope` (matrices owned by a whole
    /// workgroup). kpc enables the extension with the features below that the device has.
    pub coop_matrix2_workgroup_scope: bool,
    /// `cooperativeMatrixFlexibleDimensions` (VK_NV_cooperative_matrix2): matrix sizes beyond the
    /// listed shapes.
    pub coop_matrix2_flexible_dimensions: bool,
    /// `cooperativeMatrixReductions` (SPIR-V `CooperativeMatrixReductionsNV`).
    pub coop_matrix2_reductions: bool,
    /// `cooperativeMatrixConversions` (SPIR-V `CooperativeMatrixConversionsNV`).
    pub coop_matrix2_conversions: bool,
    /// `cooperativeMatrixPerElementOperations` (SPIR-V `CooperativeMatrixPerElementOperationsNV`).
    pub coop_matrix2_per_element_operations: bool,
    /// `cooperativeMatrixTensorAddressing` (SPIR-V `TensorAddressingNV` and
    /// `CooperativeMatrixTensorAddressingNV`).
    pub coop_matrix2_tensor_addressing: bool,
}

impl VulkanFeatures {
    /// Every field as (field name, Vulkan's name, value), in declaration order.
    pub fn fields(&self) -> [(&'static str, &'static str, bool); 32] {
        [
            (
                "robust_buffer_access",
                "robustBufferAccess",
                self.robust_buffer_access,
            ),
            ("shader_int16", "shaderInt16", self.shader_int16),
            ("shader_int64", "shaderInt64", self.shader_int64),
            ("shader_float64", "shaderFloat64", self.shader_float64),
            (
                "storage_buffer_16bit_access",
                "storageBuffer16BitAccess",
                self.storage_buffer_16bit_access,
            ),
            (
                "uniform_and_storage_buffer_16bit_access",
                "uniformAndStorageBuffer16BitAccess",
                self.uniform_and_storage_buffer_16bit_access,
            ),
            (
                "storage_push_constant16",
                "storagePushConstant16",
                self.storage_push_constant16,
            ),
            ("shader_float16", "shaderFloat16", self.shader_float16),
            ("shader_int8", "shaderInt8", self.shader_int8),
            (
                "storage_buffer_8bit_access",
                "storageBuffer8BitAccess",
                self.storage_buffer_8bit_access,
            ),
            (
                "uniform_and_storage_buffer_8bit_access",
                "uniformAndStorageBuffer8BitAccess",
                self.uniform_and_storage_buffer_8bit_access,
            ),
            ("host_query_reset", "hostQueryReset", self.host_query_reset),
            (
                "vulkan_memory_model",
                "vulkanMemoryModel",
                self.vulkan_memory_model,
            ),
            (
                "cooperative_matrix",
                "VK_KHR_cooperative_matrix",
                self.cooperative_matrix,
            ),
            (
                "pipeline_creation_feedback",
                "VK_EXT_pipeline_creation_feedback",
                self.pipeline_creation_feedback,
            ),
            ("spirv_1_4", "VK_KHR_spirv_1_4", self.spirv_1_4),
            (
                "pipeline_executable_info",
                "pipelineExecutableInfo",
                self.pipeline_executable_info,
            ),
            (
                "shader_subgroup_extended_types",
                "shaderSubgroupExtendedTypes",
                self.shader_subgroup_extended_types,
            ),
            (
                "storage_push_constant8",
                "storagePushConstant8",
                self.storage_push_constant8,
            ),
            (
                "shader_buffer_int64_atomics",
                "shaderBufferInt64Atomics",
                self.shader_buffer_int64_atomics,
            ),
            (
                "shader_shared_int64_atomics",
                "shaderSharedInt64Atomics",
                self.shader_shared_int64_atomics,
            ),
            (
                "variable_pointers_storage_buffer",
                "variablePointersStorageBuffer",
                self.variable_pointers_storage_buffer,
            ),
            (
                "variable_pointers",
                "variablePointers",
                self.variable_pointers,
            ),
            (
                "vulkan_memory_model_device_scope",
                "vulkanMemoryModelDeviceScope",
                self.vulkan_memory_model_device_scope,
            ),
            (
                "shader_integer_dot_product",
                "shaderIntegerDotProduct",
                self.shader_integer_dot_product,
            ),
            (
                "coop_matrix2_workgroup_scope",
                "cooperativeMatrixWorkgroupScope",
                self.coop_matrix2_workgroup_scope,
            ),
            (
                "coop_matrix2_flexible_dimensions",
                "cooperativeMatrixFlexibleDimensions",
                self.coop_matrix2_flexible_dimensions,
            ),
            (
                "coop_matrix2_reductions",
                "cooperativeMatrixReductions",
                self.coop_matrix2_reductions,
            ),
            (
                "coop_matrix2_conversions",
                "cooperativeMatrixConversions",
                self.coop_matrix2_conversions,
            ),
            (
                "coop_matrix2_per_element_operations",
                "cooperativeMatrixPerElementOperations",
                self.coop_matrix2_per_element_operations,
            ),
            (
                "coop_matrix2_tensor_addressing",
                "cooperativeMatrixTensorAddressing",
                self.coop_matrix2_tensor_addressing,
            ),
            (
                "pipeline_binary",
                "VK_KHR_pipeline_binary",
                self.pipeline_binary,
            ),
        ]
    }
}

fn has_extension(exts: &[vk::ExtensionProperties], name: &std::ffi::CStr) -> bool {
    exts.iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

/// What physical device `raw` (whose extensions are `exts`) supports of [`VulkanFeatures`] at API
/// `api` (the lower of the device's and the instance's); `feedback` and `spirv_1_4_ext` as discovery
/// found them.
pub(crate) fn supported(
    instance: &ash::Instance,
    raw: vk::PhysicalDevice,
    exts: &[vk::ExtensionProperties],
    api: u32,
    feedback: bool,
    spirv_1_4_ext: bool,
) -> VulkanFeatures {
    let inst = instance;
    let v12 = api >= vk::API_VERSION_1_2;
    let v13 = api >= vk::API_VERSION_1_3;
    let coop_ext = has_extension(exts, vk::KHR_COOPERATIVE_MATRIX_NAME);
    let stats_ext = has_extension(exts, vk::KHR_PIPELINE_EXECUTABLE_PROPERTIES_NAME);
    let binary_ext = v13
        && has_extension(exts, super::pipeline_binary::NAME)
        && has_extension(exts, vk::KHR_MAINTENANCE5_NAME);
    let mut m5 = vk::PhysicalDeviceMaintenance5FeaturesKHR::default();
    let mut pb = super::pipeline_binary::FeaturesKhr::default();
    // Workgroup-scope matrices are KHR cooperative matrices with more allowed: without the KHR
    // extension there is nothing to extend.
    let cm2_ext = coop_ext && has_extension(exts, super::coopmat2::NAME);
    let mut cm2 = super::coopmat2::Features::default();
    let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut vp = vk::PhysicalDeviceVariablePointersFeatures::default();
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut s8 = vk::PhysicalDevice8BitStorageFeatures::default();
    let mut hqr = vk::PhysicalDeviceHostQueryResetFeatures::default();
    let mut mm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
    let mut sget = vk::PhysicalDeviceShaderSubgroupExtendedTypesFeatures::default();
    let mut a64 = vk::PhysicalDeviceShaderAtomicInt64Features::default();
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut s16)
        .push_next(&mut vp);
    if v12 {
        f2 = f2
            .push_next(&mut f16)
            .push_next(&mut s8)
            .push_next(&mut hqr)
            .push_next(&mut mm)
            .push_next(&mut sget)
            .push_next(&mut a64);
    }
    if v13 {
        f2 = f2.push_next(&mut dot);
    }
    if coop_ext {
        f2 = f2.push_next(&mut coop);
    }
    if stats_ext {
        f2 = f2.push_next(&mut stats);
    }
    if binary_ext {
        f2 = f2.push_next(&mut m5).push_next(&mut pb);
    }
    if cm2_ext {
        cm2.chain_into(&mut f2);
    }
    // SAFETY: the chain lives across the call (`cm2` is not moved while chained); instance and
    // device are 1.1+ (discovery and interop check it), the 1.2 and 1.3 structs are chained only at
    // those versions, and the extension structs only where the device lists their extensions.
    unsafe { inst.get_physical_device_features2(raw, &mut f2) };
    let core = f2.features;
    let on = |b: vk::Bool32| b == vk::TRUE;
    VulkanFeatures {
        robust_buffer_access: on(core.robust_buffer_access),
        shader_int16: on(core.shader_int16),
        shader_int64: on(core.shader_int64),
        shader_float64: on(core.shader_float64),
        storage_buffer_16bit_access: on(s16.storage_buffer16_bit_access),
        uniform_and_storage_buffer_16bit_access: on(s16.uniform_and_storage_buffer16_bit_access),
        storage_push_constant16: on(s16.storage_push_constant16),
        shader_float16: v12 && on(f16.shader_float16),
        shader_int8: v12 && on(f16.shader_int8),
        storage_buffer_8bit_access: v12 && on(s8.storage_buffer8_bit_access),
        uniform_and_storage_buffer_8bit_access: v12
            && on(s8.uniform_and_storage_buffer8_bit_access),
        host_query_reset: v12 && on(hqr.host_query_reset),
        vulkan_memory_model: v12 && on(mm.vulkan_memory_model),
        cooperative_matrix: coop_ext && on(coop.cooperative_matrix),
        pipeline_creation_feedback: feedback,
        spirv_1_4: spirv_1_4_ext || v12,
        pipeline_executable_info: stats_ext && on(stats.pipeline_executable_info),
        shader_subgroup_extended_types: v12 && on(sget.shader_subgroup_extended_types),
        storage_push_constant8: v12 && on(s8.storage_push_constant8),
        shader_buffer_int64_atomics: v12 && on(a64.shader_buffer_int64_atomics),
        shader_shared_int64_atomics: v12 && on(a64.shader_shared_int64_atomics),
        variable_pointers_storage_buffer: on(vp.variable_pointers_storage_buffer),
        variable_pointers: on(vp.variable_pointers),
        vulkan_memory_model_device_scope: v12 && on(mm.vulkan_memory_model_device_scope),
        shader_integer_dot_product: v13 && on(dot.shader_integer_dot_product),
        pipeline_binary: binary_ext && on(m5.maintenance5) && on(pb.pipeline_binaries),
        coop_matrix2_workgroup_scope: cm2_ext && on(cm2.workgroup_scope),
        coop_matrix2_flexible_dimensions: cm2_ext && on(cm2.flexible_dimensions),
        coop_matrix2_reductions: cm2_ext && on(cm2.reductions),
        coop_matrix2_conversions: cm2_ext && on(cm2.conversions),
        coop_matrix2_per_element_operations: cm2_ext && on(cm2.per_element_operations),
        coop_matrix2_tensor_addressing: cm2_ext && on(cm2.tensor_addressing),
    }
}

impl VulkanFeatures {
    /// Whether any VK_NV_cooperative_matrix2 feature is on (then the extension is enabled).
    pub(crate) fn any_coop_matrix2(&self) -> bool {
        self.coop_matrix2_workgroup_scope
            || self.coop_matrix2_flexible_dimensions
            || self.coop_matrix2_reductions
            || self.coop_matrix2_conversions
            || self.coop_matrix2_per_element_operations
            || self.coop_matrix2_tensor_addressing
    }

    /// Whether every VK_NV_cooperative_matrix2 feature `attn_prefill_cm2` uses is on.
    pub(crate) fn all_coop_matrix2(&self) -> bool {
        self.coop_matrix2_workgroup_scope
            && self.coop_matrix2_flexible_dimensions
            && self.coop_matrix2_reductions
            && self.coop_matrix2_conversions
            && self.coop_matrix2_per_element_operations
            && self.coop_matrix2_tensor_addressing
    }
}

/// Creates a device on `pd` with `queues` and exactly the features and extensions `f` says, at API
/// `api`. The caller passes only what [`supported`] reported for it.
pub(crate) fn create_device(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    queues: &[vk::DeviceQueueCreateInfo<'_>],
    f: &VulkanFeatures,
    api: u32,
) -> std::result::Result<ash::Device, vk::Result> {
    let v12 = api >= vk::API_VERSION_1_2;
    let v13 = api >= vk::API_VERSION_1_3;
    // robustBufferAccess is what makes a safe launch of any kernel sound: without it a kernel that
    // indexes past a buffer writes into whatever memory follows it.
    let core = vk::PhysicalDeviceFeatures::default()
        .robust_buffer_access(f.robust_buffer_access)
        .shader_int16(f.shader_int16)
        .shader_int64(f.shader_int64)
        .shader_float64(f.shader_float64);
    let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default()
        .storage_buffer16_bit_access(f.storage_buffer_16bit_access)
        .uniform_and_storage_buffer16_bit_access(f.uniform_and_storage_buffer_16bit_access)
        .storage_push_constant16(f.storage_push_constant16);
    let mut vp = vk::PhysicalDeviceVariablePointersFeatures::default()
        .variable_pointers_storage_buffer(f.variable_pointers_storage_buffer)
        .variable_pointers(f.variable_pointers);
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default()
        .shader_float16(f.shader_float16)
        .shader_int8(f.shader_int8);
    let mut s8 = vk::PhysicalDevice8BitStorageFeatures::default()
        .storage_buffer8_bit_access(f.storage_buffer_8bit_access)
        .uniform_and_storage_buffer8_bit_access(f.uniform_and_storage_buffer_8bit_access)
        .storage_push_constant8(f.storage_push_constant8);
    let mut hqr =
        vk::PhysicalDeviceHostQueryResetFeatures::default().host_query_reset(f.host_query_reset);
    let mut mm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default()
        .vulkan_memory_model(f.vulkan_memory_model)
        .vulkan_memory_model_device_scope(f.vulkan_memory_model_device_scope);
    let mut sget = vk::PhysicalDeviceShaderSubgroupExtendedTypesFeatures::default()
        .shader_subgroup_extended_types(f.shader_subgroup_extended_types);
    let mut a64 = vk::PhysicalDeviceShaderAtomicInt64Features::default()
        .shader_buffer_int64_atomics(f.shader_buffer_int64_atomics)
        .shader_shared_int64_atomics(f.shader_shared_int64_atomics);
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
        .shader_integer_dot_product(f.shader_integer_dot_product);
    let mut coop =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
        .pipeline_executable_info(true);
    let mut m5 = vk::PhysicalDeviceMaintenance5FeaturesKHR::default().maintenance5(true);
    let mut pb = super::pipeline_binary::FeaturesKhr::default();
    pb.pipeline_binaries = vk::TRUE;
    let mut extensions = Vec::new();
    if f.pipeline_binary {
        extensions.push(vk::KHR_MAINTENANCE5_NAME.as_ptr());
        extensions.push(super::pipeline_binary::NAME.as_ptr());
    }
    if f.pipeline_executable_info {
        extensions.push(vk::KHR_PIPELINE_EXECUTABLE_PROPERTIES_NAME.as_ptr());
    }
    if f.cooperative_matrix {
        extensions.push(vk::KHR_COOPERATIVE_MATRIX_NAME.as_ptr());
    }
    let cm2_on = f.cooperative_matrix && f.any_coop_matrix2();
    let mut cm2 = super::coopmat2::Features::enabling([
        f.coop_matrix2_workgroup_scope,
        f.coop_matrix2_flexible_dimensions,
        f.coop_matrix2_reductions,
        f.coop_matrix2_conversions,
        f.coop_matrix2_per_element_operations,
        f.coop_matrix2_tensor_addressing,
    ]);
    if cm2_on {
        extensions.push(super::coopmat2::NAME.as_ptr());
    }
    if f.pipeline_creation_feedback && !v13 {
        extensions.push(vk::EXT_PIPELINE_CREATION_FEEDBACK_NAME.as_ptr());
    }
    if f.spirv_1_4 && !v12 {
        extensions.push(vk::KHR_SPIRV_1_4_NAME.as_ptr());
        extensions.push(vk::KHR_SHADER_FLOAT_CONTROLS_NAME.as_ptr());
    }
    let mut info = vk::DeviceCreateInfo::default()
        .queue_create_infos(queues)
        .enabled_features(&core)
        .enabled_extension_names(&extensions)
        .push_next(&mut s16)
        .push_next(&mut vp);
    if v12 {
        info = info
            .push_next(&mut f16)
            .push_next(&mut s8)
            .push_next(&mut hqr)
            .push_next(&mut mm)
            .push_next(&mut sget)
            .push_next(&mut a64);
    }
    if v13 {
        info = info.push_next(&mut dot);
    }
    if f.cooperative_matrix {
        info = info.push_next(&mut coop);
    }
    if f.pipeline_executable_info {
        info = info.push_next(&mut stats);
    }
    if f.pipeline_binary {
        info = info.push_next(&mut m5).push_next(&mut pb);
    }
    if cm2_on {
        cm2.chain_into_create(&mut info);
    }
    // SAFETY: `info` and its chain live across the call (`cm2` is not moved while chained); every
    // feature and extension enabled was reported supported by `supported` (the caller's contract);
    // the 1.2 and 1.3 structs are chained only at those API versions.
    unsafe { instance.create_device(pd, &info, None) }
}

/// The variable that turns robustBufferAccess off on the devices kpc opens.
const ROBUST_VAR: &str = "KPC_VULKAN_ROBUST_ACCESS";

/// `KPC_VULKAN_ROBUST_ACCESS`: whether kpc enables robustBufferAccess where the device has it
/// (default yes).
pub(crate) fn robust_access_from_env() -> crate::error::Result<bool> {
    match std::env::var_os(ROBUST_VAR) {
        None => Ok(true),
        Some(v) => {
            let v = v.to_string_lossy();
            crate::config::parse_bool(ROBUST_VAR, &v).map_err(crate::error::Error::Config)
        }
    }
}

/// The fingerprint field saying whether the device runs with robustBufferAccess (`1`) or not (`0`).
pub(crate) const ROBUST_FIELD: &str = "robust_buffer_access";
