//! Interop: contexts over the caller's own Vulkan or OpenCL objects, the raw Vulkan handles of a
//! kernel, and `cl_kernel` leases. Vulkan's dispatchable handles (`VkInstance`, `VkPhysicalDevice`,
//! `VkDevice`, `VkQueue`) and OpenCL's handles are `void *`, Vulkan's non-dispatchable ones
//! (`VkPipeline`, ...) `uint64_t`, so C callers need no Vulkan or OpenCL header to include kpc.h.

use std::ffi::c_void;

use ash::vk::{self, Handle};
use parking_lot::Mutex;

use super::config::resolved;
use super::context::kpc_context;
use super::kernel::{KernelObject, kpc_kernel};
use super::registry::{self, Object};
use super::util::{check_out, write_out, write_versioned};
use super::vulkan_features::features;
use super::{Failure, guard, kpc_config, kpc_status};
use crate::arrays::VulkanArrays;
use kpc::Context;
use kpc::interop::{OpenClHandles, OpenClKernelLease};
use kpc::interop::{VulkanHandles, VulkanQueueLock};

/// The caller's Vulkan objects, which kpc borrows and never destroys. Set `struct_size =
/// sizeof(kpc_vulkan_handles)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kpc_vulkan_handles {
    /// The caller's `sizeof(kpc_vulkan_handles)`.
    pub struct_size: u32,
    /// `VkApplicationInfo::apiVersion` the instance was created with; 1.1 or later.
    pub instance_api_version: u32,
    /// `PFN_vkGetInstanceProcAddr`: the one the instance was created through (the loader's, or a
    /// layer's).
    pub get_instance_proc_addr: *mut c_void,
    /// `VkInstance`.
    pub instance: *mut c_void,
    /// `VkPhysicalDevice`: the instance's, the one `device` was created from.
    pub physical_device: *mut c_void,
    /// `VkDevice`.
    pub device: *mut c_void,
    /// `VkQueue`: kpc submits its own work (launches, copies) to it.
    pub queue: *mut c_void,
    /// The family of `queue`; it must support compute.
    pub queue_family_index: u32,
    /// Must be 0.
    pub reserved: u32,
    /// `KPC_VULKAN_FEATURE_*` bits: the optional features and extensions enabled on `device` (0 for
    /// none). kpc uses only these, and refuses a bit the device cannot support.
    pub enabled_features: u64,
    /// Optional (NULL for none; set both or neither): takes the caller's own lock over `queue`. kpc
    /// calls it, from whichever thread submits, right before each of its calls that use the queue
    /// (vkQueueSubmit), and `queue_unlock` right after, so the caller serializes its own queue use
    /// on that lock and needs no other coordination with kpc. Never call a kpc function that
    /// submits while holding that lock. (The functions of this C API build kernels and hand out
    /// handles; none of them submits, so they never call it; contexts over one queue made through
    /// the Rust API do.) Added after `enabled_features`: a caller built against an older kpc.h,
    /// whose `struct_size` ends at `enabled_features`, is accepted and gets no hook.
    pub queue_lock: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    /// Releases the lock `queue_lock` took.
    pub queue_unlock: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    /// Passed unchanged to `queue_lock` and `queue_unlock`.
    pub queue_lock_user_data: *mut c_void,
}

/// The size of `kpc_vulkan_handles` before the queue-lock hook was added: still accepted.
const VULKAN_HANDLES_V1: usize = std::mem::offset_of!(kpc_vulkan_handles, queue_lock);

/// The caller's OpenCL objects. kpc retains the context and the queue (releasing them when its last
/// object goes); the caller may release its own references whenever it likes. Set `struct_size =
/// sizeof(kpc_opencl_handles)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kpc_opencl_handles {
    /// The caller's `sizeof(kpc_opencl_handles)`.
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// `cl_context`.
    pub context: *mut c_void,
    /// `cl_device_id`: one of the context's devices.
    pub device: *mut c_void,
    /// `cl_command_queue`: an in-order queue of that context and device.
    pub queue: *mut c_void,
}

