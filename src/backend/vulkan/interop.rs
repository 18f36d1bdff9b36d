//! Interop: a Vulkan backend over handles the embedder owns (instance, physical device, device,
//! queue), and the raw handles of kpc's kernels for the embedder's own command buffers.
//!
//! Vulkan cannot be asked which optional features or extensions a device was created with, so the
//! embedder declares them ([`VulkanFeatures`]). kpc checks each declaration against what the device
//! supports, uses only what is declared, and refuses a kernel whose SPIR-V needs an undeclared
//! feature with a typed error before the driver sees it.

use std::sync::Arc;

use ash::vk;
use rspirv::spirv::Capability;

use crate::backend::DeviceType;
use crate::config::{BackendKind, Config, TraceFlags};
use crate::error::{Error, Result};

use super::device::{BufferPlace, Device, Recycled, vk_err};
use super::instance::{MAX_API, PhysicalDevice, VkInstance, describe, version_string};
use super::pipeline_cache::CacheIdentity;
use super::program::VulkanKernel;
use super::queue_lock::VulkanQueueLock;
use super::submit::Submitter;
use super::{Counters, VulkanBackend};

/// Handles the embedder owns. kpc borrows them for the life of the context and of every object made
/// from it (kernels, buffers, events), and never destroys them.
#[derive(Debug, Clone, Copy)]
pub struct VulkanHandles {
    /// The `vkGetInstanceProcAddr` that `instance` was created through (the loader's, or a layer's).
    pub get_instance_proc_addr: vk::PFN_vkGetInstanceProcAddr,
    /// The instance.
    pub instance: vk::Instance,
    /// The `apiVersion` the instance was created with (`VkApplicationInfo::apiVersion`); 1.1 or later.
    pub instance_api_version: u32,
    /// The physical device `device` was created from; one of `instance`'s.
    pub physical_device: vk::PhysicalDevice,
    /// The device.
    pub device: vk::Device,
    /// The family of `queue`; it must support compute.
    pub queue_family_index: u32,
    /// The queue kpc submits its own work to (see [`VulkanBackend::from_handles`] on sharing it).
    pub queue: vk::Queue,
    /// The optional features and extensions enabled on `device` (default: none).
    pub enabled: VulkanFeatures,
    /// The engine's own lock over `queue`, where it shares the queue with kpc: kpc takes it around
    /// each of its queue calls, so the engine serializes its submissions on it and needs no other
    /// coordination (see [`VulkanQueueLock`]). `None`: the engine keeps its own use of the queue
    /// apart from kpc's submitting calls itself (see `kpc::runtime::interop`).
    pub queue_lock: Option<VulkanQueueLock>,
}

/// Optional features and extensions the embedder enabled on its device. Every field defaults to
/// `false`: kpc then uses no optional feature, and kernels that need one are refused with
/// [`Error::Build`]. A field set for something the device does not support is refused with
/// [`Error::InvalidArgument`] (it cannot have been enabled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VulkanFeatures {
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
}

/// The raw handles of one kpc kernel, for recording a dispatch in the embedder's own command buffer.
///
/// Lifetime: they belong to kpc and stay valid while the [`crate::Kernel`] they came from (or any
/// clone of it) is alive, also after the context evicted it from memory or was dropped: the kernel
/// holds the pipeline, its layouts and the device by reference count. Keep a clone of the kernel
/// until every command buffer recorded with them has finished executing; never destroy them.
#[derive(Debug, Clone)]
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

