//! The Vulkan device features an embedder enabled, as C bits: `KPC_VULKAN_FEATURE_*` is
//! `kpc::interop::VulkanFeatures`' own bit for each flag, so C and Rust name one set.

use super::Failure;
use kpc::interop::VulkanFeatures;

/// `shaderInt16` was enabled on the device.
pub const KPC_VULKAN_FEATURE_SHADER_INT16: u64 = 1 << 0;
/// `shaderInt64`.
pub const KPC_VULKAN_FEATURE_SHADER_INT64: u64 = 1 << 1;
/// `shaderFloat64`.
pub const KPC_VULKAN_FEATURE_SHADER_FLOAT64: u64 = 1 << 2;
/// `storageBuffer16BitAccess`.
pub const KPC_VULKAN_FEATURE_STORAGE_BUFFER_16BIT_ACCESS: u64 = 1 << 3;
/// `uniformAndStorageBuffer16BitAccess`.
pub const KPC_VULKAN_FEATURE_UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS: u64 = 1 << 4;
/// `storagePushConstant16`.
pub const KPC_VULKAN_FEATURE_STORAGE_PUSH_CONSTANT16: u64 = 1 << 5;
/// `shaderFloat16` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_SHADER_FLOAT16: u64 = 1 << 6;
/// `shaderInt8` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_SHADER_INT8: u64 = 1 << 7;
/// `storageBuffer8BitAccess` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_STORAGE_BUFFER_8BIT_ACCESS: u64 = 1 << 8;
/// `uniformAndStorageBuffer8BitAccess` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS: u64 = 1 << 9;
/// `hostQueryReset` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_HOST_QUERY_RESET: u64 = 1 << 10;
/// `vulkanMemoryModel` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_VULKAN_MEMORY_MODEL: u64 = 1 << 11;
/// VK_KHR_cooperative_matrix with `cooperativeMatrix`.
pub const KPC_VULKAN_FEATURE_COOPERATIVE_MATRIX: u64 = 1 << 12;
/// VK_EXT_pipeline_creation_feedback (implied from Vulkan 1.3).
pub const KPC_VULKAN_FEATURE_PIPELINE_CREATION_FEEDBACK: u64 = 1 << 13;
/// VK_KHR_spirv_1_4 (implied from Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_SPIRV_1_4: u64 = 1 << 14;
/// VK_KHR_pipeline_executable_properties with `pipelineExecutableInfo`.
pub const KPC_VULKAN_FEATURE_PIPELINE_EXECUTABLE_INFO: u64 = 1 << 15;
/// `shaderSubgroupExtendedTypes` (Vulkan 1.2): subgroup operations on 8/16/64-bit types.
pub const KPC_VULKAN_FEATURE_SHADER_SUBGROUP_EXTENDED_TYPES: u64 = 1 << 16;
/// `storagePushConstant8` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_STORAGE_PUSH_CONSTANT8: u64 = 1 << 17;
/// `shaderBufferInt64Atomics` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_SHADER_BUFFER_INT64_ATOMICS: u64 = 1 << 18;
/// `shaderSharedInt64Atomics` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_SHADER_SHARED_INT64_ATOMICS: u64 = 1 << 19;
/// `variablePointersStorageBuffer`.
pub const KPC_VULKAN_FEATURE_VARIABLE_POINTERS_STORAGE_BUFFER: u64 = 1 << 20;
/// `variablePointers`.
pub const KPC_VULKAN_FEATURE_VARIABLE_POINTERS: u64 = 1 << 21;
/// `vulkanMemoryModelDeviceScope` (Vulkan 1.2).
pub const KPC_VULKAN_FEATURE_VULKAN_MEMORY_MODEL_DEVICE_SCOPE: u64 = 1 << 22;
/// `shaderIntegerDotProduct` (Vulkan 1.3).
pub const KPC_VULKAN_FEATURE_SHADER_INTEGER_DOT_PRODUCT: u64 = 1 << 23;
/// VK_NV_cooperative_matrix2 with `cooperativeMatrixWorkgroupScope`.
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_WORKGROUP_SCOPE: u64 = 1 << 24;
/// `cooperativeMatrixFlexibleDimensions` (VK_NV_cooperative_matrix2).
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_FLEXIBLE_DIMENSIONS: u64 = 1 << 25;
/// `cooperativeMatrixReductions` (VK_NV_cooperative_matrix2).
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_REDUCTIONS: u64 = 1 << 26;
/// `cooperativeMatrixConversions` (VK_NV_cooperative_matrix2).
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_CONVERSIONS: u64 = 1 << 27;
/// `cooperativeMatrixPerElementOperations` (VK_NV_cooperative_matrix2).
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_PER_ELEMENT_OPERATIONS: u64 = 1 << 28;
/// `cooperativeMatrixTensorAddressing` (VK_NV_cooperative_matrix2).
pub const KPC_VULKAN_FEATURE_COOP_MATRIX2_TENSOR_ADDRESSING: u64 = 1 << 29;

/// VK_KHR_pipeline_binary with `pipelineBinaries`, and VK_KHR_maintenance5 with `maintenance5`
/// (Vulkan 1.3): kpc persists pipeline binaries for this device.
pub const KPC_VULKAN_FEATURE_PIPELINE_BINARY: u64 = 1 << 30;

/// `robustBufferAccess` was enabled on the device: out-of-bounds buffer accesses stay inside the
/// buffer, so kpc launches any kernel on it without declared access bounds.
pub const KPC_VULKAN_FEATURE_ROBUST_BUFFER_ACCESS: u64 = 1 << 31;