/// Reads a versioned input struct: `struct_size` must cover kpc's struct (a larger one, from a newer
/// header, is read up to kpc's fields).
///
/// # Safety
/// `p` is NULL or points to a readable, initialized struct of at least the size its first `u32`
/// says.
pub(crate) unsafe fn read_versioned<T: Copy>(p: *const T, name: &str) -> Result<T, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{name} is NULL")));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "{name} ({p:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    // SAFETY: non-NULL and aligned (hence for the leading u32), initialized by the caller.
    let size = unsafe { p.cast::<u32>().read() } as usize;
    if size < std::mem::size_of::<T>() {
        return Err(Failure::invalid(format!(
            "{name}.struct_size is {size}, expected sizeof({name}) = {} (set it before the call)",
            std::mem::size_of::<T>()
        )));
    }
    // SAFETY: the caller's struct is at least as large as T, readable and initialized; T is plain
    // old data (integers and raw pointers), valid for any bits.
    Ok(unsafe { p.read() })
}

/// Reads a versioned input struct that grew: `struct_size` must cover at least its first `min`
/// bytes (an older caller's struct); fields past the caller's size read as zero (NULL, none).
///
/// # Safety
/// As [`read_versioned`]; and `T` is valid with any trailing bytes zero.
unsafe fn read_grown<T: Copy>(p: *const T, min: usize, name: &str) -> Result<T, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{name} is NULL")));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "{name} ({p:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    // SAFETY: non-NULL and aligned (hence for the leading u32), initialized by the caller.
    let size = unsafe { p.cast::<u32>().read() } as usize;
    if size < min {
        return Err(Failure::invalid(format!(
            "{name}.struct_size is {size}, expected sizeof({name}) = {} (or {min} from an older \
             header; set it before the call)",
            std::mem::size_of::<T>()
        )));
    }
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: the caller's struct has at least `n` readable, initialized bytes; `out` has room for
    // size_of::<T>() >= n; the rest stays zero, which the caller says is valid for T.
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), out.as_mut_ptr().cast::<u8>(), n);
        Ok(out.assume_init())
    }
}

/// A reserved field must be 0, so that a later version can give it a meaning.
fn reserved_is_zero(v: u32, name: &str) -> Result<(), Failure> {
    if v != 0 {
        return Err(Failure::invalid(format!(
            "{name}.reserved is {v}: expected 0 (zero the struct before filling it)"
        )));
    }
    Ok(())
}

