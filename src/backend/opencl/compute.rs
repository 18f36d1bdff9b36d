//! The compute half of the OpenCL backend: buffers, launches, events and counters (the program half,
//! build and binaries, is `OpenClBackend`'s `Backend` implementation beside it).

use std::sync::atomic::{AtomicU64, Ordering};

use opencl3::event::Event;
use opencl3::memory::{Buffer as ClBuffer, CL_MEM_READ_WRITE, ClMem};

use super::{OpenClBackend, OpenClBuffer, OpenClEvent, cl_err};
use crate::backend::{BackendLaunch, BackendStats, ComputeBackend, DeviceInfo};
use crate::error::{Error, Result};

impl ComputeBackend for OpenClBackend {
    type Buffer = OpenClBuffer;
    type Event = OpenClEvent;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn create_buffer(&self, bytes: u64) -> Result<OpenClBuffer> {
        if bytes > self.max_alloc {
            return Err(Error::Size {
                what: "an OpenCL buffer".into(),
                got: format!("{bytes} bytes"),
                expected: format!(
                    "at most {} bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                    self.max_alloc
                ),
            });
        }
        let size = usize::try_from(bytes.max(1)).map_err(|_| Error::Size {
            what: "an OpenCL buffer".into(),
            got: format!("{bytes} bytes"),
            expected: "a size that fits in this host's address space".into(),
        })?;
        // SAFETY: no host pointer is passed, so the driver allocates and owns the memory.
        let mem = unsafe {
            ClBuffer::<u8>::create(
                &self.shared.context,
                CL_MEM_READ_WRITE,
                size,
                std::ptr::null_mut(),
            )
        }
        .map_err(|e| cl_err("clCreateBuffer", e))?;
        Ok(OpenClBuffer {
            mem,
            bytes,
            _device: self.shared.clone(),
        })
    }

    fn write_buffer(&self, buffer: &OpenClBuffer, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: a blocking write: `data` is read before the call returns; the caller checked that
        // offset + len lies inside the buffer; the in-order queue orders it after earlier launches.
        let ev = unsafe {
            opencl3::command_queue::enqueue_write_buffer(
                self.shared.queue.get(),
                buffer.raw(),
                opencl3::types::CL_BLOCKING,
                offset as usize,
                data.len(),
                data.as_ptr().cast(),
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| cl_err("clEnqueueWriteBuffer", e))?;
        drop(Event::new(ev));
        Ok(())
    }

    fn read_buffer(&self, buffer: &OpenClBuffer, offset: u64, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: a blocking read: `out` is written before the call returns and no one else holds
        // it; the caller checked the range; the in-order queue orders it after earlier launches.
        let ev = unsafe {
            opencl3::command_queue::enqueue_read_buffer(
                self.shared.queue.get(),
                buffer.raw(),
                opencl3::types::CL_BLOCKING,
                offset as usize,
                out.len(),
                out.as_mut_ptr().cast(),
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| cl_err("clEnqueueReadBuffer", e))?;
        drop(Event::new(ev));
        Ok(())
    }

    fn submit(&self, launches: &[BackendLaunch<'_, Self>]) -> Result<OpenClEvent> {
        // PoCL aborts when two queues run one kernel with different grids at once (`pocl.rs`).
        let serial = self
            .serialize_launches
            .then(super::pocl::serialize_launches);
        let mut events = Vec::with_capacity(launches.len());
        let mut buffers = Vec::new();
        let enqueued = (|| {
            for l in launches {
                events.push(self.enqueue(l)?);
                buffers.extend(l.buffers.iter().cloned());
            }
            // Drivers may hold enqueued work until a flush; start it now.
            self.shared.queue.flush().map_err(|e| cl_err("clFlush", e))
        })();
        if let Err(e) = enqueued {
            if serial.is_some() {
                // What did reach the queue completes before the lock goes.
                let _ = self.shared.queue.finish();
            }
            return Err(e);
        }
        self.counters
            .launches
            .fetch_add(launches.len() as u64, Ordering::Relaxed);
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let event = OpenClEvent {
            events,
            _buffers: buffers,
            _device: self.shared.clone(),
            profiled: self.profiled,
        };
        if serial.is_some() {
            // Completed before another queue may start a launch; the lock goes after the wait.
            event.wait()?;
        }
        drop(serial);
        Ok(event)
    }

    fn wait(&self, event: &OpenClEvent) -> Result<()> {
        event.wait()
    }

    fn launch_intervals(&self, event: &OpenClEvent) -> Result<Option<Vec<(u64, u64)>>> {
        event.launch_intervals()
    }

    fn finish(&self) -> Result<()> {
        self.shared
            .queue
            .finish()
            .map_err(|e| cl_err("clFinish", e))
    }

    unsafe fn import_buffer(
        &self,
        foreign: &crate::backend::ForeignBuffer,
    ) -> Result<OpenClBuffer> {
        let crate::backend::ForeignBuffer::OpenCl { mem, size } = *foreign else {
            return Err(Error::InvalidArgument(
                "a VkBuffer cannot be imported into an OpenCL context".into(),
            ));
        };
        if mem == 0 {
            return Err(Error::InvalidArgument("the imported cl_mem is NULL".into()));
        }
        let raw = mem as opencl3::types::cl_mem;
        // SAFETY: the caller guarantees a live cl_mem; the retain is the reference the wrapper
        // below releases when it drops (on the error paths too).
        unsafe { opencl3::memory::retain_mem_object(raw) }
            .map_err(|e| cl_err("clRetainMemObject", e))?;
        let mem = ClBuffer::<u8>::new(raw);
        let owner = mem
            .context()
            .map_err(|e| cl_err("clGetMemObjectInfo(CL_MEM_CONTEXT)", e))?;
        if owner != self.shared.context.get() {
            return Err(Error::InvalidArgument(
                "the imported cl_mem belongs to another cl_context than this kpc context's".into(),
            ));
        }
        let have = mem
            .size()
            .map_err(|e| cl_err("clGetMemObjectInfo(CL_MEM_SIZE)", e))? as u64;
        if size == 0 || size > have {
            return Err(Error::Size {
                what: "imported cl_mem".into(),
                got: format!("{size} bytes asked for"),
                expected: format!("1 to {have} bytes (CL_MEM_SIZE of the cl_mem)"),
            });
        }
        Ok(OpenClBuffer {
            mem,
            bytes: size,
            _device: self.shared.clone(),
        })
    }

    fn stats(&self) -> BackendStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        BackendStats {
            programs_built: l(&c.programs_built),
            programs_loaded: l(&c.programs_loaded),
            // OpenCL reports nothing about what loading a binary compiled (NVIDIA's PTX JIT).
            programs_loaded_recompiled: 0,
            binaries_rejected: l(&c.binaries_rejected),
            driver_cache_hits: 0,
            driver_cache_misses: 0,
            // OpenCL drivers say nothing about their own caches.
            driver_cache_unknown: l(&c.kernels_created),
            launches: l(&c.launches),
            batches: l(&c.batches),
        }
    }
}
