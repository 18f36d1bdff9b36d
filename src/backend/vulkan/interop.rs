//! Interop: a Vulkan backend over handles the embedder owns (instance, physical device, device,
//! queue), and the raw handles of kpc's kernels for the embedder's own command buffers.
//!
//! Vulkan cannot be asked which optional features or extensions a device was created with, so the
//! embedder declares them ([`VulkanFeatures`]). kpc checks each declaration against what the device
//! supports, uses only what is declared, and refuses a kernel whose SPIR-V needs an undeclared
//! feature with a typed error before the driver sees it (`capability_check.rs`, as on its own
//! devices).

use std::sync::Arc;

use ash::vk;

use crate::backend::DeviceType;
use crate::config::{Config, TraceFlags};
use crate::error::{Error, Result};

use super::capability_check::ShaderCaps;
use super::device::{BufferPlace, Device, Recycled, vk_err};
use super::features::VulkanFeatures;
use super::instance::{MAX_API, VkInstance, describe, version_string};
use super::kernel_handles::VulkanKernelHandles;
use super::pipeline_cache::CacheIdentity;
use super::program::VulkanKernel;
use super::queue_lock::VulkanQueueLock;
use super::submit::Submitter;
use super::{Counters, VulkanBackend};

/// Handles the embedder owns. kpc borrows them for the life of the context and of every object made
/// from it (kernels, buffers, events), and never destroys them.
///
/// Exhaustive on purpose: every field is something only the embedder knows, so a field added in a
/// later version must fail to compile where it is not filled in, rather than take a default.
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
    /// apart from kpc's submitting calls itself (see `kpc::interop`).
    pub queue_lock: Option<VulkanQueueLock>,
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
    /// SPIR-V needs an undeclared one ([`Error::Unsupported`], before the driver sees it).
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
    /// synchronization or on kpc's own objects. See `kpc::interop` for which calls
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
        check_declared(&f, &pd.supported, &pd.info.name, api)?;

        // SAFETY: `device` is a live device of this instance (caller's guarantee); its entry
        // points are loaded through the instance's vkGetDeviceProcAddr.
        let raw = unsafe { ash::Device::load(instance.raw.fp_v1_0(), h.device) };
        // SAFETY: `pd.raw` belongs to this live instance.
        let memory = unsafe { instance.raw.get_physical_device_memory_properties(pd.raw) };
        let executable_stats = f
            .contains(VulkanFeatures::PIPELINE_EXECUTABLE_INFO)
            .then(|| ash::khr::pipeline_executable_properties::Device::new(&instance.raw, &raw));
        // The embedder's declaration decides, as for every optional feature; `off` still wins.
        let pipeline_binary = (f.contains(VulkanFeatures::PIPELINE_BINARY)
            && super::pipeline_binary::mode_from_env()? != super::pipeline_binary::Mode::Off)
            .then(|| super::pipeline_binary::BinaryPath::open(&instance.raw, &raw, &pd.info.name))
            .flatten();
        let mut info = pd.info.clone();
        info.fingerprint = super::pipeline_binary::fingerprint_for(
            &info.fingerprint,
            pipeline_binary.as_ref().map(|p| p.global_key.as_slice()),
        );
        // The embedder's device is robust exactly when it says so (a declaration kpc checked
        // against what the device supports above).
        let robust = u8::from(f.contains(VulkanFeatures::ROBUST_BUFFER_ACCESS)).to_string();
        let mut fields = info.fingerprint.fields.clone();
        for (k, v) in &mut fields {
            if k == super::features::ROBUST_FIELD {
                v.clone_from(&robust);
            }
        }
        info.fingerprint = crate::backend::DeviceFingerprint::new(info.fingerprint.backend, fields);
        let l = &mut info.limits;
        l.robust_buffer_access = f.contains(VulkanFeatures::ROBUST_BUFFER_ACCESS);
        l.storage_16bit = f.contains(VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS);
        l.float16_arithmetic = f.contains(VulkanFeatures::SHADER_FLOAT16);
        l.cooperative_matrix_f16 = l.cooperative_matrix_f16
            && f.contains(VulkanFeatures::COOPERATIVE_MATRIX)
            && f.contains(VulkanFeatures::VULKAN_MEMORY_MODEL)
            && f.contains(VulkanFeatures::SHADER_FLOAT16)
            && f.contains(VulkanFeatures::STORAGE_BUFFER_16BIT_ACCESS);
        l.cooperative_matrix_f16_acc &= l.cooperative_matrix_f16;
        if !l.cooperative_matrix_f16 || !f.all_coop_matrix2() {
            l.cooperative_matrix2_workgroup = 0;
        }
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
            host_query_reset: f.contains(VulkanFeatures::HOST_QUERY_RESET),
            feedback: api >= vk::API_VERSION_1_3
                || f.contains(VulkanFeatures::PIPELINE_CREATION_FEEDBACK),
            spirv_1_4_ext: f.contains(VulkanFeatures::SPIRV_1_4),
            caps: ShaderCaps {
                enabled: f,
                api,
                subgroup_ops: pd.subgroup_ops,
                device: pd.info.name.clone(),
                borrowed: true,
            },
            executable_stats,
            pipeline_binary,
            shared_layouts: Default::default(),
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

/// Refuses an embedder's declaration of a feature the device does not support: it cannot have been
/// enabled, so the declaration is wrong, and believing it would hand the driver SPIR-V it may not
/// accept.
fn check_declared(
    declared: &VulkanFeatures,
    supported: &VulkanFeatures,
    device: &str,
    api: u32,
) -> Result<()> {
    let bad = declared
        .difference(*supported)
        .iter_names()
        .next()
        .map(|(name, _)| name);
    match bad {
        None => Ok(()),
        Some(name) => Err(Error::InvalidArgument(format!(
            "VulkanFeatures::{name} is declared enabled, but device {device:?} at API {} does not \
             support it, so it cannot have been",
            version_string(api)
        ))),
    }
}
