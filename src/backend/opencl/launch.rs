//! Kernels, buffers and launches on an OpenCL in-order queue.
//!
//! A `cl_kernel` holds its argument values, and clSetKernelArg on one kernel object from two threads
//! at once is undefined (so is clCloneKernel of it while another thread sets its arguments). A cached
//! kernel is shared by every thread of a context, so each launch needs a kernel object that no other
//! thread is setting arguments on. [`KernelSharing`] says how; the default is the one that measured
//! fastest (see its documentation).

use std::ffi::{CString, c_void};
use std::sync::Arc;

use opencl3::event::Event;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer as ClBuffer, ClMem};
use opencl3::types::{cl_event, cl_kernel, cl_mem};
use parking_lot::Mutex;

use crate::backend::{KernelInfo, KernelObject, ProgramOrigin};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::cl_err;
use super::program::OpenClProgram;

/// How launches of one cached kernel from many threads get a kernel object of their own.
///
/// Measured on PoCL 3.1 (CPU, a shared 2-core VM), 1 and 32 threads each launching the same cached
/// saxpy kernel (n = 1024) 500 times with their own buffers, microseconds per launch, median of 7,
/// two runs (`kpc bench-launch --threads 1,32 --launches 500 --repeat 7`; BENCHMARKS.md):
///
/// | strategy | enqueue, 1 thread | enqueue, 32 threads | launch + wait, 32 threads |
/// |---|---|---|---|
/// | `Pool`           | 3.2 / 2.9  | 2.1 / 2.5 | 16.3 / 11.9 |
/// | `ClonePerLaunch` | 1.6 / 10.7 | 4.0 / 6.0 | 12.8 / 13.6 |
/// | `Lock`           | 3.9 / 6.4  | 3.4 / 3.4 | 16.9 / 16.7 |
///
/// On the GPU host (PoCL 5.0 on 16 quiet cores; NVIDIA H200), enqueue with 32 threads: pool 1.7 /
/// 3.4, clone per launch 16.3 / 3.8, lock 3.5 / 5.2.
///
/// One thread is within noise; under contention the pool enqueues fastest in every run, and when
/// each launch is waited for PoCL's execution dominates and all three tie. `Pool` is the default: no
/// lock is held across clSetKernelArg + clEnqueueNDRangeKernel, and no kernel object is made per
/// launch once the pool holds one per concurrently launching thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelSharing {
    /// A free list of kernel objects per cached kernel: a launch takes one (creating one with
    /// clCreateKernel when the list is empty), sets its arguments, enqueues, and puts it back.
    /// clEnqueueNDRangeKernel captures argument values, so the object is free again as soon as the
    /// enqueue returns.
    #[default]
    Pool,
    /// clCloneKernel per launch (under a lock, which clCloneKernel of a shared kernel needs), then
    /// set arguments, enqueue, release. Falls back to clCreateKernel where the driver has no
    /// clCloneKernel (OpenCL < 2.1).
    ClonePerLaunch,
    /// One kernel object behind a mutex held across clSetKernelArg and clEnqueueNDRangeKernel.
    Lock,
}

/// A device buffer: a `cl_mem` of `bytes` bytes (at least one: OpenCL has no empty buffers).
pub struct OpenClBuffer {
    pub(crate) mem: ClBuffer<u8>,
    pub(crate) bytes: u64,
    // Released after `mem`: the context outlives every buffer made in it.
    pub(crate) _device: Arc<super::Shared>,
}

impl std::fmt::Debug for OpenClBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClBuffer")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl OpenClBuffer {
    /// Its size in bytes, as asked for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub(crate) fn raw(&self) -> cl_mem {
        self.mem.get()
    }
}

/// Where a kernel argument's value comes from at a launch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Slot {
    /// The launch's buffer at this position.
    Buffer(usize),
    /// These bytes of the launch's push constants.
    Scalar { offset: usize, size: usize },
}

enum Objects {
    Pool(Mutex<Vec<Kernel>>),
    Clone(Mutex<Kernel>),
    Lock(Mutex<Kernel>),
}

