//! `Queue`: in-order submission of kernel launches, with events that wait and time them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Launch;
use crate::backend::dynamic::{AnyEvent, DynComputeBackend, DynLaunch};
use crate::error::{Error, Result};

use super::buffer::BufferArg;
use super::kernel::Kernel;

/// A context's in-order queue: each launch starts after everything submitted before it has finished,
/// and buffer reads and writes are ordered after every earlier launch. Cloning is cheap; every clone
/// is the same queue.
#[derive(Clone)]
pub struct Queue {
    pub(crate) backend: Arc<dyn DynComputeBackend>,
    /// The id of the context it belongs to: kernels and buffers must carry the same.
    pub(crate) context: u64,
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("context", &self.context)
            .finish()
    }
}

/// One launch in a batch: `kernel` over a grid of `groups` workgroups (each of the kernel's local
/// size), with buffer arguments in the kernel's parameter order ([`crate::KernelInfo::buffers`])
/// and its push-constant bytes, exactly the kernel's push-constant size (see [`PushConstants`]).
/// The backends' [`Launch`] descriptor with a context's kernel and buffers; [`Queue::submit`] checks
/// it (kernel and buffers of this context, buffer count and sizes, push size, declared bounds)
/// before anything reaches the device.
pub type LaunchDesc<'a> = Launch<'a, Kernel, &'a [&'a dyn BufferArg]>;

impl Queue {
    /// Launches `kernel` over `groups` workgroups with `buffers` and `push_constants`: one
    /// [`Queue::submit`] of one launch, with its checks.
    ///
    /// Errors: as [`Queue::submit`].
    pub fn launch(
        &self,
        kernel: &Kernel,
        groups: [u32; 3],
        buffers: &[&dyn BufferArg],
        push_constants: &[u8],
    ) -> Result<Event> {
        self.submit(&[LaunchDesc {
            kernel,
            groups,
            buffers,
            push_constants,
        }])
    }