/// Creates a context over the caller's Vulkan instance, physical device, device and queue, which kpc
/// borrows and never destroys (and never calls vkDeviceWaitIdle on). kpc needs Vulkan 1.1 and a
/// compute queue; no optional feature is required. The device fingerprint is the one an owned
/// context on the same device gets, so both share disk cache entries and blobs.
///
/// External synchronization: kpc submits to `queue` only inside its own calls that run work (buffer
/// writes and reads, launches), under one lock per queue that every kpc context over that queue
/// shares. The caller either gives kpc its own lock over the queue (`queue_lock`/`queue_unlock`),
/// or does not use the queue at the same time as such a kpc call (or passes a queue kpc alone
/// uses). Building kernels never touches the queue.
///
/// Ownership: `*out` receives a new context; destroy it with `kpc_context_destroy`. The caller's
/// objects must stay alive until every kpc object made from this context (kernels, leases) is
/// destroyed.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (NULL or misaligned `handles`, a `struct_size` that does
/// not cover the struct, a non-zero `reserved`, a NULL handle or function pointer, unknown feature bits, an instance API
/// below 1.1, a physical device that is not the instance's, a queue family without compute, a
/// declared feature the device lacks); `KPC_STATUS_UNAVAILABLE` (a device below Vulkan 1.1).
///
/// # Safety
/// The handles are live objects that belong together (the device was created from the physical
/// device with a queue of `queue_family_index`; `queue` is one of them), `get_instance_proc_addr`
/// is the function the instance was created through, and `enabled_features` tells the truth. kpc
/// checks NULL and what it can ask Vulkan, but a dangling or invented handle cannot be detected.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_create_vulkan(
    config: *const kpc_config,
    handles: *const kpc_vulkan_handles,
    out: *mut *mut kpc_context,
) -> kpc_status {
    guard("kpc_context_create_vulkan", || {
        check_out(out, "out")?;
        let c = resolved(config)?;
        // SAFETY: forwarded to the caller; the fields past an older struct are an optional function
        // pointer pair and a data pointer, all valid as zero (NULL).
        let h = unsafe { read_grown(handles, VULKAN_HANDLES_V1, "kpc_vulkan_handles")? };
        reserved_is_zero(h.reserved, "kpc_vulkan_handles")?;
        let queue_lock = match (h.queue_lock, h.queue_unlock) {
            (None, None) => None,
            (Some(lock), Some(unlock)) => Some(VulkanQueueLock {
                lock,
                unlock,
                user_data: h.queue_lock_user_data,
            }),
            _ => {
                return Err(Failure::invalid(
                    "kpc_vulkan_handles: queue_lock and queue_unlock must both be set or both be \
                     NULL",
                ));
            }
        };
        if h.get_instance_proc_addr.is_null() {
            return Err(Failure::invalid(
                "kpc_vulkan_handles.get_instance_proc_addr is NULL: expected the \
                 vkGetInstanceProcAddr the instance was created through",
            ));
        }
        // SAFETY: a non-NULL function pointer the caller promises is vkGetInstanceProcAddr; data
        // and function pointers have the same size and representation on every target kpc builds
        // for.
        let gipa = unsafe {
            std::mem::transmute::<*mut c_void, vk::PFN_vkGetInstanceProcAddr>(
                h.get_instance_proc_addr,
            )
        };
        let handles = VulkanHandles {
            get_instance_proc_addr: gipa,
            instance: vk::Instance::from_raw(h.instance as u64),
            instance_api_version: h.instance_api_version,
            physical_device: vk::PhysicalDevice::from_raw(h.physical_device as u64),
            device: vk::Device::from_raw(h.device as u64),
            queue_family_index: h.queue_family_index,
            queue: vk::Queue::from_raw(h.queue as u64),
            enabled: features(h.enabled_features)?,
            queue_lock,
        };
        // SAFETY: the caller upholds from_vulkan_handles' contract, which this function's repeats;
        // kpc checks the null handles itself.
        let ctx = unsafe {
            Context::builder()
                .vulkan_handles(&handles)
                .config(c.clone())
                .build()?
        };
        let handle = registry::insert(ctx);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, handle, "out") }
    })
}

/// Creates a context over the caller's OpenCL context, device and in-order queue. kpc retains the
/// context and queue and releases them when its last object is destroyed; the caller may release
/// its own references at any time and keep using the queue (OpenCL queues are thread-safe). The
/// fingerprint is the one an owned context on the same device gets.
///
/// Ownership: `*out` receives a new context; destroy it with `kpc_context_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (NULL or misaligned `handles`, a `struct_size` that does
/// not cover the struct, a non-zero `reserved`, NULL handles, a device not in the context, a queue of another context or
/// device, an out-of-order queue); `KPC_STATUS_UNAVAILABLE` (no OpenCL loader, a device below
/// OpenCL 1.2 or without a compiler).
///
/// # Safety
/// The handles are live OpenCL objects; a dangling or invented one cannot be detected.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_create_opencl(
    config: *const kpc_config,
    handles: *const kpc_opencl_handles,
    out: *mut *mut kpc_context,
) -> kpc_status {
    guard("kpc_context_create_opencl", || {
        check_out(out, "out")?;
        let c = resolved(config)?;
        // SAFETY: forwarded to the caller.
        let h = unsafe { read_versioned(handles, "kpc_opencl_handles")? };
        reserved_is_zero(h.reserved, "kpc_opencl_handles")?;
        for (p, name) in [
            (h.context, "context"),
            (h.device, "device"),
            (h.queue, "queue"),
        ] {
            if p.is_null() {
                return Err(Failure::invalid(format!(
                    "kpc_opencl_handles.{name} is NULL"
                )));
            }
        }
        let handles = OpenClHandles {
            context: h.context,
            device: h.device,
            queue: h.queue,
        };
        // SAFETY: the caller promises live OpenCL objects (this function's contract).
        let ctx = unsafe {
            Context::builder()
                .opencl_handles(&handles)
                .config(c.clone())
                .build()?
        };
        let handle = registry::insert(ctx);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, handle, "out") }
    })
}

