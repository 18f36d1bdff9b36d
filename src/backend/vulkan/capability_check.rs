//! Before a module reaches vkCreateShaderModule: every capability and extension it declares, and
//! the extended types its subgroup operations use, checked against what the device enabled (a
//! device kpc opened: everything it supports of [`VulkanFeatures`]; an embedder's: what the embedder
//! declared) and the subgroup operations it supports in compute shaders. A module that fails is
//! refused with [`Error::Unsupported`], which the runtime caches like any deterministic build error:
//! the driver never sees SPIR-V the device cannot legally run.

use ash::vk;
use rspirv::spirv::Capability;

use crate::backend::spirv::ModuleNeeds;
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::features::VulkanFeatures;

/// What kpc may use on one device: what shaders are checked against.
#[derive(Debug, Clone)]
pub(crate) struct ShaderCaps {
    /// The optional features and extensions enabled on the device.
    pub(crate) enabled: VulkanFeatures,
    /// The API version in use (the lower of the device's and the instance's).
    pub(crate) api: u32,
    /// Subgroup operations the device supports in compute shaders (empty where compute is not
    /// among its subgroup stages).
    pub(crate) subgroup_ops: vk::SubgroupFeatureFlags,
    /// The device's name, for messages.
    pub(crate) device: String,
    /// Whether the device is an embedder's: then `enabled` is what it declared.
    pub(crate) borrowed: bool,
}

/// What a capability needs.
enum Need {
    /// Nothing beyond Vulkan 1.1 compute.
    Nothing,
    /// One of these [`VulkanFeatures`] flags (by Vulkan name) enabled.
    Feature(&'static [&'static str]),
    /// A subgroup operation supported in compute shaders.
    Subgroup(vk::SubgroupFeatureFlags, &'static str),
    /// Something kpc never enables (image formats, ray tracing, vendor features, ...).
    Never,
}

fn need(cap: Capability) -> Need {
    use Capability as C;
    use vk::SubgroupFeatureFlags as S;
    match cap {
        C::Matrix
        | C::Shader
        | C::Sampled1D
        | C::Image1D
        | C::SampledBuffer
        | C::ImageBuffer
        | C::ImageQuery
        | C::DerivativeControl
        | C::StorageImageExtendedFormats
        | C::DeviceGroup
        | C::MultiView => Need::Nothing,
        C::Int16 => Need::Feature(&["shaderInt16"]),
        C::Int64 => Need::Feature(&["shaderInt64"]),
        C::Float64 => Need::Feature(&["shaderFloat64"]),
        C::Float16 => Need::Feature(&["shaderFloat16"]),
        C::Int8 => Need::Feature(&["shaderInt8"]),
        C::StorageBuffer16BitAccess => Need::Feature(&["storageBuffer16BitAccess"]),
        C::UniformAndStorageBuffer16BitAccess => {
            Need::Feature(&["uniformAndStorageBuffer16BitAccess"])
        }
        C::StoragePushConstant16 => Need::Feature(&["storagePushConstant16"]),
        C::StorageBuffer8BitAccess => Need::Feature(&["storageBuffer8BitAccess"]),
        C::UniformAndStorageBuffer8BitAccess => {
            Need::Feature(&["uniformAndStorageBuffer8BitAccess"])
        }
        C::StoragePushConstant8 => Need::Feature(&["storagePushConstant8"]),
        C::Int64Atomics => Need::Feature(&["shaderBufferInt64Atomics", "shaderSharedInt64Atomics"]),
        C::VariablePointersStorageBuffer => Need::Feature(&["variablePointersStorageBuffer"]),
        C::VariablePointers => Need::Feature(&["variablePointers"]),
        C::VulkanMemoryModel => Need::Feature(&["vulkanMemoryModel"]),
        C::VulkanMemoryModelDeviceScope => Need::Feature(&["vulkanMemoryModelDeviceScope"]),
        C::CooperativeMatrixKHR => Need::Feature(&["VK_KHR_cooperative_matrix"]),
        C::DotProduct | C::DotProductInputAll | C::DotProductInput4x8Bit => {
            Need::Feature(&["shaderIntegerDotProduct"])
        }
        C::DotProductInput4x8BitPacked => Need::Feature(&["shaderIntegerDotProduct"]),
        C::GroupNonUniform => Need::Subgroup(S::BASIC, "BASIC"),
        C::GroupNonUniformVote => Need::Subgroup(S::VOTE, "VOTE"),
        C::GroupNonUniformArithmetic => Need::Subgroup(S::ARITHMETIC, "ARITHMETIC"),
        C::GroupNonUniformBallot => Need::Subgroup(S::BALLOT, "BALLOT"),
        C::GroupNonUniformShuffle => Need::Subgroup(S::SHUFFLE, "SHUFFLE"),
        C::GroupNonUniformShuffleRelative => {
            Need::Subgroup(S::SHUFFLE_RELATIVE, "SHUFFLE_RELATIVE")
        }
        C::GroupNonUniformClustered => Need::Subgroup(S::CLUSTERED, "CLUSTERED"),
        C::GroupNonUniformQuad => Need::Subgroup(S::QUAD, "QUAD"),
        _ => Need::Never,
    }
}

