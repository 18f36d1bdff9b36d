//! The optional device features and extensions kpc knows: what a device supports, what kpc enables
//! on a device it opens (everything it checks shaders for, where the device has it), and what an
//! embedder declares for its own device. One set of flags, [`VulkanFeatures`], says all three, so that
//! `capability_check.rs` checks shaders the same way on owned and borrowed devices.

use ash::vk;

bitflags::bitflags! {
    /// Optional features and extensions enabled on a device, one flag each. kpc fills it for a
    /// device it opens itself (every flag the device supports is set); an embedder sets it for its
    /// own device in [`super::VulkanHandles::enabled`]. The default is empty: kpc then uses no
    /// optional feature, and a kernel whose SPIR-V needs one is refused with
    /// [`crate::Error::Unsupported`] before the driver sees it. A flag an embedder sets for something
    /// the device does not support is refused with [`crate::Error::InvalidArgument`] (it cannot have
    /// been enabled). The bit values are the C API's `KPC_VULKAN_FEATURE_*` constants.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct VulkanFeatures: u32 {
        /// `VkPhysicalDeviceFeatures::shaderInt16` (SPIR-V `Int16`).
        const SHADER_INT16 = 1 << 0;
        /// `VkPhysicalDeviceFeatures::shaderInt64` (SPIR-V `Int64`).
        const SHADER_INT64 = 1 << 1;
        /// `VkPhysicalDeviceFeatures::shaderFloat64` (SPIR-V `Float64`).
        const SHADER_FLOAT64 = 1 << 2;
        /// `storageBuffer16BitAccess` (SPIR-V `StorageBuffer16BitAccess`): fp16 K/V in the attention
        /// kernels.
        const STORAGE_BUFFER_16BIT_ACCESS = 1 << 3;
        /// `uniformAndStorageBuffer16BitAccess`.
        const UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS = 1 << 4;
        /// `storagePushConstant16`.
        const STORAGE_PUSH_CONSTANT16 = 1 << 5;
        /// `shaderFloat16` (Vulkan 1.2; SPIR-V `Float16`).
        const SHADER_FLOAT16 = 1 << 6;
        /// `shaderInt8` (Vulkan 1.2; SPIR-V `Int8`).
        const SHADER_INT8 = 1 << 7;
        /// `storageBuffer8BitAccess` (Vulkan 1.2).
        const STORAGE_BUFFER_8BIT_ACCESS = 1 << 8;
        /// `uniformAndStorageBuffer8BitAccess` (Vulkan 1.2).
        const UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS = 1 << 9;
        /// `hostQueryReset` (Vulkan 1.2): kpc resets its timestamp pools from the host.
        const HOST_QUERY_RESET = 1 << 10;
        /// `vulkanMemoryModel` (Vulkan 1.2).
        const VULKAN_MEMORY_MODEL = 1 << 11;
        /// VK_KHR_cooperative_matrix with its `cooperativeMatrix` feature (the cooperative-matrix
        /// prefill kernel also needs `vulkan_memory_model`, `shader_float16` and
        /// `storage_buffer_16bit_access`).
        const COOPERATIVE_MATRIX = 1 << 12;
        /// VK_EXT_pipeline_creation_feedback (core, hence implied, from Vulkan 1.3): kpc reports driver
        /// pipeline-cache hits.
        const PIPELINE_CREATION_FEEDBACK = 1 << 13;
        /// VK_KHR_spirv_1_4 (core from Vulkan 1.2): SPIR-V 1.4 modules on a 1.1 device.
        const SPIRV_1_4 = 1 << 14;
        /// VK_KHR_pipeline_executable_properties with `pipelineExecutableInfo`: the driver's statistics
        /// about each kernel, in `KernelInfo::driver_stats`.
        const PIPELINE_EXECUTABLE_INFO = 1 << 15;
        /// `shaderSubgroupExtendedTypes` (Vulkan 1.2): subgroup operations on 8-, 16- and 64-bit
        /// integers and 16-bit floats.
        const SHADER_SUBGROUP_EXTENDED_TYPES = 1 << 16;
        /// `storagePushConstant8` (Vulkan 1.2; SPIR-V `StoragePushConstant8`).
        const STORAGE_PUSH_CONSTANT8 = 1 << 17;
        /// `shaderBufferInt64Atomics` (Vulkan 1.2; SPIR-V `Int64Atomics` on buffers).
        const SHADER_BUFFER_INT64_ATOMICS = 1 << 18;
        /// `shaderSharedInt64Atomics` (Vulkan 1.2; SPIR-V `Int64Atomics` on shared memory).
        const SHADER_SHARED_INT64_ATOMICS = 1 << 19;
        /// `variablePointersStorageBuffer` (SPIR-V `VariablePointersStorageBuffer`).
        const VARIABLE_POINTERS_STORAGE_BUFFER = 1 << 20;
        /// `variablePointers` (SPIR-V `VariablePointers`).
        const VARIABLE_POINTERS = 1 << 21;
        /// `vulkanMemoryModelDeviceScope` (Vulkan 1.2; SPIR-V `VulkanMemoryModelDeviceScope`).
        const VULKAN_MEMORY_MODEL_DEVICE_SCOPE = 1 << 22;
        /// `shaderIntegerDotProduct` (Vulkan 1.3; SPIR-V `DotProduct*`).
        const SHADER_INTEGER_DOT_PRODUCT = 1 << 23;
        /// VK_NV_cooperative_matrix2 with `cooperativeMatrixWorkgroupScope` (matrices owned by a whole
        /// workgroup). kpc enables the extension with the features below that the device has.
        const COOP_MATRIX2_WORKGROUP_SCOPE = 1 << 24;
        /// `cooperativeMatrixFlexibleDimensions` (VK_NV_cooperative_matrix2): matrix sizes beyond the
        /// listed shapes.
        const COOP_MATRIX2_FLEXIBLE_DIMENSIONS = 1 << 25;
        /// `cooperativeMatrixReductions` (SPIR-V `CooperativeMatrixReductionsNV`).
        const COOP_MATRIX2_REDUCTIONS = 1 << 26;
        /// `cooperativeMatrixConversions` (SPIR-V `CooperativeMatrixConversionsNV`).
        const COOP_MATRIX2_CONVERSIONS = 1 << 27;
        /// `cooperativeMatrixPerElementOperations` (SPIR-V `CooperativeMatrixPerElementOperationsNV`).
        const COOP_MATRIX2_PER_ELEMENT_OPERATIONS = 1 << 28;
        /// `cooperativeMatrixTensorAddressing` (SPIR-V `TensorAddressingNV` and
        /// `CooperativeMatrixTensorAddressingNV`).
        const COOP_MATRIX2_TENSOR_ADDRESSING = 1 << 29;
        /// VK_KHR_pipeline_binary with `pipelineBinaries`, and VK_KHR_maintenance5 with `maintenance5`
        /// (which it requires; Vulkan 1.3 devices only): kpc persists pipeline binaries instead of
        /// pipeline-cache data (`KPC_VULKAN_PIPELINE_BINARY`).
        const PIPELINE_BINARY = 1 << 30;
        /// `VkPhysicalDeviceFeatures::robustBufferAccess`: a kernel's out-of-bounds buffer accesses
        /// stay inside the buffer (reads return values from the buffer or zero, writes land inside it
        /// or are dropped). kpc enables it on the devices it opens where the device has it (unless
        /// `KPC_VULKAN_ROBUST_ACCESS=0`); with it on, [`crate::Queue::submit`] launches any kernel
        /// safely. Without it, only kernels with declared access bounds launch safely.
        const ROBUST_BUFFER_ACCESS = 1 << 31;
    }
}

