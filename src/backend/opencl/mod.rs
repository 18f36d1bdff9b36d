//! The OpenCL backend, on opencl3 with libOpenCL.so.1 opened at run time (no OpenCL dev package at
//! build time; no loader or no ICD at run time is `Error::Unavailable`).
//!
//! - An image is OpenCL C text (`kernels/*.cl`). Spec constants become `-D NAME=value`; the image
//!   declares which id is which name (`source.rs`). A program is built with clBuildProgram and
//!   `-cl-kernel-arg-info`, and every kernel's parameters and required workgroup size are reflected
//!   from the driver (clGetKernelArgInfo, CL_KERNEL_COMPILE_WORK_GROUP_SIZE): `global`/`constant`
//!   pointers are the launch's buffers in argument order, by-value scalars and vectors are the
//!   launch's push-constant bytes in argument order, each at its natural alignment.
//! - A program persists as a kpc container (`container.rs`) around CL_PROGRAM_BINARIES: the device
//!   fingerprint and build digest are checked before the driver sees the blob, and the reflected
//!   interface travels with it (drivers need not keep argument info for binaries). Loading is
//!   clCreateProgramWithBinary + clBuildProgram; anything refused on the way is
//!   `Error::BinaryRejected`, which the runtime treats as a miss.
//! - Launches go to one in-order queue with profiling on; a cached kernel is launchable from many
//!   threads at once ([`KernelSharing`]).
//!
//! Driver facts this backend is measured against (BENCHMARKS.md):
//! - PoCL compiles a kernel's work-group function when CL_PROGRAM_BINARIES is first queried, and
//!   again at the first launch of every new local size unless POCL_WORK_GROUP_SPECIALIZATION=0;
//!   with specialization off, the binary query's compile is the one the first launch would have
//!   needed, so querying after a build costs no extra time for a kernel that is then launched.
//! - PoCL's own kernel cache (POCL_KERNEL_CACHE, POCL_CACHE_DIR) hides cold builds; turn it off
//!   when measuring them.
//! - NVIDIA's binary is PTX text: loading it still runs the PTX JIT (CUDA_CACHE_DISABLE=1 to see it).
//!
//! The binary is made when the runtime first asks for it ([`Backend::program_binary`], which the disk
//! wiring calls right after a build) and remembered in the program. Measured (BENCHMARKS.md), the
//! first CL_PROGRAM_BINARIES query costs 65-150 ms per program on PoCL 3.1 here: free for a launched
//! kernel with POCL_WORK_GROUP_SPECIALIZATION=0 (the launch then needs no compile of its own), about
//! 10-15% of the cold build with PoCL's defaults. kpc sets no driver variable itself (changing the
//! environment of a running, threaded process is unsound); deployments set it.

mod compute;
mod container;
mod discovery;
mod interop;
mod launch;
mod meta;
mod pocl;
mod program;
mod source;

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::error_codes::ClError;
use opencl3::event::Event;
use opencl3::kernel::Kernel;

use opencl3::types::cl_mem;

use crate::backend::{
    Backend, BackendLaunch, BufferParam, DeviceFingerprint, DeviceImage, DeviceInfo, KernelInfo,
};
use crate::cache::{BuildOptions, SpecConstants};
use crate::config::{BackendKind, Config, TraceFlags};
use crate::error::{Error, Result};

pub use container::OpenClBinary;
pub use discovery::devices;
pub use interop::{OpenClHandles, OpenClKernelLease};
pub use launch::{KernelSharing, OpenClBuffer, OpenClEvent, OpenClKernel};
pub use meta::ParamKind;
pub use program::{OpenClProgram, Origin};
pub use source::SpecDecl;

use launch::Slot;

/// The spec constants an OpenCL C image declares (`// kpc-spec-constant <id> <NAME> [<TYPE>]` lines), in
/// source order.
///
/// Errors: as the build would report them: [`Error::InvalidArgument`] for an image that is not
/// OpenCL C or has a malformed declaration.
pub fn spec_constants(image: &DeviceImage) -> Result<Vec<SpecDecl>> {
    Ok(source::OpenClSource::parse(image)?.spec)
}