impl VulkanKernel {
    /// Its raw handles (see [`VulkanKernelHandles`] for how long they stay valid). Made once per
    /// kernel: later calls allocate nothing.
    pub fn handles(&self) -> &VulkanKernelHandles {
        self.handles.get_or_init(|| {
            let p = &self.pipeline;
            let push = p.info.push_constant_bytes;
            VulkanKernelHandles {
                pipeline: p.raw,
                pipeline_layout: p.layout,
                descriptor_set_layouts: vec![p.set_layout],
                bindings: p
                    .info
                    .buffers
                    .iter()
                    .zip(&p.descriptor_types)
                    .map(|(b, t)| (b.binding, *t))
                    .collect(),
                push_constant_range: (push > 0).then_some(vk::PushConstantRange {
                    stage_flags: vk::ShaderStageFlags::COMPUTE,
                    offset: 0,
                    size: push,
                }),
                local_size: p.info.local_size,
            }
        })
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

impl VulkanBackend {
    /// A backend over the embedder's Vulkan objects, which kpc borrows and never destroys.
    ///
    /// What kpc needs: an instance and a device of Vulkan 1.1 or later, and a queue of a family with
    /// compute. No optional feature or extension is required; kpc uses those `handles.enabled`
    /// declares, the same ones it enables on a device it opens itself, and refuses a kernel whose
    /// SPIR-V needs an undeclared one ([`Error::Build`], before the driver sees it).
    ///
    /// What kpc owns and destroys: only objects it creates on the device (its command pool, fences,
    /// descriptor and query pools, buffers, pipeline caches, pipelines and their layouts); they go
    /// when the last kpc object using them is dropped. The instance and device are never destroyed,
    /// and kpc never calls vkDeviceWaitIdle on them.
    ///
    /// The device fingerprint is computed by the same code as discovery's, so binaries built by an
    /// owned context on the same device and driver are disk and blob hits here, and the other way
    /// round, whatever `instance_api_version` the embedder's instance has: where a device without
    /// VK_KHR_driver_properties cannot name its driver through a 1.1 instance, kpc reads the
    /// fingerprint through its own instance, or refuses the handles rather than split the cache.
    ///
    /// External synchronization: kpc submits to `handles.queue` (vkQueueSubmit) only inside its
    /// own calls that run work (launches, buffer reads and writes), under one lock per queue that
    /// every kpc context over that queue shares, so contexts never submit at once. Between kpc and
    /// the engine: with `handles.queue_lock` kpc also takes the engine's lock around each submit,
    /// and the engine serializes on it; without, the engine must not use that queue
    /// (vkQueueSubmit, vkQueueWaitIdle, ...) at the same time as such a kpc call, or passes a
    /// queue kpc alone uses. Everything else kpc calls on the device is free of external
    /// synchronization or on kpc's own objects. See `kpc::runtime::interop` for which calls
    /// submit.
    ///
    /// Errors: [`Error::InvalidArgument`] for a null handle, an instance API version below 1.1, a
    /// physical device that is not the instance's, a queue family without compute, or a declared
    /// feature the device does not support; [`Error::Unavailable`] for a device below Vulkan 1.1.
    ///
    /// # Safety
    /// `get_instance_proc_addr` is the entry point `instance` was created through; `instance`,
    /// `physical_device`, `device` and `queue` are valid, belong together (the device was created
    /// from that physical device with a queue of `queue_family_index`, and `queue` is one of them)
    /// and stay valid until every kpc object made from the returned backend is dropped; the
    /// features and extensions `enabled` declares were enabled when the device was created.
    pub unsafe fn from_handles(handles: &VulkanHandles, config: &Config) -> Result<VulkanBackend> {
        let h = handles;
        if h.instance == vk::Instance::null()
            || h.physical_device == vk::PhysicalDevice::null()
            || h.device == vk::Device::null()
            || h.queue == vk::Queue::null()
        {
            return Err(invalid(
                "Vulkan interop needs non-null instance, physical device, device and queue handles"
                    .into(),
            ));
        }
        if vk::api_version_variant(h.instance_api_version) != 0
            || vk::api_version_major(h.instance_api_version) != 1
        {
            return Err(invalid(format!(
                "instance_api_version {:#x} is not a Vulkan 1.x version as VK_MAKE_API_VERSION \
                 makes it (expected VkApplicationInfo::apiVersion, e.g. VK_API_VERSION_1_3)",
                h.instance_api_version
            )));
        }
        if h.instance_api_version < vk::API_VERSION_1_1 {
            return Err(invalid(format!(
                "the instance's API version is {}; kpc needs Vulkan 1.1 or later",
                version_string(h.instance_api_version)
            )));
        }
        // SAFETY: the caller guarantees that this is the entry point the instance was created
        // through, valid for as long as the backend lives.
        let entry = unsafe {
            ash::Entry::from_static_fn(ash::StaticFn {
                get_instance_proc_addr: h.get_instance_proc_addr,
            })
        };
        // SAFETY: `instance` is a live instance made through `entry` (caller's guarantee).
        let raw = unsafe { ash::Instance::load(entry.static_fn(), h.instance) };
        let instance = Arc::new(VkInstance {
            entry,
            raw,
            api_version: h.instance_api_version.min(MAX_API),
        });
        // SAFETY: the instance is alive; enumeration needs no external synchronization.
        let all = unsafe { instance.raw.enumerate_physical_devices() }
            .map_err(|e| vk_err("vkEnumeratePhysicalDevices", e))?;
        let index = all
            .iter()
            .position(|&p| p == h.physical_device)
            .ok_or_else(|| {
                invalid(format!(
                    "the physical device is not one of the instance's {} devices",
                    all.len()
                ))
            })?;
        let mut pd = describe(&instance, index, h.physical_device)?;
        if instance.api_version < vk::API_VERSION_1_2 {
            super::instance::normalize_fingerprint(&mut pd, instance.api_version)?;
        }
        if pd.api_version < vk::API_VERSION_1_1 {
            return Err(super::instance::unavailable(format!(
                "device {:?} supports Vulkan {} only; kpc needs 1.1",
                pd.info.name,
                version_string(pd.api_version)
            )));
        }
        // SAFETY: `pd.raw` belongs to this live instance.
        let families = unsafe {
            instance
                .raw
                .get_physical_device_queue_family_properties(pd.raw)
        };
        let family = families
            .get(h.queue_family_index as usize)
            .filter(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| {
                invalid(format!(
                    "queue family {} of {:?} does not exist or has no compute (the device has {} \
                     families)",
                    h.queue_family_index,
                    pd.info.name,
                    families.len()
                ))
            })?;
        let api = pd.api_version.min(instance.api_version);
        let f = h.enabled;
        check_declared(&instance, &pd, api, &f)?;

        // SAFETY: `device` is a live device of this instance (caller's guarantee); its entry
        // points are loaded through the instance's vkGetDeviceProcAddr.
        let raw = unsafe { ash::Device::load(instance.raw.fp_v1_0(), h.device) };
        // SAFETY: `pd.raw` belongs to this live instance.
        let memory = unsafe { instance.raw.get_physical_device_memory_properties(pd.raw) };
        let executable_stats = f
            .pipeline_executable_info
            .then(|| ash::khr::pipeline_executable_properties::Device::new(&instance.raw, &raw));
        let mut info = pd.info.clone();
        let l = &mut info.limits;
        l.storage_16bit = f.storage_buffer_16bit_access;
        l.float16_arithmetic = f.shader_float16;
        l.cooperative_matrix_f16 = l.cooperative_matrix_f16
            && f.cooperative_matrix
            && f.vulkan_memory_model
            && f.shader_float16
            && f.storage_buffer_16bit_access;
        l.timestamps = family.timestamp_valid_bits > 0 && pd.limits.timestamp_period > 0.0;
        info.unusable = None;
        let dev = Arc::new(Device {
            _instance: instance.clone(),
            physical: pd.raw,
            raw,
            queue_family: h.queue_family_index,
            queue: h.queue,
            memory,
            limits: pd.limits,
            api_version: api,
            timestamp_valid_bits: family.timestamp_valid_bits,
            host_query_reset: f.host_query_reset,
            feedback: api >= vk::API_VERSION_1_3 || f.pipeline_creation_feedback,
            spirv_1_4_ext: f.spirv_1_4,
            executable_stats,
            identity: CacheIdentity {
                vendor_id: pd.vendor_id,
                device_id: pd.device_id,
                uuid: pd.pipeline_cache_uuid,
            },
            recycled: parking_lot::Mutex::new(Recycled::default()),
            borrowed: Some(f),
        });
        let place = match info.device_type {
            DeviceType::Cpu => BufferPlace::HostVisible,
            _ => BufferPlace::DeviceLocal,
        };
        Ok(VulkanBackend {
            submitter: Submitter::new(&dev, h.queue_lock)?,
            staging: parking_lot::Mutex::new(None),
            dev,
            info,
            place,
            trace: config.trace.contains(TraceFlags::BUILDS),
            counters: Counters::default(),
        })
    }
}

fn has_extension(exts: &[vk::ExtensionProperties], name: &std::ffi::CStr) -> bool {
    exts.iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

/// Refuses a declared feature the device does not support: it cannot have been enabled, so the
/// declaration is wrong, and believing it would hand the driver SPIR-V it may not accept.
fn check_declared(
    instance: &VkInstance,
    pd: &PhysicalDevice,
    api: u32,
    f: &VulkanFeatures,
) -> Result<()> {
    let inst = &instance.raw;
    // SAFETY: `pd.raw` belongs to this live instance.
    let exts = unsafe { inst.enumerate_device_extension_properties(pd.raw) }
        .map_err(|e| vk_err("vkEnumerateDeviceExtensionProperties", e))?;
    let v12 = api >= vk::API_VERSION_1_2;
    let coop_ext = has_extension(&exts, vk::KHR_COOPERATIVE_MATRIX_NAME);
    let stats_ext = has_extension(&exts, vk::KHR_PIPELINE_EXECUTABLE_PROPERTIES_NAME);
    let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut s8 = vk::PhysicalDevice8BitStorageFeatures::default();
    let mut hqr = vk::PhysicalDeviceHostQueryResetFeatures::default();
    let mut mm = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut s16);
    if v12 {
        f2 = f2
            .push_next(&mut f16)
            .push_next(&mut s8)
            .push_next(&mut hqr)
            .push_next(&mut mm);
    }
    if coop_ext {
        f2 = f2.push_next(&mut coop);
    }
    if stats_ext {
        f2 = f2.push_next(&mut stats);
    }
    // SAFETY: the chain lives across the call; instance and device are 1.1+ (checked), and the
    // extension structs are chained only where the device lists their extensions.
    unsafe { inst.get_physical_device_features2(pd.raw, &mut f2) };
    let core = f2.features;
    let on = |b: vk::Bool32| b == vk::TRUE;
    let checks = [
        ("shader_int16", f.shader_int16, on(core.shader_int16)),
        ("shader_int64", f.shader_int64, on(core.shader_int64)),
        ("shader_float64", f.shader_float64, on(core.shader_float64)),
        (
            "storage_buffer_16bit_access",
            f.storage_buffer_16bit_access,
            on(s16.storage_buffer16_bit_access),
        ),
        (
            "uniform_and_storage_buffer_16bit_access",
            f.uniform_and_storage_buffer_16bit_access,
            on(s16.uniform_and_storage_buffer16_bit_access),
        ),
        (
            "storage_push_constant16",
            f.storage_push_constant16,
            on(s16.storage_push_constant16),
        ),
        (
            "shader_float16",
            f.shader_float16,
            v12 && on(f16.shader_float16),
        ),
        ("shader_int8", f.shader_int8, v12 && on(f16.shader_int8)),
        (
            "storage_buffer_8bit_access",
            f.storage_buffer_8bit_access,
            v12 && on(s8.storage_buffer8_bit_access),
        ),
        (
            "uniform_and_storage_buffer_8bit_access",
            f.uniform_and_storage_buffer_8bit_access,
            v12 && on(s8.uniform_and_storage_buffer8_bit_access),
        ),
        (
            "host_query_reset",
            f.host_query_reset,
            v12 && on(hqr.host_query_reset),
        ),
        (
            "vulkan_memory_model",
            f.vulkan_memory_model,
            v12 && on(mm.vulkan_memory_model),
        ),
        (
            "cooperative_matrix",
            f.cooperative_matrix,
            coop_ext && on(coop.cooperative_matrix),
        ),
        (
            "pipeline_creation_feedback",
            f.pipeline_creation_feedback,
            pd.feedback,
        ),
        ("spirv_1_4", f.spirv_1_4, pd.spirv_1_4_ext || v12),
        (
            "pipeline_executable_info",
            f.pipeline_executable_info,
            stats_ext && on(stats.pipeline_executable_info),
        ),
    ];
    match checks.iter().find(|(_, declared, ok)| *declared && !ok) {
        None => Ok(()),
        Some((name, ..)) => Err(invalid(format!(
            "VulkanFeatures::{name} is declared enabled, but device {:?} at API {} does not \
             support it, so it cannot have been",
            pd.info.name,
            version_string(api)
        ))),
    }
}

/// The optional feature (a [`VulkanFeatures`] field) that a SPIR-V capability needs, where it
/// needs one; `Err` names capabilities kpc never enables, which no interop device may use either.
fn feature_for(cap: Capability, f: &VulkanFeatures) -> Result<Option<(&'static str, bool)>, ()> {
    Ok(Some(match cap {
        Capability::Int16 => ("shader_int16", f.shader_int16),
        Capability::Int64 => ("shader_int64", f.shader_int64),
        Capability::Float64 => ("shader_float64", f.shader_float64),
        Capability::Float16 => ("shader_float16", f.shader_float16),
        Capability::Int8 => ("shader_int8", f.shader_int8),
        Capability::StorageBuffer16BitAccess => {
            ("storage_buffer_16bit_access", f.storage_buffer_16bit_access)
        }
        Capability::UniformAndStorageBuffer16BitAccess => (
            "uniform_and_storage_buffer_16bit_access",
            f.uniform_and_storage_buffer_16bit_access,
        ),
        Capability::StoragePushConstant16 => ("storage_push_constant16", f.storage_push_constant16),
        Capability::StorageBuffer8BitAccess => {
            ("storage_buffer_8bit_access", f.storage_buffer_8bit_access)
        }
        Capability::UniformAndStorageBuffer8BitAccess => (
            "uniform_and_storage_buffer_8bit_access",
            f.uniform_and_storage_buffer_8bit_access,
        ),
        Capability::VulkanMemoryModel => ("vulkan_memory_model", f.vulkan_memory_model),
        Capability::CooperativeMatrixKHR => ("cooperative_matrix", f.cooperative_matrix),
        Capability::Int64Atomics
        | Capability::StoragePushConstant8
        | Capability::StorageInputOutput16
        | Capability::VulkanMemoryModelDeviceScope => return Err(()),
        _ => return Ok(None),
    }))
}

/// Refuses a module (on an embedder's device) that declares a capability whose optional feature
/// the embedder did not declare enabled: creating a shader module from it would be undefined
/// behaviour. Capabilities of core Vulkan 1.1 compute (Shader, the subgroup ones) need nothing.
pub(crate) fn check_capabilities(f: &VulkanFeatures, image: &str, words: &[u32]) -> Result<()> {
    const OP_CAPABILITY: u32 = 17;
    const OP_EXTENSION: u32 = 10;
    let refuse = |message: String| Error::Build {
        backend: BackendKind::Vulkan,
        image: image.to_string(),
        code: vk::Result::ERROR_FEATURE_NOT_PRESENT.as_raw(),
        message,
        log: String::new(),
    };
    // Capabilities come first in a module (its logical layout), each followed by nothing but more
    // capabilities and extensions.
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let op = words[at] & 0xffff;
        if count == 0 || at + count > words.len() || (op != OP_CAPABILITY && op != OP_EXTENSION) {
            break;
        }
        if op == OP_CAPABILITY && count >= 2 {
            let Some(cap) = Capability::from_u32(words[at + 1]) else {
                return Err(refuse(format!(
                    "the module declares SPIR-V capability {} that kpc does not know; on an \
                     embedder's device kpc builds only what it can check",
                    words[at + 1]
                )));
            };
            match feature_for(cap, f) {
                Ok(Some((_, true)) | None) => {}
                Ok(Some((name, false))) => {
                    return Err(refuse(format!(
                        "the module needs SPIR-V capability {cap:?}, whose device feature the \
                         embedder did not declare enabled (VulkanFeatures::{name})"
                    )));
                }
                Err(()) => {
                    return Err(refuse(format!(
                        "the module needs SPIR-V capability {cap:?}, whose device feature kpc \
                         never enables"
                    )));
                }
            }
        }
        at += count;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(caps: &[u32]) -> Vec<u32> {
        let mut w = vec![0x0723_0203, 0x0001_0000, 0, 100, 0];
        for &c in caps {
            w.push((2 << 16) | 17);
            w.push(c);
        }
        // OpMemoryModel Logical GLSL450 ends the capability section.
        w.extend_from_slice(&[(3 << 16) | 14, 0, 1]);
        w
    }

    #[test]
    fn capabilities_need_their_declared_features() {
        let none = VulkanFeatures::default();
        assert!(check_capabilities(&none, "m", &module(&[Capability::Shader as u32])).is_ok());
        let fp16 = module(&[
            Capability::Shader as u32,
            Capability::StorageBuffer16BitAccess as u32,
        ]);
        let e = check_capabilities(&none, "m", &fp16).unwrap_err();
        assert!(e.to_string().contains("storage_buffer_16bit_access"), "{e}");
        let on = VulkanFeatures {
            storage_buffer_16bit_access: true,
            ..VulkanFeatures::default()
        };
        assert!(check_capabilities(&on, "m", &fp16).is_ok());
        let never = module(&[Capability::Int64Atomics as u32]);
        assert!(check_capabilities(&on, "m", &never).is_err());
        assert!(check_capabilities(&on, "m", &module(&[999_999])).is_err());
    }
}
