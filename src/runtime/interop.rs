//! The interop half of the runtime: kernels' raw handles for the embedder's own command
//! recording (the contract is the public `kpc::interop` module's).

use crate::backend::KernelObject;
use crate::backend::opencl::OpenClKernel;
use crate::backend::opencl::OpenClKernelLease;
use crate::backend::vulkan::VulkanKernel;
use crate::backend::vulkan::VulkanKernelHandles;
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::kernel::Kernel;

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
    /// until the command buffers that use them have finished. Never destroy them. They are made at
    /// the first call for the kernel and lent from then on: later calls allocate nothing.
    ///
    /// Errors: [`Error::WrongBackend`] for a kernel that is not a Vulkan one.
    pub fn vulkan_handles(&self) -> Result<&VulkanKernelHandles> {
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
