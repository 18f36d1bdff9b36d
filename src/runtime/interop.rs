//! The interop half of the runtime: kernels' raw handles for the embedder's own command
//! recording (the contract is the public `kpc::interop` module's).

use crate::backend::KernelObject;
use crate::backend::opencl::OpenClKernel;
use crate::backend::opencl::OpenClKernelLease;
use crate::backend::vulkan::VulkanKernel;
use crate::backend::vulkan::VulkanKernelHandles;
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::buffer::{Buffer, RawBuffer};
use super::context::Context;
use super::kernel::Kernel;
use crate::backend::{ForeignBuffer, Pod};

impl Context {
    /// A buffer of `T` over the embedder's own `VkBuffer`, used in place (no copy) and never
    /// destroyed by kpc: `size` bytes from byte `offset` of `buffer` (raw handles, as
    /// `ash::vk::Handle::as_raw` gives them), bound to `memory`. Its elements are
    /// `size / size_of::<T>()`. Kernels, reads and writes of this context use it like any buffer
    /// of the context.
    ///
    /// Errors: [`Error::InvalidArgument`] for null handles, an offset that is not a multiple of
    /// the device's `minStorageBufferOffsetAlignment`, a size that is not whole elements, or a
    /// context that is not Vulkan; [`Error::Size`] for a zero size or `offset + size` past the
    /// buffer's memory requirements (a buffer smaller than the caller says).
    ///
    /// # Safety
    /// `buffer` is a live `VkBuffer` of this context's `VkDevice` (a context over the embedder's
    /// device: [`Context::builder`] with [`super::ContextBuilder::vulkan_handles`]), created with `STORAGE_BUFFER`, `TRANSFER_SRC` and
    /// `TRANSFER_DST` usage, bound to `memory`, at least `offset + size` bytes long; it outlives the
    /// returned buffer, its clones and every launch using them, and the embedder does not write it
    /// while kpc's work on it runs.
    pub unsafe fn import_vulkan_buffer<T: Pod>(
        &self,
        buffer: u64,
        memory: u64,
        offset: u64,
        size: u64,
    ) -> Result<Buffer<T>> {
        let f = ForeignBuffer::Vulkan {
            buffer,
            memory,
            offset,
            size,
        };
        // SAFETY: the caller's contract is import_buffer's.
        unsafe { self.import(&f, size) }
    }

    /// A buffer of `T` over the embedder's own `cl_mem` (a pointer-sized handle), its first `size`
    /// bytes, used in place (no copy); kpc retains the `cl_mem` while it uses it.
    ///
    /// Errors: [`Error::InvalidArgument`] for a NULL handle, a `cl_mem` of another `cl_context`,
    /// a size that is not whole elements, or a context that is not OpenCL; [`Error::Size`] for a
    /// zero size or more bytes than the `cl_mem` holds (`CL_MEM_SIZE`).
    ///
    /// # Safety
    /// `mem` is a live `cl_mem` buffer object, and the embedder does not write it while kpc's work
    /// on it runs.
    pub unsafe fn import_opencl_buffer<T: Pod>(&self, mem: usize, size: u64) -> Result<Buffer<T>> {
        let f = ForeignBuffer::OpenCl { mem, size };
        // SAFETY: the caller's contract is import_buffer's.
        unsafe { self.import(&f, size) }
    }

    /// # Safety
    /// As [`crate::backend::ComputeBackend::import_buffer`].
    unsafe fn import<T: Pod>(&self, f: &ForeignBuffer, size: u64) -> Result<Buffer<T>> {
        let elem = std::mem::size_of::<T>() as u64;
        if elem == 0 || size % elem != 0 {
            return Err(Error::InvalidArgument(format!(
                "an imported buffer of {size} bytes is not a whole number of {elem}-byte elements"
            )));
        }
        // SAFETY: the caller's contract is import_buffer's.
        let handle = unsafe { self.inner.compute.import_buffer(f) }?;
        Ok(Buffer::new(
            RawBuffer {
                handle,
                bytes: size,
                context: self.inner.id,
            },
            (size / elem) as usize,
            self.inner.compute.clone(),
        ))
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
