//! The logical device every Vulkan object of one backend hangs off, its memory, and buffers.

use std::sync::Arc;

use ash::vk;

use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::capability_check::ShaderCaps;
use super::features::VulkanFeatures;
use super::instance::{PhysicalDevice, VkInstance};
use super::pipeline_cache::CacheIdentity;

pub(crate) use super::vk_error::vk_err;

/// One VkDevice with its compute queue. Shared (`Arc`) by every object made on it, so it is released
/// only after all of them; released, it is kept for the next context rather than destroyed (see
/// [`IDLE_DEVICES`]).
pub(crate) struct Device {
    pub(crate) _instance: Arc<VkInstance>,
    /// The physical device it was created on: where it goes back to when dropped.
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) raw: ash::Device,
    pub(crate) queue_family: u32,
    pub(crate) queue: vk::Queue,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    pub(crate) limits: vk::PhysicalDeviceLimits,
    pub(crate) api_version: u32,
    pub(crate) timestamp_valid_bits: u32,
    /// Whether timestamp pools are reset from the host (`hostQueryReset`, core in Vulkan 1.2)
    /// rather than by a command in each batch: the command cost about 4 µs of device time per
    /// submission on an H200 (BENCHMARKS.md, issue 7).
    pub(crate) host_query_reset: bool,
    pub(crate) feedback: bool,
    pub(crate) spirv_1_4_ext: bool,
    /// The layouts kpc's pipelines share on this device (`layouts.rs`).
    pub(crate) shared_layouts: super::layouts::SharedLayouts,
    /// VK_KHR_pipeline_binary where kpc persists pipeline binaries on this device; `None`:
    /// pipeline-cache data.
    pub(crate) pipeline_binary: Option<super::pipeline_binary::BinaryPath>,
    /// Where the driver reports statistics about compiled kernels: its entry points.
    pub(crate) executable_stats: Option<ash::khr::pipeline_executable_properties::Device>,
    pub(crate) identity: CacheIdentity,
    /// Per-batch objects of finished batches, kept for the next ones (see [`Recycled`]).
    pub(crate) recycled: parking_lot::Mutex<Recycled>,
    /// What shaders are checked against before they reach the driver (`capability_check.rs`).
    pub(crate) caps: ShaderCaps,
    /// `Some` for an embedder's device (interop): the optional features it says it enabled. kpc
    /// never waits on, keeps for reuse or destroys a borrowed device; it destroys only its own
    /// objects on it.
    pub(crate) borrowed: Option<VulkanFeatures>,
}

/// Fences, timestamp pools and descriptor pools of finished batches, reset and kept for reuse:
/// creating them for every batch cost hundreds of microseconds per submission on NVIDIA's driver,
/// more than a decode step's kernels. Pools of the standard sizes below are kept; a batch that
/// needs more gets its own, destroyed with it.
#[derive(Default)]
pub(crate) struct Recycled {
    pub(crate) fences: Vec<vk::Fence>,
    pub(crate) query_pools: Vec<vk::QueryPool>,
    pub(crate) descriptor_pools: Vec<vk::DescriptorPool>,
}

impl Recycled {
    /// Most objects of each kind kept; more are destroyed.
    pub(crate) const KEEP: usize = 256;
    /// Launches a kept timestamp pool can time (two queries each).
    pub(crate) const QUERY_LAUNCHES: u32 = 16;
    /// Sets, storage and uniform descriptors a kept descriptor pool holds.
    pub(crate) const SETS: u32 = 16;
    pub(crate) const STORAGE: u32 = 256;
    pub(crate) const UNIFORM: u32 = 32;
}

/// A VkDevice whose last user was dropped, with its queue and the spare per-batch objects it had.
struct IdleDevice {
    physical: vk::PhysicalDevice,
    /// Whether it was created with robustBufferAccess (`KPC_VULKAN_ROBUST_ACCESS`).
    robust: bool,
    raw: ash::Device,
    queue: vk::Queue,
    recycled: Recycled,
}