/// One descriptor binding of set 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kpc_vulkan_binding {
    /// The binding number.
    pub binding: u32,
    /// Its `VkDescriptorType` (storage buffers for kpc's kernels).
    pub descriptor_type: u32,
}

/// The raw Vulkan handles of a kernel, for recording a dispatch in the caller's own command buffer.
/// They belong to kpc: never destroy them. They stay valid until `kpc_kernel_destroy` of the kernel
/// handle they came from (also after the context evicted the kernel or was destroyed); keep that
/// handle until every command buffer recorded with them has finished. Versioned: set `struct_size =
/// sizeof(kpc_vulkan_kernel_handles)` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kpc_vulkan_kernel_handles {
    /// In: the caller's `sizeof(kpc_vulkan_kernel_handles)`. Out: the bytes kpc wrote.
    pub struct_size: u32,
    /// Entries of `descriptor_set_layouts` (set numbers 0..count; kpc uses set 0 only).
    pub descriptor_set_layout_count: u32,
    /// `VkPipeline` (compute).
    pub pipeline: u64,
    /// `VkPipelineLayout`: bind descriptor sets and push constants with it.
    pub pipeline_layout: u64,
    /// `VkDescriptorSetLayout`s by set number; the array belongs to the kernel handle.
    pub descriptor_set_layouts: *const u64,
    /// Set 0's bindings in kpc's launch-argument order; the array belongs to the kernel handle.
    pub bindings: *const kpc_vulkan_binding,
    /// Entries of `bindings`.
    pub binding_count: u32,
    /// `VkShaderStageFlags` of the push-constant range (0 when there is none).
    pub push_constant_stage_flags: u32,
    /// Offset of the push-constant range.
    pub push_constant_offset: u32,
    /// Size of the push-constant range in bytes; 0 when the kernel takes no push constants.
    pub push_constant_size: u32,
    /// The workgroup size after specialization: dispatch ceil(n / local_size) groups.
    pub local_size: [u32; 3],
    /// Unused; written as 0.
    pub reserved: u32,
}