/// Most idle kernel objects a pool keeps; more concurrent launches than this create and drop
/// objects instead of growing the pool without bound.
const POOL_MAX_IDLE: usize = 64;

/// A kernel of an OpenCL program, launchable from many threads at once.
pub struct OpenClKernel {
    pub(crate) info: KernelInfo,
    pub(crate) slots: Vec<Slot>,
    /// CL_KERNEL_WORK_GROUP_SIZE on this device.
    pub(crate) max_work_group_size: usize,
    objects: Objects,
    entry: CString,
    // Keeps the cl_program alive while kernel objects may still be created from it.
    program: Arc<OpenClProgram>,
}

impl std::fmt::Debug for OpenClKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClKernel")
            .field("info", &self.info)
            .finish()
    }
}

impl KernelObject for OpenClKernel {
    fn info(&self) -> &KernelInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn origin(&self) -> Option<&ProgramOrigin> {
        Some(&self.program.built_from)
    }
    fn program_binary(&self) -> Result<Option<Vec<u8>>> {
        Ok(Some(self.program.binary()?.to_vec()))
    }
}

impl OpenClKernel {
    pub(crate) fn new(
        info: KernelInfo,
        slots: Vec<Slot>,
        max_work_group_size: usize,
        first: Kernel,
        entry: CString,
        program: Arc<OpenClProgram>,
        sharing: KernelSharing,
    ) -> Self {
        let objects = match sharing {
            KernelSharing::Pool => Objects::Pool(Mutex::new(vec![first])),
            KernelSharing::ClonePerLaunch => Objects::Clone(Mutex::new(first)),
            KernelSharing::Lock => Objects::Lock(Mutex::new(first)),
        };
        OpenClKernel {
            info,
            slots,
            max_work_group_size,
            objects,
            entry,
            program,
        }
    }

    /// How launches get a kernel object of their own.
    pub fn sharing(&self) -> KernelSharing {
        match self.objects {
            Objects::Pool(_) => KernelSharing::Pool,
            Objects::Clone(_) => KernelSharing::ClonePerLaunch,
            Objects::Lock(_) => KernelSharing::Lock,
        }
    }

    /// CL_KERNEL_WORK_GROUP_SIZE: the most work-items a workgroup of this kernel may have here.
    pub fn max_work_group_size(&self) -> usize {
        self.max_work_group_size
    }

    /// Idle kernel objects in the pool (0 for other strategies): how many threads launched it at once.
    pub fn pooled_objects(&self) -> usize {
        match &self.objects {
            Objects::Pool(p) => p.lock().len(),
            _ => 0,
        }
    }

    fn create_object(&self) -> Result<Kernel> {
        let k = opencl3::kernel::create_kernel(self.program.program.get(), &self.entry)
            .map_err(|e| cl_err("clCreateKernel", e))?;
        Ok(Kernel::new(k))
    }

    /// A kernel object for one holder's exclusive use (an interop lease): an idle one of the pool,
    /// else a new one. `Lock` and `ClonePerLaunch` have no idle objects to lend, so they always
    /// create one; their launches never see it.
    pub(crate) fn lend_object(&self) -> Result<Kernel> {
        if let Objects::Pool(p) = &self.objects
            && let Some(k) = p.lock().pop()
        {
            return Ok(k);
        }
        self.create_object()
    }

    /// Takes back an object [`OpenClKernel::lend_object`] lent: into the pool where launches share
    /// one (every launch sets every argument, so what the holder set does not leak into it),
    /// released otherwise.
    pub(crate) fn return_object(&self, k: Kernel) {
        if let Objects::Pool(p) = &self.objects {
            let mut idle = p.lock();
            if idle.len() < POOL_MAX_IDLE {
                idle.push(k);
            }
        }
    }