pub(crate) fn features(bits: u64) -> Result<VulkanFeatures, Failure> {
    let all = u64::from(VulkanFeatures::all().bits());
    if bits & !all != 0 {
        return Err(Failure::invalid(format!(
            "enabled_features has unknown bits {:#x}: expected KPC_VULKAN_FEATURE_* bits only",
            bits & !all
        )));
    }
    // The C bits are the flags' own (`c_bits_are_the_flags`), and only defined bits are left.
    Ok(VulkanFeatures::from_bits_retain(bits as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's bits are `VulkanFeatures`' own, which `features` relies on.
    #[test]
    fn c_bits_are_the_flags() {
        let pairs = [
            (
                KPC_VULKAN_FEATURE_SHADER_INT16,
                VulkanFeatures::SHADER_INT16,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_INT64,
                VulkanFeatures::SHADER_INT64,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_FLOAT64,
                VulkanFeatures::SHADER_FLOAT64,
            ),
            (
                KPC_VULKAN_FEATURE_STORAGE_BUFFER_16BIT_ACCESS,
                VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS,
            ),
            (
                KPC_VULKAN_FEATURE_UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS,
                VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_16BIT_ACCESS,
            ),
            (
                KPC_VULKAN_FEATURE_STORAGE_PUSH_CONSTANT16,
                VulkanFeatures::STORAGE_PUSH_CONSTANT16,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_FLOAT16,
                VulkanFeatures::SHADER_FLOAT16,
            ),
            (KPC_VULKAN_FEATURE_SHADER_INT8, VulkanFeatures::SHADER_INT8),
            (
                KPC_VULKAN_FEATURE_STORAGE_BUFFER_8BIT_ACCESS,
                VulkanFeatures::STORAGE_BUFFER_8BIT_ACCESS,
            ),
            (
                KPC_VULKAN_FEATURE_UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS,
                VulkanFeatures::UNIFORM_AND_STORAGE_BUFFER_8BIT_ACCESS,
            ),
            (
                KPC_VULKAN_FEATURE_HOST_QUERY_RESET,
                VulkanFeatures::HOST_QUERY_RESET,
            ),
            (
                KPC_VULKAN_FEATURE_VULKAN_MEMORY_MODEL,
                VulkanFeatures::VULKAN_MEMORY_MODEL,
            ),
            (
                KPC_VULKAN_FEATURE_COOPERATIVE_MATRIX,
                VulkanFeatures::COOPERATIVE_MATRIX,
            ),
            (
                KPC_VULKAN_FEATURE_PIPELINE_CREATION_FEEDBACK,
                VulkanFeatures::PIPELINE_CREATION_FEEDBACK,
            ),
            (KPC_VULKAN_FEATURE_SPIRV_1_4, VulkanFeatures::SPIRV_1_4),
            (
                KPC_VULKAN_FEATURE_PIPELINE_EXECUTABLE_INFO,
                VulkanFeatures::PIPELINE_EXECUTABLE_INFO,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_SUBGROUP_EXTENDED_TYPES,
                VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES,
            ),
            (
                KPC_VULKAN_FEATURE_STORAGE_PUSH_CONSTANT8,
                VulkanFeatures::STORAGE_PUSH_CONSTANT8,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_BUFFER_INT64_ATOMICS,
                VulkanFeatures::SHADER_BUFFER_INT64_ATOMICS,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_SHARED_INT64_ATOMICS,
                VulkanFeatures::SHADER_SHARED_INT64_ATOMICS,
            ),
            (
                KPC_VULKAN_FEATURE_VARIABLE_POINTERS_STORAGE_BUFFER,
                VulkanFeatures::VARIABLE_POINTERS_STORAGE_BUFFER,
            ),
            (
                KPC_VULKAN_FEATURE_VARIABLE_POINTERS,
                VulkanFeatures::VARIABLE_POINTERS,
            ),
            (
                KPC_VULKAN_FEATURE_VULKAN_MEMORY_MODEL_DEVICE_SCOPE,
                VulkanFeatures::VULKAN_MEMORY_MODEL_DEVICE_SCOPE,
            ),
            (
                KPC_VULKAN_FEATURE_SHADER_INTEGER_DOT_PRODUCT,
                VulkanFeatures::SHADER_INTEGER_DOT_PRODUCT,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_WORKGROUP_SCOPE,
                VulkanFeatures::COOP_MATRIX2_WORKGROUP_SCOPE,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_FLEXIBLE_DIMENSIONS,
                VulkanFeatures::COOP_MATRIX2_FLEXIBLE_DIMENSIONS,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_REDUCTIONS,
                VulkanFeatures::COOP_MATRIX2_REDUCTIONS,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_CONVERSIONS,
                VulkanFeatures::COOP_MATRIX2_CONVERSIONS,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_PER_ELEMENT_OPERATIONS,
                VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS,
            ),
            (
                KPC_VULKAN_FEATURE_COOP_MATRIX2_TENSOR_ADDRESSING,
                VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING,
            ),
            (
                KPC_VULKAN_FEATURE_PIPELINE_BINARY,
                VulkanFeatures::PIPELINE_BINARY,
            ),
            (
                KPC_VULKAN_FEATURE_ROBUST_BUFFER_ACCESS,
                VulkanFeatures::ROBUST_BUFFER_ACCESS,
            ),
        ];
        let mut all = VulkanFeatures::empty();
        for (c, flag) in pairs {
            assert_eq!(c, u64::from(flag.bits()), "{flag:?}");
            all |= flag;
        }
        assert_eq!(all, VulkanFeatures::all());
        assert_eq!(
            features(KPC_VULKAN_FEATURE_SHADER_INT8 | KPC_VULKAN_FEATURE_PIPELINE_BINARY).ok(),
            Some(VulkanFeatures::SHADER_INT8 | VulkanFeatures::PIPELINE_BINARY)
        );
        assert!(features(1 << 32).is_err());
    }
}