impl VulkanFeatures {
    /// Vulkan's name for each flag (the feature, or the extension where the flag stands for one),
    /// in bit order: what kpc's messages name.
    const VULKAN_NAMES: [(VulkanFeatures, &'static str); 32] = [
        (VulkanFeatures::SHADER_INT16, "shaderInt16"),
        (VulkanFeatures::SHADER_INT64, "shaderInt64"),
        (VulkanFeatures::SHADER_FLOAT64, "shaderFloat64"),
        (
            VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS,
            "storageBuffer16BitAccess",
        ),
        (
            VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS,
            "uniformAndStorageBuffer16BitAccess",
        ),
        (
            VulkanFeatures::STORAGE_PUSH_CONSTANT16,
            "storagePushConstant16",
        ),
        (VulkanFeatures::SHADER_FLOAT16, "shaderFloat16"),
        (VulkanFeatures::SHADER_INT8, "shaderInt8"),
        (
            VulkanFeatures::STORAGE_BUFFER_8BIT_ACCESS,
            "storageBuffer8BitAccess",
        ),
        (
            VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS,
            "uniformAndStorageBuffer8BitAccess",
        ),
        (VulkanFeatures::HOST_QUERY_RESET, "hostQueryReset"),
        (VulkanFeatures::VULKAN_MEMORY_MODEL, "vulkanMemoryModel"),
        (
            VulkanFeatures::COOPERATIVE_MATRIX,
            "VK_KHR_cooperative_matrix",
        ),
        (
            VulkanFeatures::PIPELINE_CREATION_FEEDBACK,
            "VK_EXT_pipeline_creation_feedback",
        ),
        (VulkanFeatures::SPIRV_1_4, "VK_KHR_spirv_1_4"),
        (
            VulkanFeatures::PIPELINE_EXECUTABLE_INFO,
            "pipelineExecutableInfo",
        ),
        (
            VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES,
            "shaderSubgroupExtendedTypes",
        ),
        (
            VulkanFeatures::STORAGE_PUSH_CONSTANT8,
            "storagePushConstant8",
        ),
        (
            VulkanFeatures::SHADER_BUFFER_INT64_ATOMICS,
            "shaderBufferInt64Atomics",
        ),
        (
            VulkanFeatures::SHADER_SHARED_INT64_ATOMICS,
            "shaderSharedInt64Atomics",
        ),
        (
            VulkanFeatures::VARIABLE_POINTERS_STORAGE_BUFFER,
            "variablePointersStorageBuffer",
        ),
        (VulkanFeatures::VARIABLE_POINTERS, "variablePointers"),
        (
            VulkanFeatures::VULKAN_MEMORY_MODEL_DEVICE_SCOPE,
            "vulkanMemoryModelDeviceScope",
        ),
        (
            VulkanFeatures::SHADER_INTEGER_DOT_PRODUCT,
            "shaderIntegerDotProduct",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_WORKGROUP_SCOPE,
            "cooperativeMatrixWorkgroupScope",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_FLEXIBLE_DIMENSIONS,
            "cooperativeMatrixFlexibleDimensions",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_REDUCTIONS,
            "cooperativeMatrixReductions",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_CONVERSIONS,
            "cooperativeMatrixConversions",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS,
            "cooperativeMatrixPerElementOperations",
        ),
        (
            VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING,
            "cooperativeMatrixTensorAddressing",
        ),
        (VulkanFeatures::PIPELINE_BINARY, "VK_KHR_pipeline_binary"),
        (VulkanFeatures::ROBUST_BUFFER_ACCESS, "robustBufferAccess"),
    ];

    /// Vulkan's name of `flag` (a single flag), e.g. `shaderInt16` or `VK_KHR_cooperative_matrix`.
    pub(crate) fn vulkan_name(flag: VulkanFeatures) -> Option<&'static str> {
        Self::VULKAN_NAMES
            .iter()
            .find(|(f, _)| *f == flag)
            .map(|(_, n)| *n)
    }