    /// Submits `launches` as one batch, in order, each after the previous has finished. One batch
    /// costs at most one submission, which matters when a step is many small launches. On a Vulkan
    /// device kpc opened, batches that follow each other closely may share one vkQueueSubmit and
    /// start only when it goes to the queue: at the latest when it holds `KPC_VULKAN_DEFER`
    /// batches or when anything waits (an event, [`Queue::finish`], a buffer read or write).
    ///
    /// Safe for any kernel on a device that keeps buffer accesses inside their buffers (Vulkan with
    /// `robustBufferAccess`, which kpc enables on the devices it opens where they have it:
    /// [`crate::backend::DeviceLimits::robust_buffer_access`]). Elsewhere (OpenCL, Vulkan without it)
    /// a kernel could index past a short buffer into other memory, the process's own heap on a CPU
    /// device, so only kernels with declared access bounds ([`Kernel::has_access_bounds`]: kpc's
    /// shipped `saxpy`, `copy`, `read`, or [`crate::runtime::declare_access_bounds`]) are launched,
    /// each buffer checked against its bound for this launch first; any other kernel needs
    /// [`Queue::submit_unchecked`].
    ///
    /// Errors (nothing is submitted then): [`Error::Launch`] when the buffer count or the group
    /// counts do not fit the kernel or device; [`Error::Size`] for a buffer smaller than its
    /// parameter's fixed part or than its declared bound for this launch (naming the binding), or
    /// push constants of the wrong length; [`Error::Unbounded`] for a kernel that nothing bounds on
    /// this device; [`Error::InvalidArgument`] for a kernel or buffer of another context.
    pub fn submit(&self, launches: &[LaunchDesc<'_>]) -> Result<Event> {
        self.submit_checked(launches, true)
    }

    /// [`Queue::submit`] without the access-bounds requirement: every other check is made (declared
    /// bounds included), but a kernel nothing bounds is launched as it is.
    ///
    /// # Safety
    /// Every buffer of every launch is at least as large as its kernel reads or writes of it for
    /// that launch's groups and push constants (on a device with robust buffer access this holds
    /// by itself). A kernel that indexes past a buffer has undefined behaviour: on a CPU OpenCL
    /// device it writes into this process's memory.
    pub unsafe fn submit_unchecked(&self, launches: &[LaunchDesc<'_>]) -> Result<Event> {
        self.submit_checked(launches, false)
    }

    /// [`Queue::launch`] without the access-bounds requirement.
    ///
    /// # Safety
    /// As [`Queue::submit_unchecked`].
    pub unsafe fn launch_unchecked(
        &self,
        kernel: &Kernel,
        groups: [u32; 3],
        buffers: &[&dyn BufferArg],
        push_constants: &[u8],
    ) -> Result<Event> {
        // SAFETY: the caller's contract is this function's.
        unsafe {
            self.submit_unchecked(&[LaunchDesc {
                kernel,
                groups,
                buffers,
                push_constants,
            }])
        }
    }

    fn submit_checked(&self, launches: &[LaunchDesc<'_>], safe: bool) -> Result<Event> {
        // A device that keeps accesses inside buffers makes any kernel safe to launch.
        let refuse_unbounded = safe && !self.backend.device_info().limits.robust_buffer_access;
        let mut erased = Vec::with_capacity(launches.len());
        for l in launches {
            erased.push(self.check(l, refuse_unbounded)?);
        }
        let event = self.backend.submit(&erased)?;
        Ok(Event {
            event,
            backend: self.backend.clone(),
            names: launches
                .iter()
                .map(|l| l.kernel.name().to_string())
                .collect(),
        })
    }

    /// Blocks until everything submitted so far (from any thread, on any handle of this queue) has
    /// finished.
    ///
    /// Errors: [`Error::Backend`] for a device failure.
    pub fn finish(&self) -> Result<()> {
        self.backend.finish()
    }

    fn check<'a>(&self, l: &LaunchDesc<'a>, refuse_unbounded: bool) -> Result<DynLaunch<'a>> {
        let info = l.kernel.info();
        let bad = |message: String| Error::Launch {
            kernel: info.name.clone(),
            message,
        };
        if l.kernel.context != self.context {
            return Err(Error::InvalidArgument(format!(
                "kernel {:?} belongs to another context",
                info.name
            )));
        }
        if l.buffers.len() != info.buffers.len() {
            let names: Vec<String> = info
                .buffers
                .iter()
                .map(|p| format!("{} {}", p.binding, p.name))
                .collect();
            return Err(bad(format!(
                "it takes {} buffer(s) ({}), {} given",
                info.buffers.len(),
                names.join(", "),
                l.buffers.len()
            )));
        }
        let mut buffers = Vec::with_capacity(l.buffers.len());
        for (param, b) in info.buffers.iter().zip(l.buffers) {
            let raw = b.raw();
            if raw.context != self.context {
                return Err(bad(format!(
                    "the buffer for binding {} ({}) belongs to another context",
                    param.binding, param.name
                )));
            }
            if raw.bytes < param.min_bytes {
                return Err(Error::Size {
                    what: format!(
                        "buffer for binding {} ({}) of kernel {:?}",
                        param.binding, param.name, info.name
                    ),
                    got: format!("{} bytes", raw.bytes),
                    expected: format!("at least {} bytes", param.min_bytes),
                });
            }
            buffers.push(raw.handle.clone());
        }
        if l.push_constants.len() != info.push_constant_bytes as usize {
            return Err(Error::Size {
                what: format!("push constants of kernel {:?}", info.name),
                got: format!("{} bytes", l.push_constants.len()),
                expected: format!("{} bytes", info.push_constant_bytes),
            });
        }
        // Declared bounds are checked on every path and device: a launch that breaks them is wrong
        // even where the device would contain it.
        match l.kernel.access_bounds() {
            Some(bounds) => self.check_bounds(l, &bounds)?,
            None if refuse_unbounded => {
                let device = self.backend.device_info();
                return Err(Error::Unbounded {
                    kernel: info.name.clone(),
                    device: format!("{} ({})", device.name, device.backend),
                });
            }
            None => {}
        }
        Ok(DynLaunch {
            kernel: &*l.kernel.obj,
            groups: l.groups,
            buffers,
            push_constants: l.push_constants,
        })
    }

    /// Checks every buffer of `l` against its kernel's declared access `bounds` for this launch.
    fn check_bounds(
        &self,
        l: &LaunchDesc<'_>,
        bounds: &[super::bounds::BufferBound],
    ) -> Result<()> {
        let info = l.kernel.info();
        let device = self.backend.device_info();
        for b in bounds {
            let (Some(param), Some(buffer)) = (info.buffers.get(b.param), l.buffers.get(b.param))
            else {
                return Err(Error::Unbounded {
                    kernel: info.name.clone(),
                    device: format!(
                        "{} ({}): its declared bounds name parameter {}, which it does not have",
                        device.name, device.backend, b.param
                    ),
                });
            };
            let bytes = buffer.raw().bytes;
            let need = b.required_bytes(l.groups, info.local_size, l.push_constants);
            if need.is_none_or(|need| bytes < need) {
                return Err(Error::Size {
                    what: format!(
                        "buffer for binding {} ({}) of kernel {:?}",
                        param.binding, param.name, info.name
                    ),
                    got: format!("{bytes} bytes"),
                    expected: match need {
                        Some(need) => format!(
                            "at least {need} bytes: this launch touches {} elements of {} bytes \
                             ({} over {:?} workgroups of {:?})",
                            need / b.element_bytes.max(1),
                            b.element_bytes,
                            b.extent,
                            l.groups,
                            info.local_size
                        ),
                        None => format!(
                            "a launch whose extent ({}) fits in 64 bits and the push constants",
                            b.extent
                        ),
                    },
                });
            }
        }
        Ok(())
    }
}

/// A submitted batch of launches. Dropping it neither waits nor cancels: the launches run to the
/// end, and the backend keeps their kernels and buffers alive until then.
pub struct Event {
    // Field order is drop order: the backend's event goes before the handle on its backend.
    event: AnyEvent,
    backend: Arc<dyn DynComputeBackend>,
    names: Vec<String>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("launches", &self.names)
            .finish()
    }
}