/// VkDevices kpc created and no context uses any more, kept for the next context on the same
/// physical device instead of destroyed: kpc never calls vkDestroyDevice.
///
/// Why: NVIDIA's driver 580.159.04 deadlocks in vkDestroyDevice when other threads are inside the
/// driver on other devices at the same time (issue 21: the destroying thread waits inside the
/// driver while every other thread, kpc's and the driver's own, waits on a driver-wide lock; seen in
/// 9 of 9 runs of tests/vulkan_kernels.rs with 16 test threads on an H100, also with
/// vkCreateDevice/vkDestroyDevice serialized process-wide). No lock of kpc's can keep the driver's own
/// threads out, so kpc does not destroy devices at all. The pool holds at most as many devices per
/// physical device as contexts were ever open on it at once; each is an idle queue and its spare
/// fences and pools, and the process's exit releases them. Reuse also saves a vkCreateDevice per
/// context open.
static IDLE_DEVICES: parking_lot::Mutex<Vec<IdleDevice>> = parking_lot::Mutex::new(Vec::new());

static DEVICES_CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many VkDevices kpc has created in this process (each context open either creates one or
/// reuses one a dropped context left; see `Device`). For tests and diagnostics.
pub fn devices_created() -> u64 {
    DEVICES_CREATED.load(std::sync::atomic::Ordering::Relaxed)
}

impl Device {
    /// Opens `pd` with one compute queue and every optional feature of [`VulkanFeatures`] the
    /// device has (16- and 8-bit storage, fp16 and int8 arithmetic, 64-bit integers and floats,
    /// subgroup extended types, cooperative matrices, the Vulkan memory model, ...).
    pub(crate) fn open(instance: Arc<VkInstance>, pd: &PhysicalDevice) -> Result<Device> {
        let inst = &instance.raw;
        let queue_family = pd
            .queue_family
            .ok_or_else(|| super::instance::unavailable("the device has no compute queue"))?;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];

        // Every optional feature kpc checks shaders for is enabled wherever the device has it, so
        // that a shader the device can run is never refused, and one it cannot is refused by
        // `capability_check` rather than reaching the driver.
        let api = pd.api_version.min(instance.api_version);
        let mut enabled = pd.supported;
        enabled.set(VulkanFeatures::PIPELINE_BINARY, pd.pipeline_binaries);
        if !super::features::robust_access_from_env()? {
            enabled.remove(VulkanFeatures::ROBUST_BUFFER_ACCESS);
        }
        let host_query_reset = enabled.contains(VulkanFeatures::HOST_QUERY_RESET);
        let robust = enabled.contains(VulkanFeatures::ROBUST_BUFFER_ACCESS);
        let idle = {
            let mut idle = IDLE_DEVICES.lock();
            let found = idle
                .iter()
                .position(|d| d.physical == pd.raw && d.robust == robust);
            found.map(|i| idle.swap_remove(i))
        };
        // A kept device was created from this same physical device with these same features (every
        // choice above depends on the physical device and the robustness setting alone), so it is
        // what a new one would be.
        let (raw, queue, recycled) = match idle {
            Some(d) => (d.raw, d.queue, d.recycled),
            None => {
                let created = {
                    let _serial = super::instance::DEVICE_LIFECYCLE.lock();
                    super::features::create_device(inst, pd.raw, &queues, &enabled, api)
                };
                let raw = created.map_err(|e| {
                    super::instance::unavailable(format!("vkCreateDevice failed: {e}"))
                })?;
                DEVICES_CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // SAFETY: queue 0 of `queue_family` was requested in `info`.
                let queue = unsafe { raw.get_device_queue(queue_family, 0) };
                (raw, queue, Recycled::default())
            }
        };
        // SAFETY: `pd.raw` belongs to this live instance.
        let memory = unsafe { inst.get_physical_device_memory_properties(pd.raw) };
        let executable_stats = pd
            .executable_stats
            .then(|| ash::khr::pipeline_executable_properties::Device::new(inst, &raw));
        let pipeline_binary = if enabled.contains(VulkanFeatures::PIPELINE_BINARY) {
            super::pipeline_binary::BinaryPath::open(inst, &raw, &pd.info.name)
        } else {
            None
        };
        Ok(Device {
            _instance: instance.clone(),
            physical: pd.raw,
            raw,
            queue_family,
            queue,
            memory,
            limits: pd.limits,
            api_version: pd.api_version,
            timestamp_valid_bits: pd.timestamp_valid_bits,
            host_query_reset,
            feedback: pd.feedback,
            spirv_1_4_ext: pd.spirv_1_4_ext,
            caps: ShaderCaps {
                enabled,
                api,
                subgroup_ops: pd.subgroup_ops,
                device: pd.info.name.clone(),
                borrowed: false,
            },
            executable_stats,
            pipeline_binary,
            shared_layouts: Default::default(),
            identity: CacheIdentity {
                vendor_id: pd.vendor_id,
                device_id: pd.device_id,
                uuid: pd.pipeline_cache_uuid,
            },
            recycled: parking_lot::Mutex::new(recycled),
            borrowed: None,
        })
    }

    /// A memory type allowed by `type_bits` with all of `required`, preferring one that also has
    /// `preferred`.
    fn memory_type(
        &self,
        type_bits: u32,
        required: vk::MemoryPropertyFlags,
        preferred: vk::MemoryPropertyFlags,
    ) -> Option<u32> {
        let types = &self.memory.memory_types[..self.memory.memory_type_count as usize];
        let ok = |i: usize, flags: vk::MemoryPropertyFlags| {
            type_bits & (1 << i) != 0 && types[i].property_flags.contains(flags)
        };
        (0..types.len())
            .find(|&i| ok(i, required | preferred))
            .or_else(|| (0..types.len()).find(|&i| ok(i, required)))
            .map(|i| i as u32)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.borrowed.is_some() {
            // An embedder's device is neither waited on (vkDeviceWaitIdle would need every queue,
            // the embedder's too, externally synchronized), nor kept for reuse, nor destroyed: it
            // is not kpc's. Every batch kpc submitted held an Arc to this device and waited for its
            // fence when it went, so kpc's spare objects are idle; only they are destroyed.
            self.shared_layouts.destroy(&self.raw);
            let r = self.recycled.get_mut();
            // SAFETY: as above: no submitted work uses them; the device is alive (the embedder's
            // contract keeps it so until every kpc object over it is gone).
            unsafe {
                for f in r.fences.drain(..) {
                    self.raw.destroy_fence(f, None);
                }
                for q in r.query_pools.drain(..) {
                    self.raw.destroy_query_pool(q, None);
                }
                for p in r.descriptor_pools.drain(..) {
                    self.raw.destroy_descriptor_pool(p, None);
                }
            }
            return;
        }
        // SAFETY: every object made on this device holds an Arc to it, so none is left and no other
        // thread uses the device or its queue; waiting idle makes sure no submitted work still runs
        // before the device is handed to the next context.
        let _ = unsafe { self.raw.device_wait_idle() };
        self.shared_layouts.destroy(&self.raw);
        IDLE_DEVICES.lock().push(IdleDevice {
            physical: self.physical,
            robust: self
                .caps
                .enabled
                .contains(VulkanFeatures::ROBUST_BUFFER_ACCESS),
            raw: self.raw.clone(),
            queue: self.queue,
            recycled: std::mem::take(self.recycled.get_mut()),
        });
    }
}

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BufferPlace {
    /// Device-local; the host reaches it through a staging copy.
    DeviceLocal,
    /// Host-visible and coherent, mapped for the buffer's whole life (CPU devices; staging buffers).
    HostVisible,
}