/// Writes the raw Vulkan handles of `kernel` (pipeline, pipeline layout, descriptor set layouts,
/// bindings, push-constant range, local size) to `*out`. Set `out->struct_size` first.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL `out`, unset `struct_size`);
/// `KPC_STATUS_WRONG_BACKEND` for a kernel that is not a Vulkan one.
///
/// # Safety
/// `out` is NULL or points to a writable `kpc_vulkan_kernel_handles` whose `struct_size` the caller
/// set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_vulkan_handles(
    kernel: *const kpc_kernel,
    out: *mut kpc_vulkan_kernel_handles,
) -> kpc_status {
    guard("kpc_kernel_vulkan_handles", || {
        check_out(out, "out")?;
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        let a = match k.vulkan.get() {
            Some(a) => a,
            None => {
                let h = k.kernel.vulkan_handles()?;
                let arrays = VulkanArrays {
                    set_layouts: h
                        .descriptor_set_layouts
                        .iter()
                        .map(|l| l.as_raw())
                        .collect(),
                    bindings: h
                        .bindings
                        .iter()
                        .map(|(b, t)| kpc_vulkan_binding {
                            binding: *b,
                            descriptor_type: t.as_raw() as u32,
                        })
                        .collect(),
                    pipeline: h.pipeline.as_raw(),
                    pipeline_layout: h.pipeline_layout.as_raw(),
                    push: h.push_constant_range,
                    local_size: h.local_size,
                };
                k.vulkan.get_or_init(|| arrays)
            }
        };
        let v = kpc_vulkan_kernel_handles {
            struct_size: 0,
            descriptor_set_layout_count: a.set_layouts.len() as u32,
            pipeline: a.pipeline,
            pipeline_layout: a.pipeline_layout,
            descriptor_set_layouts: a.set_layouts.as_ptr(),
            bindings: a.bindings.as_ptr(),
            binding_count: a.bindings.len() as u32,
            push_constant_stage_flags: a.push.map_or(0, |p| p.stage_flags.as_raw()),
            push_constant_offset: a.push.map_or(0, |p| p.offset),
            push_constant_size: a.push.map_or(0, |p| p.size),
            local_size: a.local_size,
            reserved: 0,
        };
        // SAFETY: forwarded to the caller.
        unsafe { write_versioned(out, v, |s| &mut s.struct_size, "kpc_vulkan_kernel_handles") }
    })
}

/// An exclusive `cl_kernel` of a kernel (opaque), for the caller's own clSetKernelArg and
/// clEnqueueNDRangeKernel: no kpc launch and no other lease uses that kernel object until
/// `kpc_lease_release`, when it goes back to kpc's pool. Use a lease from one thread at a time.
pub struct kpc_lease {
    _opaque: [u8; 0],
}

/// `OpenClKernelLease` is `!Sync` (a cl_kernel's arguments are one holder's to set); the registry
/// shares objects between threads, so each use of the lease takes its lock.
pub(crate) struct LeaseObject(Mutex<OpenClKernelLease>);

impl Object for LeaseObject {
    type Handle = kpc_lease;
    const NAME: &'static str = "kpc_lease";
}

/// Leases one of `kernel`'s `cl_kernel` objects. Its arguments follow the kernel's parameters in
/// order: the buffers, then the scalars (for saxpy: x, y, out, n, a). Set every argument before each
/// enqueue; change nothing else about the object. Enqueued work has captured its arguments, so the
/// lease may be released right after clEnqueueNDRangeKernel.
///
/// Ownership: `*out` receives a new lease; give it back with `kpc_lease_release`. The lease keeps
/// the kernel (and its program and context) alive.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL `out`); `KPC_STATUS_WRONG_BACKEND` for a
/// kernel that is not an OpenCL one; `KPC_STATUS_BACKEND` or `KPC_STATUS_OUT_OF_RESOURCES` when a
/// new kernel object cannot be created.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_lease_acquire(
    kernel: *const kpc_kernel,
    out: *mut *mut kpc_lease,
) -> kpc_status {
    guard("kpc_lease_acquire", || {
        check_out(out, "out")?;
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        let lease = k.kernel.opencl_lease()?;
        let h = registry::insert(LeaseObject(Mutex::new(lease)));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Writes the leased `cl_kernel` to `*out`: valid until `kpc_lease_release`; never release it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_lease_cl_kernel(
    lease: *const kpc_lease,
    out: *mut *mut c_void,
) -> kpc_status {
    guard("kpc_lease_cl_kernel", || {
        let l = registry::get::<LeaseObject>(lease, "lease")?;
        let raw = l.0.lock().raw();
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, raw, "out") }
    })
}

/// Gives a lease back: its `cl_kernel` returns to kpc's pool. NULL is accepted and does nothing.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `lease` is not a live lease; nothing is released then.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_lease_release(lease: *mut kpc_lease) -> kpc_status {
    guard("kpc_lease_release", || {
        registry::remove::<LeaseObject>(lease, "lease")
    })
}