impl Event {
    /// Blocks until every launch of the batch has finished; may be called any number of times.
    ///
    /// Errors: [`Error::Backend`] when the device reports the batch failed.
    pub fn wait(&self) -> Result<()> {
        self.backend.wait(&self.event)
    }

    /// Waits, then each launch's device execution time, in submission order; `None` where the device
    /// cannot time launches ([`crate::DeviceLimits::timestamps`]).
    ///
    /// Errors: as [`Event::wait`].
    pub fn launch_times(&self) -> Result<Option<Vec<Duration>>> {
        Ok(self.backend.launch_intervals(&self.event)?.map(|iv| {
            iv.iter()
                .map(|&(s, e)| Duration::from_nanos(e.saturating_sub(s)))
                .collect()
        }))
    }

    /// Waits, then the batch's device time from the first launch's start to the last one's end, so
    /// the gaps and barriers between its launches count; `None` where the device cannot time.
    ///
    /// Errors: as [`Event::wait`].
    pub fn device_time(&self) -> Result<Option<Duration>> {
        Ok(self.backend.launch_intervals(&self.event)?.and_then(|iv| {
            let start = iv.iter().map(|&(s, _)| s).min()?;
            let end = iv.iter().map(|&(_, e)| e).max()?;
            Some(Duration::from_nanos(end.saturating_sub(start)))
        }))
    }

    /// The kernels of the batch, in order.
    pub fn kernels(&self) -> &[String] {
        &self.names
    }
}

/// Push-constant bytes built field by field, each aligned to its own size as std430 (and the C ABI
/// for OpenCL scalar arguments) lays scalars out, in native byte order. Building never fails; the
/// length is checked against the kernel's when it is launched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushConstants(Vec<u8>);

impl PushConstants {
    /// No fields.
    pub fn new() -> Self {
        PushConstants(Vec::new())
    }
    fn field(mut self, bytes: &[u8]) -> Self {
        let align = bytes.len();
        self.0.resize(self.0.len().next_multiple_of(align), 0);
        self.0.extend_from_slice(bytes);
        self
    }
    /// Appends a `uint`.
    pub fn u32(self, v: u32) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// Appends an `int`.
    pub fn i32(self, v: i32) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// Appends a `float`.
    pub fn f32(self, v: f32) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// Appends a 64-bit unsigned integer.
    pub fn u64(self, v: u64) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// Appends a 64-bit signed integer.
    pub fn i64(self, v: i64) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// Appends a `double`.
    pub fn f64(self, v: f64) -> Self {
        self.field(&v.to_ne_bytes())
    }
    /// The bytes so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::PushConstants;

    #[test]
    fn push_constants_align_each_field() {
        let p = PushConstants::new().u32(1).f64(2.0).f32(3.0);
        assert_eq!(p.as_bytes().len(), 20);
        assert_eq!(&p.as_bytes()[8..16], &2.0f64.to_ne_bytes());
    }
}