/// A host pointer to mapped memory.
#[derive(Clone, Copy)]
pub(crate) struct Mapped(pub(crate) *mut u8);

// SAFETY: the pointer is into coherent device memory mapped for the owning buffer's whole life;
// kpc only copies through it while holding the ordering guarantees the backend documents (all earlier
// device work finished), so moving it across threads cannot race with the device.
unsafe impl Send for Mapped {}
// SAFETY: as above; concurrent host copies to disjoint or overlapping ranges are the caller's data
// race to avoid, exactly as with any shared buffer in a GPU API.
unsafe impl Sync for Mapped {}

/// A VkBuffer with its own memory allocation.
pub struct VulkanBuffer {
    pub(crate) dev: Arc<Device>,
    pub(crate) raw: vk::Buffer,
    memory: vk::DeviceMemory,
    /// Bytes the user asked for (the allocation may be larger).
    pub(crate) size: u64,
    /// Where kpc's bytes start in `raw`: 0, except in an embedder's buffer.
    pub(crate) offset: u64,
    /// Whether kpc created `raw` and `memory` (and destroys them); an embedder's are only used.
    owned: bool,
    pub(crate) place: BufferPlace,
    pub(crate) mapped: Option<Mapped>,
}

impl std::fmt::Debug for VulkanBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanBuffer")
            .field("size", &self.size)
            .field("place", &self.place)
            .finish()
    }
}

