//! Interop: an OpenCL backend over the embedder's `cl_context`, `cl_device_id` and
//! `cl_command_queue`, and exclusive `cl_kernel` leases for the embedder's own enqueues.

use std::marker::PhantomData;
use std::sync::Arc;

use opencl3::command_queue::{
    CL_QUEUE_CONTEXT, CL_QUEUE_DEVICE, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE,
    CL_QUEUE_PROFILING_ENABLE, CL_QUEUE_PROPERTIES, CommandQueue, get_command_queue_info,
    retain_command_queue,
};
use opencl3::context::Context;
use opencl3::context::context::{CL_CONTEXT_DEVICES, get_context_info, retain_context};
use opencl3::device::Device;
use opencl3::platform::Platform;
use opencl3::types::{cl_command_queue, cl_context, cl_device_id, cl_kernel};

use crate::backend::KernelObject;
use crate::config::Config;
use crate::error::{Error, Result};

use super::launch::OpenClKernel;
use super::{OpenClBackend, OpenClOptions, cl_err, discovery};

/// OpenCL objects the embedder owns. kpc retains the context and the queue (clRetainContext,
/// clRetainCommandQueue) and releases them when its last object made from them is dropped; the
/// embedder keeps its own references and releases them when it likes.
///
/// Exhaustive on purpose: every field is something only the embedder knows, so a field added in a
/// later version must fail to compile where it is not filled in, rather than take a default.
#[derive(Debug, Clone, Copy)]
pub struct OpenClHandles {
    /// The context.
    pub context: cl_context,
    /// A device of `context` (a root device, as clGetDeviceIDs returns them).
    pub device: cl_device_id,
    /// An in-order queue of `context` on `device`, which kpc enqueues its own work to.
    pub queue: cl_command_queue,
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

impl OpenClBackend {
    /// A backend over the embedder's context, device and queue.
    ///
    /// The device fingerprint is computed by discovery's own code for the same device, so binaries
    /// built by an owned context on it are disk and blob hits here, and the other way round.
    ///
    /// Ownership: kpc retains the context and queue on the way in and releases them when its last
    /// object (context, kernel, buffer, event) is gone; it never releases more than it retained.
    /// Dropping kpc's last object calls clFinish on the queue, which also waits for the
    /// embedder's work enqueued before it.
    ///
    /// Synchronization: OpenCL calls are thread-safe except argument setting, and kpc sets arguments
    /// only on kernel objects nobody else holds (see [`OpenClKernelLease`]), so the embedder may
    /// keep enqueueing to the same queue while kpc runs. kpc's launches and copies are ordered after
    /// whatever the embedder enqueued to the queue before them, as on any in-order queue.
    ///
    /// Errors: [`Error::InvalidArgument`] for a null handle, a device that is not the context's, a
    /// queue of another context or device, or an out-of-order queue; [`Error::Unavailable`] when
    /// the device cannot run kpc (OpenCL below 1.2, no compiler); [`Error::Backend`] when a query
    /// fails.
    ///
    /// # Safety
    /// The handles are valid and alive for the duration of the call (afterwards kpc's own
    /// references keep the context and queue alive); `device` is a root device.
    pub unsafe fn from_handles(handles: &OpenClHandles, config: &Config) -> Result<OpenClBackend> {
        let h = handles;
        if h.context.is_null() || h.device.is_null() || h.queue.is_null() {
            return Err(invalid(
                "OpenCL interop needs non-null context, device and queue handles".into(),
            ));
        }
        // Discovery first: it loads the ICD loader and gives this device its index.
        let found = discovery::enumerate()?;
        let devices = get_context_info(h.context, CL_CONTEXT_DEVICES)
            .map_err(|e| cl_err("clGetContextInfo", e))?
            .to_vec_intptr();
        if !devices.iter().any(|&d| d as cl_device_id == h.device) {
            return Err(invalid(
                "the OpenCL device is not one of the context's devices".into(),
            ));
        }
        let queue_info = |what| {
            get_command_queue_info(h.queue, what).map_err(|e| cl_err("clGetCommandQueueInfo", e))
        };
        if queue_info(CL_QUEUE_CONTEXT)?.to_ptr() as cl_context != h.context
            || queue_info(CL_QUEUE_DEVICE)?.to_ptr() as cl_device_id != h.device
        {
            return Err(invalid(
                "the OpenCL queue belongs to another context or device".into(),
            ));
        }
        let properties = queue_info(CL_QUEUE_PROPERTIES)?.to_ulong();
        if properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE != 0 {
            return Err(invalid(
                "the OpenCL queue is out of order; kpc's launches and copies rely on an in-order \
                 queue"
                    .into(),
            ));
        }
        let device = Device::new(h.device);
        let platform = device
            .platform()
            .map_err(|e| cl_err("clGetDeviceInfo", e))?;
        let index = found
            .iter()
            .position(|f| f.device.id() == h.device)
            .unwrap_or(found.len());
        let mut f = discovery::describe(&Platform::new(platform), h.device, index)?;
        if let Some(why) = &f.info.unusable {
            return Err(discovery::unavailable(format!(
                "device {:?}: {why}",
                f.info.name
            )));
        }
        let profiled = properties & CL_QUEUE_PROFILING_ENABLE != 0;
        f.info.limits.timestamps = profiled;
        let max_dims = device
            .max_work_item_dimensions()
            .map_err(|e| cl_err("clGetDeviceInfo", e))?;
        // SAFETY: the handles are valid (caller's guarantee); each retain is balanced by the
        // release in the wrapper's Drop, so kpc holds exactly one reference of its own to each.
        unsafe {
            retain_context(h.context).map_err(|e| cl_err("clRetainContext", e))?;
        }
        let context = Context::new(h.context, &[h.device]);
        // SAFETY: as above.
        unsafe {
            retain_command_queue(h.queue).map_err(|e| cl_err("clRetainCommandQueue", e))?;
        }
        let queue = CommandQueue::new(h.queue, max_dims);
        Ok(OpenClBackend::assemble(
            f,
            context,
            queue,
            profiled,
            OpenClOptions::default(),
            config,
        ))
    }
}

/// An exclusive `cl_kernel` of one kpc kernel, for the embedder's own clSetKernelArg and
/// clEnqueueNDRangeKernel. clSetKernelArg is not thread-safe, so no kpc launch uses this kernel
/// object while the lease is held; it returns to kpc's pool of kernel objects when the lease is
/// dropped (where the kernel shares objects through a pool; otherwise it is released).
///
/// The lease keeps the kpc kernel (hence its program, context and device) alive. Enqueued work
/// captured the arguments, so dropping the lease right after clEnqueueNDRangeKernel is fine. Set
/// every argument before each enqueue and change nothing but arguments (no clSetKernelExecInfo):
/// kpc's launches set every argument again, nothing else. The lease can move to another thread but
/// not be shared between threads (`!Sync`).
pub struct OpenClKernelLease {
    object: Option<opencl3::kernel::Kernel>,
    owner: Arc<dyn KernelObject>,
    /// `!Sync`: the object's arguments are one holder's to set.
    _one_holder: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for OpenClKernelLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClKernelLease")
            .field("kernel", &self.owner.info().name)
            .field("raw", &self.raw())
            .finish()
    }
}

impl OpenClKernelLease {
    /// A lease of one of `kernel`'s kernel objects, or `None` when `kernel` is not an OpenCL kernel.
    pub(crate) fn new(kernel: &Arc<dyn KernelObject>) -> Option<Result<OpenClKernelLease>> {
        let k = kernel.as_any().downcast_ref::<OpenClKernel>()?;
        Some(k.lend_object().map(|object| OpenClKernelLease {
            object: Some(object),
            owner: kernel.clone(),
            _one_holder: PhantomData,
        }))
    }

    /// The leased `cl_kernel`: valid until the lease is dropped; never release it.
    pub fn raw(&self) -> cl_kernel {
        self.object
            .as_ref()
            .map_or(std::ptr::null_mut(), opencl3::kernel::Kernel::get)
    }
}

impl Drop for OpenClKernelLease {
    fn drop(&mut self) {
        if let (Some(object), Some(k)) = (
            self.object.take(),
            self.owner.as_any().downcast_ref::<OpenClKernel>(),
        ) {
            k.return_object(object);
        }
    }
}