/// What a capability newer than the parser's grammar needs, by number (SPIR-V registry values).
fn newer_need(cap: u32) -> (&'static str, Need) {
    match cap {
        5430 => (
            "CooperativeMatrixReductionsNV",
            Need::Feature(&["cooperativeMatrixReductions"]),
        ),
        5431 => (
            "CooperativeMatrixConversionsNV",
            Need::Feature(&["cooperativeMatrixConversions"]),
        ),
        5432 => (
            "CooperativeMatrixPerElementOperationsNV",
            Need::Feature(&["cooperativeMatrixPerElementOperations"]),
        ),
        5433 => (
            "CooperativeMatrixTensorAddressingNV",
            Need::Feature(&["cooperativeMatrixTensorAddressing"]),
        ),
        5439 => (
            "TensorAddressingNV",
            Need::Feature(&["cooperativeMatrixTensorAddressing"]),
        ),
        // CooperativeMatrixBlockLoadsNV (5434) among others: kpc never enables block loads.
        _ => ("", Need::Never),
    }
}

/// Whether the device accepts OpExtension `name`: the Vulkan version that made it core, or the
/// feature that comes with it. `None`: kpc does not enable the device extension it needs.
fn extension_ok(name: &str, caps: &ShaderCaps) -> Option<bool> {
    let at = |v: u32| caps.api >= v;
    Some(match name {
        "SPV_KHR_storage_buffer_storage_class"
        | "SPV_KHR_16bit_storage"
        | "SPV_KHR_variable_pointers"
        | "SPV_KHR_shader_draw_parameters"
        | "SPV_KHR_device_group"
        | "SPV_KHR_multiview" => at(vk::API_VERSION_1_1),
        "SPV_KHR_8bit_storage"
        | "SPV_KHR_vulkan_memory_model"
        | "SPV_KHR_physical_storage_buffer"
        | "SPV_EXT_descriptor_indexing"
        | "SPV_KHR_shader_atomic_counter_ops" => at(vk::API_VERSION_1_2),
        "SPV_KHR_float_controls" | "SPV_KHR_no_integer_wrap_decoration" => {
            at(vk::API_VERSION_1_2) || caps.enabled.contains(VulkanFeatures::SPIRV_1_4)
        }
        "SPV_KHR_integer_dot_product"
        | "SPV_KHR_non_semantic_info"
        | "SPV_KHR_terminate_invocation"
        | "SPV_EXT_demote_to_helper_invocation" => at(vk::API_VERSION_1_3),
        "SPV_KHR_cooperative_matrix" => caps.enabled.contains(VulkanFeatures::COOPERATIVE_MATRIX),
        // Each of their capabilities is checked against its own feature.
        "SPV_NV_cooperative_matrix2" | "SPV_NV_tensor_addressing" => {
            caps.enabled.contains(VulkanFeatures::COOPERATIVE_MATRIX)
                && caps.enabled.any_coop_matrix2()
        }
        _ => return None,
    })
}