/// The local size of a kernel that declares no `reqd_work_group_size` (clamped to what the device
/// allows for it).
pub const DEFAULT_LOCAL_SIZE: u32 = 64;

/// CL_INVALID_WORK_GROUP_SIZE.
const INVALID_WORK_GROUP_SIZE: i32 = -54;

/// An OpenCL failure as a kpc error: out-of-memory codes are transient (`OutOfResources`), the rest
/// name the call.
pub(crate) fn cl_err(call: &'static str, e: impl ClCode) -> Error {
    match e.code() {
        // CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES, CL_OUT_OF_HOST_MEMORY
        code @ -6..=-4 => Error::OutOfResources {
            backend: BackendKind::OpenCl,
            code,
            message: format!("{call}: {}", opencl3::error_codes::error_text(code)),
        },
        code => Error::Backend {
            backend: BackendKind::OpenCl,
            call,
            code,
        },
    }
}

/// An OpenCL status code, as cl3 (`i32`) or opencl3 (`ClError`) returns it.
pub(crate) trait ClCode {
    fn code(self) -> i32;
}

impl ClCode for i32 {
    fn code(self) -> i32 {
        self
    }
}

impl ClCode for ClError {
    fn code(self) -> i32 {
        self.0
    }
}

/// How to open an OpenCL device.
/// Non-exhaustive: `OpenClOptions::default().kernel_sharing(..)`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct OpenClOptions {
    /// How concurrent launches of one cached kernel get kernel objects of their own.
    pub kernel_sharing: KernelSharing,
}

impl OpenClOptions {
    /// Sets [`OpenClOptions::kernel_sharing`].
    pub fn kernel_sharing(mut self, kernel_sharing: KernelSharing) -> Self {
        self.kernel_sharing = kernel_sharing;
        self
    }
}

#[derive(Default)]
struct Counters {
    programs_built: AtomicU64,
    programs_loaded: AtomicU64,
    binaries_rejected: AtomicU64,
    kernels_created: AtomicU64,
    launches: AtomicU64,
    batches: AtomicU64,
}

/// The OpenCL objects of one opened device. The backend and everything made on it (programs, and
/// through them kernels; buffers; events) hold it, so the queue and context are released after the
/// last of those, whatever order the runtime drops things in. (A `Context` drops its backend before
/// its cached programs; with the context released first, PoCL 5.0 failed an assertion in
/// pocl_release_dlhandle_cache in 1 of 3 parallel runs of tests/opencl_kernels.rs, and in none of 5
/// with this ordering.)
pub(crate) struct Shared {
    // Field order is drop order: the queue (finished in Drop) goes before the context.
    pub(crate) queue: CommandQueue,
    pub(crate) context: Context,
    pub(crate) device: Device,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Nothing made on this device is left, but work may still be queued; let it finish before
        // the queue and context go. An error here has nowhere to go.
        let _ = self.queue.finish();
    }
}

/// One opened OpenCL device: kpc's [`Backend`] and
/// [`ComputeBackend`](crate::backend::ComputeBackend) on OpenCL.
pub struct OpenClBackend {
    shared: Arc<Shared>,
    info: DeviceInfo,
    max_alloc: u64,
    max_parameter_bytes: u64,
    max_global: u64,
    profiled: bool,
    options: OpenClOptions,
    trace: bool,
    counters: Counters,
    /// PoCL: launches are serialized across the process (`pocl.rs`).
    serialize_launches: bool,
}

impl std::fmt::Debug for OpenClBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClBackend")
            .field("device", &self.info.name)
            .field("index", &self.info.index)
            .finish()
    }
}

impl OpenClBackend {
    /// Opens device `index` of [`devices`] with one in-order queue (profiling on where supported).
    ///
    /// Errors: [`Error::Unavailable`] when there is no loader, ICD or device, or the device cannot
    /// run kpc; [`Error::NoSuchDevice`] for an index past the last device.
    pub fn open(index: usize, config: &Config) -> Result<OpenClBackend> {
        OpenClBackend::open_with(index, config, &OpenClOptions::default())
    }

