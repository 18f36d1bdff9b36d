//! [`ComputeBackend`], object safe: buffers, launches and events with their types erased.

use std::any::Any;
use std::sync::Arc;

use super::{DynBackend, foreign};
use crate::backend::{BackendStats, ComputeBackend, DeviceInfo, KernelObject, Launch};
use crate::error::Result;

/// A type-erased buffer handle: the backend's buffer type inside.
pub type AnyBuffer = Arc<dyn Any + Send + Sync>;

/// A type-erased submitted batch: the backend's event type inside.
pub type AnyEvent = Box<dyn Any + Send + Sync>;

/// [`Launch`] with erased handles, already checked by the runtime's queue against the kernel's
/// description: the kernel's [`KernelObject::as_any`] answers for the backend's kernel.
pub type DynLaunch<'a> = Launch<'a, dyn KernelObject, Vec<AnyBuffer>>;

/// [`ComputeBackend`], object safe: what a runtime `Context` runs kernels with. Implemented for every
/// [`ComputeBackend`]; see it for the ordering guarantees. Handles of another backend are refused
/// with [`crate::Error::InvalidArgument`].
pub trait DynComputeBackend: DynBackend {
    /// As [`ComputeBackend::device_info`].
    fn device_info(&self) -> &DeviceInfo;
    /// As [`ComputeBackend::create_buffer`].
    fn create_buffer(&self, bytes: u64) -> Result<AnyBuffer>;
    /// As [`ComputeBackend::write_buffer`].
    fn write_buffer(&self, buffer: &AnyBuffer, offset: u64, data: &[u8]) -> Result<()>;
    /// As [`ComputeBackend::read_buffer`].
    fn read_buffer(&self, buffer: &AnyBuffer, offset: u64, out: &mut [u8]) -> Result<()>;
    /// As [`ComputeBackend::submit`].
    fn submit(&self, launches: &[DynLaunch<'_>]) -> Result<AnyEvent>;
    /// As [`ComputeBackend::wait`].
    fn wait(&self, event: &AnyEvent) -> Result<()>;
    /// As [`ComputeBackend::launch_intervals`].
    fn launch_intervals(&self, event: &AnyEvent) -> Result<Option<Vec<(u64, u64)>>>;
    /// As [`ComputeBackend::finish`].
    fn finish(&self) -> Result<()>;
    /// As [`ComputeBackend::stats`].
    fn stats(&self) -> BackendStats;
    /// As [`ComputeBackend::import_buffer`].
    ///
    /// # Safety
    /// As [`ComputeBackend::import_buffer`].
    unsafe fn import_buffer(&self, foreign: &crate::backend::ForeignBuffer) -> Result<AnyBuffer>;
}

fn buffer<B: ComputeBackend>(b: &AnyBuffer) -> Result<&B::Buffer> {
    b.downcast_ref::<B::Buffer>()
        .ok_or_else(|| foreign("a buffer"))
}

fn event<B: ComputeBackend>(e: &AnyEvent) -> Result<&B::Event> {
    e.downcast_ref::<B::Event>()
        .ok_or_else(|| foreign("an event"))
}

impl<B: ComputeBackend> DynComputeBackend for B {
    fn device_info(&self) -> &DeviceInfo {
        ComputeBackend::device_info(self)
    }
    fn create_buffer(&self, bytes: u64) -> Result<AnyBuffer> {
        Ok(Arc::new(ComputeBackend::create_buffer(self, bytes)?))
    }
    fn write_buffer(&self, b: &AnyBuffer, offset: u64, data: &[u8]) -> Result<()> {
        ComputeBackend::write_buffer(self, buffer::<B>(b)?, offset, data)
    }
    fn read_buffer(&self, b: &AnyBuffer, offset: u64, out: &mut [u8]) -> Result<()> {
        ComputeBackend::read_buffer(self, buffer::<B>(b)?, offset, out)
    }
    fn submit(&self, launches: &[DynLaunch<'_>]) -> Result<AnyEvent> {
        let mut typed = Vec::with_capacity(launches.len());
        for l in launches {
            let kernel = l
                .kernel
                .as_any()
                .downcast_ref::<B::Kernel>()
                .ok_or_else(|| foreign("a kernel"))?;
            let buffers = l
                .buffers
                .iter()
                .map(|b| {
                    b.clone()
                        .downcast::<B::Buffer>()
                        .map_err(|_| foreign("a buffer"))
                })
                .collect::<Result<Vec<_>>>()?;
            typed.push(Launch {
                kernel,
                groups: l.groups,
                buffers,
                push_constants: l.push_constants,
            });
        }
        Ok(Box::new(ComputeBackend::submit(self, &typed)?))
    }
    fn wait(&self, e: &AnyEvent) -> Result<()> {
        ComputeBackend::wait(self, event::<B>(e)?)
    }
    fn launch_intervals(&self, e: &AnyEvent) -> Result<Option<Vec<(u64, u64)>>> {
        ComputeBackend::launch_intervals(self, event::<B>(e)?)
    }
    fn finish(&self) -> Result<()> {
        ComputeBackend::finish(self)
    }
    fn stats(&self) -> BackendStats {
        ComputeBackend::stats(self)
    }
    unsafe fn import_buffer(&self, foreign: &crate::backend::ForeignBuffer) -> Result<AnyBuffer> {
        // SAFETY: the caller's contract is this function's.
        Ok(Arc::new(unsafe {
            ComputeBackend::import_buffer(self, foreign)
        }?))
    }
}