    /// The flag Vulkan calls `name` (see [`VulkanFeatures::vulkan_name`]).
    pub(crate) fn from_vulkan_name(name: &str) -> Option<VulkanFeatures> {
        Self::VULKAN_NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(f, _)| *f)
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
    let mut f = VulkanFeatures::empty();
    for (flag, on) in [
        (
            VulkanFeatures::ROBUST_BUFFER_ACCESS,
            on(core.robust_buffer_access),
        ),
        (VulkanFeatures::SHADER_INT16, on(core.shader_int16)),
        (VulkanFeatures::SHADER_INT64, on(core.shader_int64)),
        (VulkanFeatures::SHADER_FLOAT64, on(core.shader_float64)),
        (
            VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS,
            on(s16.storage_buffer16_bit_access),
        ),
        (
            VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS,
            on(s16.uniform_and_storage_buffer16_bit_access),
        ),
        (
            VulkanFeatures::STORAGE_PUSH_CONSTANT16,
            on(s16.storage_push_constant16),
        ),
        (
            VulkanFeatures::SHADER_FLOAT16,
            v12 && on(f16.shader_float16),
        ),
        (VulkanFeatures::SHADER_INT8, v12 && on(f16.shader_int8)),
        (
            VulkanFeatures::STORAGE_BUFFER_8BIT_ACCESS,
            v12 && on(s8.storage_buffer8_bit_access),
        ),
        (
            VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS,
            v12 && on(s8.uniform_and_storage_buffer8_bit_access),
        ),
        (
            VulkanFeatures::HOST_QUERY_RESET,
            v12 && on(hqr.host_query_reset),
        ),
        (
            VulkanFeatures::VULKAN_MEMORY_MODEL,
            v12 && on(mm.vulkan_memory_model),
        ),
        (
            VulkanFeatures::COOPERATIVE_MATRIX,
            coop_ext && on(coop.cooperative_matrix),
        ),
        (VulkanFeatures::PIPELINE_CREATION_FEEDBACK, feedback),
        (VulkanFeatures::SPIRV_1_4, spirv_1_4_ext || v12),
        (
            VulkanFeatures::PIPELINE_EXECUTABLE_INFO,
            stats_ext && on(stats.pipeline_executable_info),
        ),
        (
            VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES,
            v12 && on(sget.shader_subgroup_extended_types),
        ),
        (
            VulkanFeatures::STORAGE_PUSH_CONSTANT8,
            v12 && on(s8.storage_push_constant8),
        ),
        (
            VulkanFeatures::SHADER_BUFFER_INT64_ATOMICS,
            v12 && on(a64.shader_buffer_int64_atomics),
        ),
        (
            VulkanFeatures::SHADER_SHARED_INT64_ATOMICS,
            v12 && on(a64.shader_shared_int64_atomics),
        ),
        (
            VulkanFeatures::VARIABLE_POINTERS_STORAGE_BUFFER,
            on(vp.variable_pointers_storage_buffer),
        ),
        (VulkanFeatures::VARIABLE_POINTERS, on(vp.variable_pointers)),
        (
            VulkanFeatures::VULKAN_MEMORY_MODEL_DEVICE_SCOPE,
            v12 && on(mm.vulkan_memory_model_device_scope),
        ),
        (
            VulkanFeatures::SHADER_INTEGER_DOT_PRODUCT,
            v13 && on(dot.shader_integer_dot_product),
        ),
        (
            VulkanFeatures::PIPELINE_BINARY,
            binary_ext && on(m5.maintenance5) && on(pb.pipeline_binaries),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_WORKGROUP_SCOPE,
            cm2_ext && on(cm2.workgroup_scope),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_FLEXIBLE_DIMENSIONS,
            cm2_ext && on(cm2.flexible_dimensions),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_REDUCTIONS,
            cm2_ext && on(cm2.reductions),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_CONVERSIONS,
            cm2_ext && on(cm2.conversions),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS,
            cm2_ext && on(cm2.per_element_operations),
        ),
        (
            VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING,
            cm2_ext && on(cm2.tensor_addressing),
        ),
    ] {
        f.set(flag, on);
    }
    f
}