    /// Runs `f` with a kernel object no other thread is setting arguments on.
    pub(crate) fn with_object<T>(&self, f: impl FnOnce(cl_kernel) -> Result<T>) -> Result<T> {
        match &self.objects {
            Objects::Lock(m) => {
                let k = m.lock();
                f(k.get())
            }
            Objects::Pool(p) => {
                let taken = p.lock().pop();
                let k = match taken {
                    Some(k) => k,
                    None => self.create_object()?,
                };
                let r = f(k.get());
                // Every launch sets every argument, so an object whose launch failed half-way is as
                // good as any.
                let mut idle = p.lock();
                if idle.len() < POOL_MAX_IDLE {
                    idle.push(k);
                }
                r
            }
            Objects::Clone(template) => {
                let cloned = {
                    let t = template.lock();
                    opencl3::kernel::clone_kernel(t.get())
                };
                let k = match cloned {
                    Ok(k) => Kernel::new(k),
                    // No clCloneKernel (an OpenCL 1.2 driver): a fresh object is equivalent, since
                    // every argument is set before the enqueue.
                    Err(_) => self.create_object()?,
                };
                f(k.get())
            }
        }
    }
}

/// Sets every argument of `kernel` for one launch.
///
/// # Safety
/// `kernel` must be a kernel object of `k`'s program that no other thread uses now; every buffer
/// must be alive; `push` must be at least as long as every scalar slot's end (the runtime checked
/// its length against `KernelInfo::push_constant_bytes`, which covers every slot).
pub(crate) unsafe fn set_args(
    k: &OpenClKernel,
    kernel: cl_kernel,
    buffers: &[cl_mem],
    push: &[u8],
) -> Result<()> {
    for (index, slot) in k.slots.iter().enumerate() {
        let (size, ptr): (usize, *const c_void) = match *slot {
            Slot::Buffer(i) => (
                std::mem::size_of::<cl_mem>(),
                std::ptr::from_ref(&buffers[i]).cast(),
            ),
            Slot::Scalar { offset, size } => (size, push[offset..offset + size].as_ptr().cast()),
        };
        // SAFETY: the caller guarantees exclusive use of `kernel`; `ptr` points at `size` readable
        // bytes (a cl_mem handle, or a slice of the push constants bounds-checked above) that the
        // driver copies before returning.
        unsafe { opencl3::kernel::set_kernel_arg(kernel, index as u32, size, ptr) }
            .map_err(|e| launch_err(k, "clSetKernelArg", e, index))?;
    }
    Ok(())
}

fn launch_err(k: &OpenClKernel, call: &str, code: i32, index: usize) -> Error {
    if matches!(code, -6..=-4) {
        return Error::OutOfResources {
            backend: BackendKind::OpenCl,
            code,
            message: format!("{call} for kernel {:?}", k.info.name),
        };
    }
    Error::Launch {
        kernel: k.info.name.clone(),
        message: format!(
            "{call} failed for argument {index} ({})",
            super::program::cl_text(opencl3::error_codes::ClError(code))
        ),
    }
}

/// A submitted batch: one event per launch, and the buffers it uses (kept alive until it is gone).
pub struct OpenClEvent {
    pub(crate) events: Vec<Event>,
    pub(crate) _buffers: Vec<Arc<OpenClBuffer>>,
    pub(crate) _device: Arc<super::Shared>,
    pub(crate) profiled: bool,
}

impl std::fmt::Debug for OpenClEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClEvent")
            .field("launches", &self.events.len())
            .finish()
    }
}

impl OpenClEvent {
    /// Blocks until every launch of the batch has finished.
    pub fn wait(&self) -> Result<()> {
        if self.events.is_empty() {
            return Ok(());
        }
        let raw: Vec<cl_event> = self.events.iter().map(Event::get).collect();
        opencl3::event::wait_for_events(&raw).map_err(|e| cl_err("clWaitForEvents", e))
    }

    /// Waits, then each launch's device start and end (ns) from its profiling counters.
    pub fn launch_intervals(&self) -> Result<Option<Vec<(u64, u64)>>> {
        self.wait()?;
        if !self.profiled {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(self.events.len());
        for e in &self.events {
            let start = e
                .profiling_command_start()
                .map_err(|e| cl_err("clGetEventProfilingInfo", e))?;
            let end = e
                .profiling_command_end()
                .map_err(|e| cl_err("clGetEventProfilingInfo", e))?;
            out.push((start, end.max(start)));
        }
        Ok(Some(out))
    }
}