impl VulkanBuffer {
    /// A buffer of `size` bytes usable as a storage buffer and a copy source and destination.
    pub(crate) fn new(dev: &Arc<Device>, size: u64, place: BufferPlace) -> Result<VulkanBuffer> {
        // Vulkan forbids zero-sized buffers; a 4-byte allocation stands in for an empty one.
        let alloc_size = size.max(4).next_multiple_of(4);
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::UNIFORM_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(alloc_size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let mut buf = VulkanBuffer {
            dev: dev.clone(),
            raw: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            size,
            offset: 0,
            owned: true,
            place,
            mapped: None,
        };
        // SAFETY: `info` is a valid create info; the handle is owned by `buf`, whose Drop destroys it
        // (also on the error paths below).
        buf.raw = unsafe { dev.raw.create_buffer(&info, None) }
            .map_err(|e| vk_err("vkCreateBuffer", e))?;
        // SAFETY: `buf.raw` is a live buffer of this device.
        let req = unsafe { dev.raw.get_buffer_memory_requirements(buf.raw) };
        let (required, preferred) = match place {
            BufferPlace::DeviceLocal => (
                vk::MemoryPropertyFlags::DEVICE_LOCAL,
                vk::MemoryPropertyFlags::empty(),
            ),
            BufferPlace::HostVisible => (
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
                vk::MemoryPropertyFlags::HOST_CACHED,
            ),
        };
        let type_index = dev
            .memory_type(req.memory_type_bits, required, preferred)
            .ok_or_else(|| Error::OutOfResources {
                backend: BackendKind::Vulkan,
                code: vk::Result::ERROR_OUT_OF_DEVICE_MEMORY.as_raw(),
                message: format!("no memory type with {required:?} for a buffer"),
            })?;
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(type_index);
        // SAFETY: `alloc` names a memory type this buffer allows; `buf` owns the allocation.
        buf.memory = unsafe { dev.raw.allocate_memory(&alloc, None) }
            .map_err(|e| vk_err("vkAllocateMemory", e))?;
        // SAFETY: the memory is fresh, large enough (req.size) and of an allowed type.
        unsafe { dev.raw.bind_buffer_memory(buf.raw, buf.memory, 0) }
            .map_err(|e| vk_err("vkBindBufferMemory", e))?;
        if place == BufferPlace::HostVisible {
            // SAFETY: the memory is host-visible and not mapped yet; it stays mapped until Drop.
            let p = unsafe {
                dev.raw
                    .map_memory(buf.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(|e| vk_err("vkMapMemory", e))?;
            buf.mapped = Some(Mapped(p.cast::<u8>()));
        }
        Ok(buf)
    }

    /// Whether kpc created the buffer (an embedder's is only used).
    pub(crate) fn owned(&self) -> bool {
        self.owned
    }

    /// Copies `data` into the mapped memory at `offset`. The caller guarantees the buffer is mapped,
    /// the range is inside it, and no device work touches it meanwhile.
    pub(crate) fn copy_in(&self, offset: u64, data: &[u8]) {
        let Some(Mapped(p)) = self.mapped else {
            return;
        };
        debug_assert!(offset + data.len() as u64 <= self.size.max(4));
        // SAFETY: `p` maps the whole allocation, which is at least `size` bytes; the caller checked
        // offset + len <= size; `data` cannot overlap device memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(offset as usize), data.len()) };
    }

    /// Copies from the mapped memory at `offset` into `out`, under the same guarantees as `copy_in`.
    pub(crate) fn copy_out(&self, offset: u64, out: &mut [u8]) {
        let Some(Mapped(p)) = self.mapped else {
            return;
        };
        debug_assert!(offset + out.len() as u64 <= self.size.max(4));
        // SAFETY: as in `copy_in`, reading instead of writing.
        unsafe {
            std::ptr::copy_nonoverlapping(
                p.add(offset as usize).cast_const(),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }
}

impl VulkanBuffer {
    /// The embedder's buffer `raw` (bound to `memory`), `size` bytes from `offset`, used in place.
    ///
    /// Errors: [`Error::InvalidArgument`] for a null handle or an offset that is not a multiple of
    /// the device's storage-buffer offset alignment; [`Error::Size`] when `offset + size` passes
    /// the end of what the buffer's memory requirements say it spans.
    ///
    /// # Safety
    /// `raw` is a live `VkBuffer` of `dev`, created with storage-buffer and transfer source and
    /// destination usage, bound to `memory`, at least `offset + size` bytes long, and it outlives
    /// every kpc use of this buffer.
    pub(crate) unsafe fn import(
        dev: &Arc<Device>,
        raw: vk::Buffer,
        memory: vk::DeviceMemory,
        offset: u64,
        size: u64,
    ) -> Result<VulkanBuffer> {
        if raw == vk::Buffer::null() || memory == vk::DeviceMemory::null() {
            return Err(Error::InvalidArgument(
                "an imported Vulkan buffer needs its VkBuffer and VkDeviceMemory (not null)".into(),
            ));
        }
        let align = dev.limits.min_storage_buffer_offset_alignment.max(1);
        if offset % align != 0 {
            return Err(Error::InvalidArgument(format!(
                "imported Vulkan buffer offset {offset} is not a multiple of the device's                  minStorageBufferOffsetAlignment ({align})"
            )));
        }
        // SAFETY: the caller guarantees `raw` is a live buffer of this device.
        let req = unsafe { dev.raw.get_buffer_memory_requirements(raw) };
        let end = offset.checked_add(size);
        if size == 0 || end.is_none_or(|end| end > req.size) {
            return Err(Error::Size {
                what: "imported Vulkan buffer".into(),
                got: format!("{size} bytes from offset {offset}"),
                expected: format!(
                    "1 to {} bytes in all (the VkBuffer's memory requirements span {} bytes)",
                    req.size.saturating_sub(offset),
                    req.size
                ),
            });
        }
        Ok(VulkanBuffer {
            dev: dev.clone(),
            raw,
            memory,
            size,
            offset,
            owned: false,
            place: BufferPlace::DeviceLocal,
            mapped: None,
        })
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        if !self.owned {
            // The embedder's: it destroys its buffer and frees its memory.
            return;
        }
        // SAFETY: submissions keep every buffer they use alive (Arc) until their fence has signaled,
        // so the device no longer uses this one; null handles are ignored by Vulkan.
        unsafe {
            if self.mapped.is_some() {
                self.dev.raw.unmap_memory(self.memory);
            }
            self.dev.raw.destroy_buffer(self.raw, None);
            self.dev.raw.free_memory(self.memory, None);
        }
    }
}