impl VulkanFeatures {
    /// Every VK_NV_cooperative_matrix2 flag (`attn_prefill_cm2` uses them all).
    pub(crate) const COOP_MATRIX2: VulkanFeatures = VulkanFeatures::COOP_MATRIX2_WORKGROUP_SCOPE
        .union(VulkanFeatures::COOP_MATRIX2_FLEXIBLE_DIMENSIONS)
        .union(VulkanFeatures::COOP_MATRIX2_REDUCTIONS)
        .union(VulkanFeatures::COOP_MATRIX2_CONVERSIONS)
        .union(VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS)
        .union(VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING);

    /// Whether any VK_NV_cooperative_matrix2 feature is on (then the extension is enabled).
    pub(crate) fn any_coop_matrix2(&self) -> bool {
        self.intersects(Self::COOP_MATRIX2)
    }

    /// Whether every VK_NV_cooperative_matrix2 feature `attn_prefill_cm2` uses is on.
    pub(crate) fn all_coop_matrix2(&self) -> bool {
        self.contains(Self::COOP_MATRIX2)
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
        .robust_buffer_access(f.contains(VulkanFeatures::ROBUST_BUFFER_ACCESS))
        .shader_int16(f.contains(VulkanFeatures::SHADER_INT16))
        .shader_int64(f.contains(VulkanFeatures::SHADER_INT64))
        .shader_float64(f.contains(VulkanFeatures::SHADER_FLOAT64));
    let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default()
        .storage_buffer16_bit_access(f.contains(VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS))
        .uniform_and_storage_buffer16_bit_access(
            f.contains(VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS),
        )
        .storage_push_constant16(f.contains(VulkanFeatures::STORAGE_PUSH_CONSTANT16));
    let mut vp = vk::PhysicalDeviceVariablePointersFeatures::default()
        .variable_pointers_storage_buffer(
            f.contains(VulkanFeatures::VARIABLE_POINTERS_STORAGE_BUFFER),
        )
        .variable_pointers(f.contains(VulkanFeatures::VARIABLE_POINTERS));
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default()
        .shader_float16(f.contains(VulkanFeatures::SHADER_FLOAT16))
        .shader_int8(f.contains(VulkanFeatures::SHADER_INT8));
    let mut s8 = vk::PhysicalDevice8BitStorageFeatures::default()
        .storage_buffer8_bit_access(f.contains(VulkanFeatures::STORAGE_BUFFER_8BIT_ACCESS))
        .uniform_and_storage_buffer8_bit_access(
            f.contains(VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS),
        )
        .storage_push_constant8(f.contains(VulkanFeatures::STORAGE_PUSH_CONSTANT8));
    let mut hqr = vk::PhysicalDeviceHostQueryResetFeatures::default()
        .host_query_reset(f.contains(VulkanFeatures::HOST_QUERY_RESET));
    let mut mm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default()
        .vulkan_memory_model(f.contains(VulkanFeatures::VULKAN_MEMORY_MODEL))
        .vulkan_memory_model_device_scope(
            f.contains(VulkanFeatures::VULKAN_MEMORY_MODEL_DEVICE_SCOPE),
        );
    let mut sget = vk::PhysicalDeviceShaderSubgroupExtendedTypesFeatures::default()
        .shader_subgroup_extended_types(f.contains(VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES));
    let mut a64 = vk::PhysicalDeviceShaderAtomicInt64Features::default()
        .shader_buffer_int64_atomics(f.contains(VulkanFeatures::SHADER_BUFFER_INT64_ATOMICS))
        .shader_shared_int64_atomics(f.contains(VulkanFeatures::SHADER_SHARED_INT64_ATOMICS));
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
        .shader_integer_dot_product(f.contains(VulkanFeatures::SHADER_INTEGER_DOT_PRODUCT));
    let mut coop =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
        .pipeline_executable_info(true);
    let mut m5 = vk::PhysicalDeviceMaintenance5FeaturesKHR::default().maintenance5(true);
    let mut pb = super::pipeline_binary::FeaturesKhr::default();
    pb.pipeline_binaries = vk::TRUE;
    let mut extensions = Vec::new();
    if f.contains(VulkanFeatures::PIPELINE_BINARY) {
        extensions.push(vk::KHR_MAINTENANCE5_NAME.as_ptr());
        extensions.push(super::pipeline_binary::NAME.as_ptr());
    }
    if f.contains(VulkanFeatures::PIPELINE_EXECUTABLE_INFO) {
        extensions.push(vk::KHR_PIPELINE_EXECUTABLE_PROPERTIES_NAME.as_ptr());
    }
    if f.contains(VulkanFeatures::COOPERATIVE_MATRIX) {
        extensions.push(vk::KHR_COOPERATIVE_MATRIX_NAME.as_ptr());
    }
    let cm2_on = f.contains(VulkanFeatures::COOPERATIVE_MATRIX) && f.any_coop_matrix2();
    let mut cm2 = super::coopmat2::Features::enabling([
        f.contains(VulkanFeatures::COOP_MATRIX2_WORKGROUP_SCOPE),
        f.contains(VulkanFeatures::COOP_MATRIX2_FLEXIBLE_DIMENSIONS),
        f.contains(VulkanFeatures::COOP_MATRIX2_REDUCTIONS),
        f.contains(VulkanFeatures::COOP_MATRIX2_CONVERSIONS),
        f.contains(VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS),
        f.contains(VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING),
    ]);
    if cm2_on {
        extensions.push(super::coopmat2::NAME.as_ptr());
    }
    if f.contains(VulkanFeatures::PIPELINE_CREATION_FEEDBACK) && !v13 {
        extensions.push(vk::EXT_PIPELINE_CREATION_FEEDBACK_NAME.as_ptr());
    }
    if f.contains(VulkanFeatures::SPIRV_1_4) && !v12 {
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
    if f.contains(VulkanFeatures::COOPERATIVE_MATRIX) {
        info = info.push_next(&mut coop);
    }
    if f.contains(VulkanFeatures::PIPELINE_EXECUTABLE_INFO) {
        info = info.push_next(&mut stats);
    }
    if f.contains(VulkanFeatures::PIPELINE_BINARY) {
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