    /// [`OpenClBackend::open`] with explicit options.
    pub fn open_with(
        index: usize,
        config: &Config,
        options: &OpenClOptions,
    ) -> Result<OpenClBackend> {
        let mut found = discovery::enumerate()?;
        if index >= found.len() {
            return Err(Error::NoSuchDevice {
                selector: format!("opencl:{index}"),
                available: found
                    .iter()
                    .map(|f| format!("opencl:{} {}", f.info.index, f.info.name))
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
        let f = found.swap_remove(index);
        if let Some(why) = &f.info.unusable {
            return Err(discovery::unavailable(format!(
                "device {index} ({}): {why}",
                f.info.name
            )));
        }
        let context = Context::from_device(&f.device).map_err(|e| cl_err("clCreateContext", e))?;
        let profiled = f.info.limits.timestamps;
        let props = if profiled {
            discovery::QUEUE_PROFILING
        } else {
            0
        };
        // clCreateCommandQueue (OpenCL 1.x, present in every ICD) rather than the 2.0
        // ...WithProperties, so that 1.2 platforms work too.
        // SAFETY: the device is the one the context was created for.
        let queue = unsafe { CommandQueue::create(&context, f.device.id(), props) }
            .map_err(|e| cl_err("clCreateCommandQueue", e))?;
        Ok(OpenClBackend::assemble(
            f,
            context,
            queue,
            profiled,
            options.clone(),
            config,
        ))
    }

    /// A backend over a described device and its context and queue, whoever created them (kpc in
    /// `open_with`, the embedder in `from_handles`).
    pub(crate) fn assemble(
        f: discovery::Found,
        context: Context,
        queue: CommandQueue,
        profiled: bool,
        options: OpenClOptions,
        config: &Config,
    ) -> OpenClBackend {
        let serialize_launches = pocl::is_pocl(&f.info.driver);
        OpenClBackend {
            serialize_launches,
            shared: Arc::new(Shared {
                queue,
                context,
                device: f.device,
            }),
            info: f.info,
            max_alloc: f.max_alloc,
            max_parameter_bytes: f.max_parameter_bytes,
            max_global: f.max_global,
            profiled,
            options,
            trace: config.trace.contains(TraceFlags::BUILDS),
            counters: Counters::default(),
        }
    }

    /// The options the device was opened with.
    pub fn options(&self) -> &OpenClOptions {
        &self.options
    }

    fn trace_program(&self, image: &str, how: &str, took: Duration, ok: bool) {
        if self.trace {
            tracing::info!(
                target: "kpc::build",
                backend = "opencl",
                image,
                how,
                ok,
                ms = took.as_secs_f64() * 1e3,
                "clBuildProgram"
            );
        }
    }

    fn kernel_info(&self, program: &OpenClProgram, entry: &str) -> Result<(KernelInfo, Vec<Slot>)> {
        let meta = program
            .kernels
            .iter()
            .find(|k| k.name == entry)
            .ok_or_else(|| Error::UnknownKernel {
                image: program.image.clone(),
                entry: entry.to_string(),
                available: program.kernel_names().collect::<Vec<_>>().join(", "),
            })?;
        let mut buffers = Vec::new();
        let mut slots = Vec::with_capacity(meta.params.len());
        let mut push = 0usize;
        for (index, p) in meta.params.iter().enumerate() {
            match &p.kind {
                ParamKind::Buffer { read_only } => {
                    slots.push(Slot::Buffer(buffers.len()));
                    buffers.push(BufferParam {
                        binding: index as u32,
                        name: p.name.clone(),
                        read_only: *read_only,
                        min_bytes: 0,
                    });
                }
                ParamKind::Scalar { size, align } => {
                    let offset = push.next_multiple_of(*align as usize);
                    slots.push(Slot::Scalar {
                        offset,
                        size: *size as usize,
                    });
                    push = offset + *size as usize;
                }
                ParamKind::Unsupported(why) => {
                    return Err(Error::InvalidArgument(format!(
                        "kernel {entry:?} of {:?}: parameter {index} ({}) cannot be passed by kpc: {why}",
                        program.image, p.name
                    )));
                }
            }
        }
        if push as u64 > self.max_parameter_bytes {
            return Err(Error::InvalidArgument(format!(
                "kernel {entry:?} takes {push} bytes of scalar arguments; the device allows {}",
                self.max_parameter_bytes
            )));
        }
        Ok((
            KernelInfo {
                name: meta.name.clone(),
                buffers,
                push_constant_bytes: push as u32,
                local_size: meta.reqd_local_size,
                driver_cache_hit: None,
                driver_stats: Vec::new(),
            },
            slots,
        ))
    }

    fn enqueue(&self, l: &BackendLaunch<'_, Self>) -> Result<Event> {
        let k = l.kernel;
        // The runtime's queue checks these too; the backend is public, so it checks what set_args
        // relies on rather than trusting every caller.
        if l.buffers.len() != k.info.buffers.len()
            || l.push_constants.len() != k.info.push_constant_bytes as usize
        {
            return Err(Error::Launch {
                kernel: k.info.name.clone(),
                message: format!(
                    "it takes {} buffer(s) and {} push-constant bytes; {} and {} given",
                    k.info.buffers.len(),
                    k.info.push_constant_bytes,
                    l.buffers.len(),
                    l.push_constants.len()
                ),
            });
        }
        let local = k.info.local_size.map(|s| s as usize);
        let mut global = [0usize; 3];
        for (d, g) in global.iter_mut().enumerate() {
            let items = u64::from(l.groups[d]) * u64::from(k.info.local_size[d]);
            *g = usize::try_from(items)
                .ok()
                .filter(|_| items <= self.max_global)
                .ok_or_else(|| Error::Launch {
                    kernel: k.info.name.clone(),
                    message: format!(
                        "{:?} workgroups of {:?} exceed the device's global size limit of {} \
                         work-items per dimension",
                        l.groups, local, self.max_global
                    ),
                })?;
        }
        if global.contains(&0) {
            // An empty grid is a no-op (as a Vulkan dispatch of zero groups), but OpenCL 1.2 rejects
            // a zero global size: a marker keeps the batch's one-event-per-launch shape.
            // SAFETY: the queue is alive; no wait list.
            let ev = unsafe {
                opencl3::command_queue::enqueue_marker_with_wait_list(
                    self.shared.queue.get(),
                    0,
                    std::ptr::null(),
                )
            }
            .map_err(|e| cl_err("clEnqueueMarkerWithWaitList", e))?;
            return Ok(Event::new(ev));
        }
        let mems: Vec<cl_mem> = l.buffers.iter().map(|b| b.raw()).collect();
        k.with_object(|kernel| {
            // SAFETY: `with_object` hands this thread exclusive use of `kernel`; the buffers are
            // alive (the launch holds them) and as many as the kernel's buffer slots; the push
            // constants are `push_constant_bytes` long, which covers every scalar slot (both
            // checked above).
            unsafe { launch::set_args(k, kernel, &mems, l.push_constants) }?;
            // SAFETY: the queue, kernel and every argument are valid; the size arrays hold 3
            // entries; the local size divides the global size by construction.
            let ev = unsafe {
                opencl3::command_queue::enqueue_nd_range_kernel(
                    self.shared.queue.get(),
                    kernel,
                    3,
                    std::ptr::null(),
                    global.as_ptr(),
                    local.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            }
            .map_err(|e| match e {
                code @ -6..=-4 => cl_err("clEnqueueNDRangeKernel", ClError(code)),
                code => Error::Launch {
                    kernel: k.info.name.clone(),
                    message: format!(
                        "clEnqueueNDRangeKernel failed ({}) for global {global:?}, local {local:?}",
                        program::cl_text(ClError(code))
                    ),
                },
            })?;
            Ok(Event::new(ev))
        })
    }
}

impl Backend for OpenClBackend {
    type Program = OpenClProgram;
    type Kernel = OpenClKernel;

    fn kind(&self) -> BackendKind {
        BackendKind::OpenCl
    }

    fn fingerprint(&self) -> &DeviceFingerprint {
        &self.info.fingerprint
    }

    fn build_program(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<OpenClProgram> {
        let start = Instant::now();
        let r = program::build(&self.shared, &self.info.fingerprint, image, spec, options);
        self.trace_program(image.name(), "from source", start.elapsed(), r.is_ok());
        if r.is_ok() {
            self.counters.programs_built.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// The program's kpc container. The first call per program queries CL_PROGRAM_BINARIES, which
    /// PoCL pays for by compiling every kernel's work-group function (see the module docs for
    /// when that is time the first launch would have spent anyway); later calls return the same
    /// bytes at once.
    fn program_binary(&self, program: &OpenClProgram) -> Result<Option<Vec<u8>>> {
        Ok(Some(program.binary()?.to_vec()))
    }

    fn program_from_binary(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
        binary: &[u8],
    ) -> Result<OpenClProgram> {
        let start = Instant::now();
        let r = program::load(
            &self.shared,
            &self.info.fingerprint,
            image,
            spec,
            options,
            binary,
        );
        self.trace_program(image.name(), "from binary", start.elapsed(), r.is_ok());
        match r {
            Ok(p) => {
                self.counters
                    .programs_loaded
                    .fetch_add(1, Ordering::Relaxed);
                Ok(p)
            }
            Err(reason) => {
                self.counters
                    .binaries_rejected
                    .fetch_add(1, Ordering::Relaxed);
                Err(Error::BinaryRejected {
                    backend: BackendKind::OpenCl,
                    image: image.name().to_string(),
                    reason,
                })
            }
        }
    }

    fn create_kernel(&self, program: &Arc<OpenClProgram>, entry: &str) -> Result<OpenClKernel> {
        let (mut info, slots) = self.kernel_info(program, entry)?;
        // The entry exists (kernel_info found it), and names from the driver hold no NUL.
        let c_entry = CString::new(entry).map_err(|_| Error::UnknownKernel {
            image: program.image.clone(),
            entry: entry.to_string(),
            available: program.kernel_names().collect::<Vec<_>>().join(", "),
        })?;
        let first = Kernel::new(
            opencl3::kernel::create_kernel(program.program.get(), &c_entry)
                .map_err(|e| cl_err("clCreateKernel", e))?,
        );
        let max_wg = first
            .get_work_group_size(self.shared.device.id())
            .map_err(|e| cl_err("clGetKernelWorkGroupInfo", e))?;
        if info.local_size == [0, 0, 0] {
            info.local_size = [DEFAULT_LOCAL_SIZE.min(max_wg as u32).max(1), 1, 1];
        }
        // What the driver says about the compiled kernel, as Vulkan's executable statistics do;
        // a query the driver refuses is left out (they only inform).
        let dev = self.shared.device.id();
        info.driver_stats = [
            (
                "work-group size limit",
                first.get_work_group_size(dev).map(|v| v as u64),
            ),
            (
                "work-group size multiple",
                first.get_work_group_size_multiple(dev).map(|v| v as u64),
            ),
            ("private memory bytes", first.get_private_mem_size(dev)),
            ("local memory bytes", first.get_local_mem_size(dev)),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.ok().map(|v| (name.to_string(), v.to_string())))
        .collect();
        let invocations: u64 = info.local_size.iter().map(|&s| u64::from(s)).product();
        if invocations > max_wg as u64 {
            return Err(Error::Build {
                backend: BackendKind::OpenCl,
                image: program.image.clone(),
                code: INVALID_WORK_GROUP_SIZE,
                message: format!(
                    "kernel {entry:?} requires workgroups of {:?} ({invocations} work-items); on \
                     this device it allows at most {max_wg}",
                    info.local_size
                ),
                log: String::new(),
            });
        }
        self.counters
            .kernels_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(OpenClKernel::new(
            info,
            slots,
            max_wg,
            first,
            c_entry,
            program.clone(),
            self.options.kernel_sharing,
        ))
    }
}
