//! Embedding kpc in a runtime that owns its devices: contexts over the embedder's Vulkan or OpenCL
//! objects, and the raw handles of cached kernels for the embedder's own command recording.
//!
//! # What kpc borrows
//! - Vulkan: the `VkInstance`, `VkPhysicalDevice`, `VkDevice` and one `VkQueue` of
//!   [`VulkanHandles`]. kpc never destroys them and never calls vkDeviceWaitIdle on the device. The
//!   embedder keeps them alive until every kpc object made from the context (the context, kernels,
//!   buffers, events) is dropped, and does not submit to the same queue at the same time as a kpc
//!   call that runs work (launches, buffer copies): kpc's vkQueueSubmit is externally synchronized
//!   only by kpc's own lock.
//! - OpenCL: the `cl_context`, `cl_device_id` and `cl_command_queue` of [`OpenClHandles`]. kpc
//!   retains the context and queue, and releases exactly what it retained; the embedder may release
//!   its own references at any time and keep using the queue concurrently (OpenCL queues are
//!   thread-safe).
//!
//! # What kpc owns
//! Everything it creates: Vulkan command pools, fences, descriptor and query pools, buffers and
//! their memory, pipeline caches, pipelines with their layouts; OpenCL programs, kernel objects,
//! buffers and events. Their handles, as [`Kernel::vulkan_handles`] and [`Kernel::opencl_lease`]
//! expose them, stay kpc's: the embedder uses them while the kernel (or its lease) is alive and
//! never destroys them.
//!
//! # Same device, same cache
//! An interop context fingerprints its device with the same code as discovery, so a binary built by
//! an owned context on the same device and driver is a disk hit (and a blob hit) for an interop one,
//! and the other way round.

use crate::backend::KernelObject;
use crate::backend::opencl::{OpenClBackend, OpenClKernel};
pub use crate::backend::opencl::{OpenClHandles, OpenClKernelLease};
use crate::backend::vulkan::{VulkanBackend, VulkanKernel};
pub use crate::backend::vulkan::{VulkanFeatures, VulkanHandles, VulkanKernelHandles};
use crate::config::{BackendKind, Config};
use crate::error::{Error, Result};

use super::context::{Context, Kernel};

impl Context {
    /// A context over the embedder's Vulkan instance, device and queue, which kpc borrows and never
    /// destroys. The contract (Vulkan 1.1+, declared optional features, queue synchronization) is
    /// [`VulkanBackend::from_handles`]'s.
    ///
    /// Errors: as [`VulkanBackend::from_handles`].
    ///
    /// # Safety
    /// As [`VulkanBackend::from_handles`]: valid handles that belong together, kept alive until every
    /// kpc object made from this context is dropped, and truthful [`VulkanHandles::enabled`].
    pub unsafe fn from_vulkan_handles(handles: &VulkanHandles, config: &Config) -> Result<Context> {
        // SAFETY: the caller upholds from_handles' contract, which this function's repeats.
        let backend = unsafe { VulkanBackend::from_handles(handles, config) }?;
        Ok(Context::from_backend(backend, config))
    }

    /// A context over the embedder's OpenCL context, device and queue; kpc retains the context and
    /// queue and releases them when its last object is dropped.
    ///
    /// Errors: as [`OpenClBackend::from_handles`].
    ///
    /// # Safety
    /// As [`OpenClBackend::from_handles`]: valid handles that belong together.
    pub unsafe fn from_opencl_handles(handles: &OpenClHandles, config: &Config) -> Result<Context> {
        // SAFETY: the caller upholds from_handles' contract, which this function's repeats.
        let backend = unsafe { OpenClBackend::from_handles(handles, config) }?;
        Ok(Context::from_backend(backend, config))
    }
}

/// Which of kpc's backends made `obj`, if any.
fn backend_of(obj: &dyn KernelObject) -> Option<BackendKind> {
    let any = obj.as_any();
    if any.is::<VulkanKernel>() {
        Some(BackendKind::Vulkan)
    } else if any.is::<OpenClKernel>() {
        Some(BackendKind::OpenCl)
    } else {
        None
    }
}

impl Kernel {
    /// The kernel's Vulkan pipeline, pipeline layout, descriptor set layouts and bindings,
    /// push-constant range and local size, for recording a dispatch in the embedder's own command
    /// buffer. They stay valid while this kernel or a clone of it is alive, also after the context
    /// evicted it from memory or was dropped (the kernel holds them by reference count); keep a clone
    /// until the command buffers that use them have finished. Never destroy them.
    ///
    /// Errors: [`Error::WrongBackend`] for a kernel that is not a Vulkan one.
    pub fn vulkan_handles(&self) -> Result<VulkanKernelHandles> {
        self.obj
            .as_any()
            .downcast_ref::<VulkanKernel>()
            .map(VulkanKernel::handles)
            .ok_or_else(|| Error::WrongBackend {
                operation: "Kernel::vulkan_handles",
                expected: BackendKind::Vulkan,
                found: backend_of(self.obj.as_ref()),
            })
    }

    /// An exclusive `cl_kernel` of this kernel for the embedder's own clSetKernelArg and
    /// clEnqueueNDRangeKernel: no kpc launch uses that kernel object until the lease is dropped,
    /// when it returns to kpc's pool. Set every argument of the kernel's OpenCL C signature before
    /// each enqueue: the buffer parameters sit at the argument indices
    /// `info().buffers[i].binding`, the scalars at the others, in declaration order; enqueue with
    /// `info().local_size` as the local size. See [`OpenClKernelLease`].
    ///
    /// Errors: [`Error::WrongBackend`] for a kernel that is not an OpenCL one; [`Error::Backend`]
    /// or [`Error::OutOfResources`] when a new kernel object cannot be created.
    pub fn opencl_lease(&self) -> Result<OpenClKernelLease> {
        OpenClKernelLease::new(&self.obj).unwrap_or_else(|| {
            Err(Error::WrongBackend {
                operation: "Kernel::opencl_lease",
                expected: BackendKind::OpenCl,
                found: backend_of(self.obj.as_ref()),
            })
        })
    }
}