fn unsupported(image: &str, needs: String, reason: String) -> Error {
    Error::Unsupported {
        backend: BackendKind::Vulkan,
        image: image.to_string(),
        needs,
        reason,
    }
}

impl ShaderCaps {
    /// Whether `feature` (a Vulkan name of a [`VulkanFeatures`] flag) is enabled.
    fn has(&self, feature: &str) -> bool {
        VulkanFeatures::from_vulkan_name(feature).is_some_and(|f| self.enabled.contains(f))
    }

    /// Why `features` are not there, in the device's terms.
    fn missing(&self, features: &[&str]) -> String {
        let names = features.join(" or ");
        if self.borrowed {
            let fields: Vec<&str> = VulkanFeatures::all()
                .iter_names()
                .filter(|(_, f)| {
                    VulkanFeatures::vulkan_name(*f).is_some_and(|v| features.contains(&v))
                })
                .map(|(name, _)| name)
                .collect();
            format!(
                "{names} is not enabled on the embedder's device {:?} (VulkanFeatures::{} is not \
                 declared)",
                self.device,
                fields.join(" / VulkanFeatures::")
            )
        } else {
            format!(
                "device {:?} does not support {names} (kpc enables it wherever the device has it)",
                self.device
            )
        }
    }

    /// Refuses `needs` unless everything it asks for is enabled.
    ///
    /// Errors: [`Error::Unsupported`] naming the first capability, extension or feature missing.
    pub(crate) fn check(&self, image: &str, needs: &ModuleNeeds) -> Result<()> {
        let known = needs
            .capabilities
            .iter()
            .map(|&cap| (format!("SPIR-V capability {cap:?}"), need(cap)));
        let newer = needs
            .newer_capabilities
            .iter()
            .map(|&cap| match newer_need(cap) {
                ("", n) => (format!("SPIR-V capability {cap}"), n),
                (name, n) => (format!("SPIR-V capability {name}"), n),
            });
        for (what, need) in known.chain(newer) {
            match need {
                Need::Nothing => {}
                Need::Feature(features) => {
                    if !features.iter().any(|f| self.has(f)) {
                        return Err(unsupported(image, what, self.missing(features)));
                    }
                }
                Need::Subgroup(flag, name) => {
                    if !self.subgroup_ops.contains(flag) {
                        return Err(unsupported(
                            image,
                            what,
                            format!(
                                "device {:?} does not support subgroup operation {name} in \
                                 compute shaders (it supports {:?})",
                                self.device, self.subgroup_ops
                            ),
                        ));
                    }
                }
                Need::Never => {
                    return Err(unsupported(
                        image,
                        what,
                        "kpc never enables the device feature it needs (it checks the \
                         capabilities of compute shaders over storage and uniform buffers)"
                            .into(),
                    ));
                }
            }
        }
        for ext in &needs.extensions {
            let what = format!("SPIR-V extension {ext}");
            match extension_ok(ext, self) {
                Some(true) => {}
                Some(false) => {
                    return Err(unsupported(
                        image,
                        what,
                        format!(
                            "device {:?} at Vulkan {} does not have it enabled",
                            self.device,
                            super::instance::version_string(self.api)
                        ),
                    ));
                }
                None => {
                    return Err(unsupported(
                        image,
                        what,
                        "kpc does not enable the device extension it needs".into(),
                    ));
                }
            }
        }
        if needs.subgroup_extended_types
            && !self
                .enabled
                .contains(VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES)
        {
            return Err(unsupported(
                image,
                "subgroup operations on 8-, 16- or 64-bit types".into(),
                self.missing(&["shaderSubgroupExtendedTypes"]),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(enabled: VulkanFeatures, borrowed: bool) -> ShaderCaps {
        ShaderCaps {
            enabled,
            api: vk::API_VERSION_1_2,
            subgroup_ops: vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC,
            device: "test".into(),
            borrowed,
        }
    }

    fn needs(caps: &[Capability], exts: &[&str], ext_types: bool) -> ModuleNeeds {
        ModuleNeeds {
            capabilities: caps.to_vec(),
            extensions: exts.iter().map(|s| s.to_string()).collect(),
            subgroup_extended_types: ext_types,
            newer_capabilities: Vec::new(),
        }
    }

    #[test]
    fn capabilities_need_their_features() {
        let none = caps(VulkanFeatures::default(), true);
        assert!(
            none.check("m", &needs(&[Capability::Shader], &[], false))
                .is_ok()
        );
        let fp16 = needs(
            &[Capability::Shader, Capability::StorageBuffer16BitAccess],
            &["SPV_KHR_16bit_storage"],
            false,
        );
        let e = none.check("m", &fp16).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS"),
            "{e}"
        );
        let on = caps(VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS, false);
        assert!(on.check("m", &fp16).is_ok());
        let never = needs(&[Capability::Geometry], &[], false);
        assert!(on.check("m", &never).is_err());
        let ext = needs(&[], &["SPV_NV_something"], false);
        assert!(on.check("m", &ext).is_err());
    }

    #[test]
    fn cooperative_matrix2_capabilities_need_their_features() {
        let mut cm2 = needs(
            &[Capability::CooperativeMatrixKHR],
            &["SPV_KHR_cooperative_matrix", "SPV_NV_cooperative_matrix2"],
            false,
        );
        cm2.newer_capabilities = vec![5430, 5432, 5439];
        let khr_only = caps(VulkanFeatures::COOPERATIVE_MATRIX, false);
        let e = khr_only.check("m", &cm2).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(
            e.to_string().contains("CooperativeMatrixReductionsNV"),
            "{e}"
        );
        let partial = caps(
            VulkanFeatures::COOPERATIVE_MATRIX
                | VulkanFeatures::COOP_MATRIX2_REDUCTIONS
                | VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS,
            true,
        );
        let e = partial.check("m", &cm2).unwrap_err();
        assert!(e.to_string().contains("TensorAddressingNV"), "{e}");
        assert!(
            e.to_string()
                .contains("VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING"),
            "{e}"
        );
        let full = caps(
            VulkanFeatures::COOPERATIVE_MATRIX
                | VulkanFeatures::COOP_MATRIX2_REDUCTIONS
                | VulkanFeatures::COOP_MATRIX2_PER_ELEMENT_OPERATIONS
                | VulkanFeatures::COOP_MATRIX2_TENSOR_ADDRESSING,
            false,
        );
        assert!(full.check("m", &cm2).is_ok());
        // Block loads (5434) are never enabled.
        cm2.newer_capabilities.push(5434);
        let e = full.check("m", &cm2).unwrap_err();
        assert!(e.to_string().contains("5434"), "{e}");
    }

    #[test]
    fn subgroup_operations_and_extended_types() {
        let c = caps(VulkanFeatures::default(), false);
        let arith = needs(&[Capability::GroupNonUniformArithmetic], &[], false);
        assert!(c.check("m", &arith).is_ok());
        let clustered = needs(&[Capability::GroupNonUniformClustered], &[], false);
        let e = c.check("m", &clustered).unwrap_err();
        assert!(e.to_string().contains("CLUSTERED"), "{e}");
        let f16 = needs(&[Capability::GroupNonUniformArithmetic], &[], true);
        let e = c.check("m", &f16).unwrap_err();
        assert!(e.to_string().contains("shaderSubgroupExtendedTypes"), "{e}");
        let with = caps(VulkanFeatures::SHADER_SUBGROUP_EXTENDED_TYPES, false);
        assert!(with.check("m", &f16).is_ok());
    }
}
