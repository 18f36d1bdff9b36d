//! Submissions: command buffers, fences, per-batch descriptor and timestamp pools, and the in-order
//! queue discipline.
//!
//! Every command buffer starts with a memory barrier over kernels and copies, so a submission
//! begins only after everything submitted before it has finished writing: the queue behaves in
//! order, as SYCL's in-order queue and OpenCL's default queue do. A command buffer whose writes
//! the host reads through a mapping (a download's staging copy; any launch where buffers are
//! mapped, on CPU devices) ends with a barrier that makes them visible to the host, so a signaled
//! fence means the results can be read.

use std::any::Any;
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;

use crate::error::Result;

use super::device::{Device, Recycled, vk_err};
use super::queue_lock::{QueueLock, VulkanQueueLock};

/// One submitted batch: what must live until it has finished, and its timestamps.
pub struct Record {
    dev: Arc<Device>,
    fence: vk::Fence,
    pub(crate) descriptor_pool: vk::DescriptorPool,
    /// Whether `descriptor_pool` has the standard size and returns to the device's spares.
    pub(crate) descriptor_pool_kept: bool,
    pub(crate) query_pool: vk::QueryPool,
    /// Whether `query_pool` has the standard size and returns to the device's spares.
    query_pool_kept: bool,
    /// Whether `query_pool` was reset from the host, so the batch need not reset it.
    query_pool_reset: bool,
    /// Launches timed by the query pool (two timestamps each).
    pub(crate) timed: u32,
    submitted: bool,
    /// Set once the batch is known finished: its timestamps read out and its pools handed back,
    /// so that events held long after (a benchmark keeping every step's event) do not keep pools
    /// from the next submissions.
    finished: Mutex<Finished>,
    /// Buffers and pipelines the batch uses, kept alive until its fence has signaled.
    pub(crate) keep_alive: Vec<Arc<dyn Any + Send + Sync>>,
}

#[derive(Default)]
struct Finished {
    /// The pools are no longer this record's.
    released: bool,
    /// The raw timestamps, read before the timestamp pool was handed back.
    ticks: Option<Vec<u64>>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("timed", &self.timed)
            .field("submitted", &self.submitted)
            .finish()
    }
}

impl Record {
    /// A record with an unsignaled fence and, when asked, a timestamp pool for `timed` launches,
    /// reusing spares of finished batches where there are.
    pub(crate) fn new(dev: &Arc<Device>, timed: u32) -> Result<Record> {
        let mut r = Record {
            dev: dev.clone(),
            fence: vk::Fence::null(),
            descriptor_pool: vk::DescriptorPool::null(),
            descriptor_pool_kept: false,
            query_pool: vk::QueryPool::null(),
            query_pool_kept: false,
            query_pool_reset: false,
            timed: 0,
            submitted: false,
            finished: Mutex::new(Finished::default()),
            keep_alive: Vec::new(),
        };
        let want_queries = timed > 0 && dev.timestamp_valid_bits > 0;
        // Spares were reset from the host when they were handed back, where the device can.
        let host_reset = dev.host_query_reset;
        let kept = want_queries && timed <= Recycled::QUERY_LAUNCHES;
        {
            let mut spare = dev.recycled.lock();
            r.fence = spare.fences.pop().unwrap_or(vk::Fence::null());
            if kept {
                r.query_pool = spare.query_pools.pop().unwrap_or(vk::QueryPool::null());
            }
        }
        if r.fence == vk::Fence::null() {
            // SAFETY: plain object creation on a live device; `r` owns the handle (Drop).
            r.fence = unsafe { dev.raw.create_fence(&vk::FenceCreateInfo::default(), None) }
                .map_err(|e| vk_err("vkCreateFence", e))?;
        }
        if want_queries {
            if r.query_pool == vk::QueryPool::null() {
                let count = if kept {
                    Recycled::QUERY_LAUNCHES
                } else {
                    timed
                };
                let info = vk::QueryPoolCreateInfo::default()
                    .query_type(vk::QueryType::TIMESTAMP)
                    .query_count(2 * count);
                // SAFETY: as above.
                r.query_pool = unsafe { dev.raw.create_query_pool(&info, None) }
                    .map_err(|e| vk_err("vkCreateQueryPool", e))?;
                if host_reset {
                    // SAFETY: the pool is new, so no batch uses it; hostQueryReset was enabled
                    // (Device::host_query_reset).
                    unsafe { dev.raw.reset_query_pool(r.query_pool, 0, 2 * count) };
                }
            }
            r.query_pool_reset = host_reset;
            r.query_pool_kept = kept;
            r.timed = timed;
        }
        Ok(r)
    }

    /// A descriptor pool for `sets` sets of `storage` storage and `uniform` uniform descriptors:
    /// a spare of the standard size where the batch fits one, else its own.
    pub(crate) fn descriptor_pool(&mut self, sets: u32, storage: u32, uniform: u32) -> Result<()> {
        let fits =
            sets <= Recycled::SETS && storage <= Recycled::STORAGE && uniform <= Recycled::UNIFORM;
        if fits && let Some(p) = self.dev.recycled.lock().descriptor_pools.pop() {
            self.descriptor_pool = p;
            self.descriptor_pool_kept = true;
            return Ok(());
        }
        let (sets, storage, uniform) = if fits {
            (Recycled::SETS, Recycled::STORAGE, Recycled::UNIFORM)
        } else {
            (sets, storage, uniform)
        };
        let mut sizes = Vec::new();
        if storage > 0 {
            sizes.push(vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: storage,
            });
        }
        if uniform > 0 {
            sizes.push(vk::DescriptorPoolSize {
                ty: vk::DescriptorType::UNIFORM_BUFFER,
                descriptor_count: uniform,
            });
        }
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(sets)
            .pool_sizes(&sizes);
        // SAFETY: plain object creation; owned by the record (Drop keeps or destroys it).
        self.descriptor_pool = unsafe { self.dev.raw.create_descriptor_pool(&info, None) }
            .map_err(|e| vk_err("vkCreateDescriptorPool", e))?;
        self.descriptor_pool_kept = fits;
        Ok(())
    }

    /// Blocks until the batch has finished.
    pub(crate) fn wait(&self) -> Result<()> {
        if !self.submitted {
            return Ok(());
        }
        // SAFETY: the fence is alive (owned by self) and was submitted; waiting needs no external
        // synchronization.
        unsafe { self.dev.raw.wait_for_fences(&[self.fence], true, u64::MAX) }
            .map_err(|e| vk_err("vkWaitForFences", e))
    }

    fn is_done(&self) -> Result<bool> {
        // SAFETY: as in `wait`.
        unsafe { self.dev.raw.get_fence_status(self.fence) }
            .map_err(|e| vk_err("vkGetFenceStatus", e))
    }

    /// Reads the raw timestamps of a finished batch. The caller holds `finished` with the pools
    /// not yet released, and the batch has finished.
    fn read_ticks(&self) -> Result<Vec<u64>> {
        let mut ticks = vec![0u64; 2 * self.timed as usize];
        // SAFETY: the pool holds at least 2*timed timestamp queries, all written by the finished
        // batch; the output slice has room for each as a u64.
        unsafe {
            self.dev.raw.get_query_pool_results(
                self.query_pool,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|e| vk_err("vkGetQueryPoolResults", e))?;
        Ok(ticks)
    }

    /// Called once the fence has signaled: keeps the timestamps and hands the pools back.
    pub(crate) fn release_pools(&self) {
        let mut f = self.finished.lock();
        if f.released {
            return;
        }
        if self.timed > 0 {
            // Unreadable timestamps leave the event untimed rather than failing the batch.
            f.ticks = self.read_ticks().ok();
        }
        self.give_back_pools();
        f.released = true;
    }

    /// Returns the pools to the device's spares, or destroys them. The batch has finished and the
    /// pools are still this record's.
    fn give_back_pools(&self) {
        let d = &self.dev.raw;
        // SAFETY: nothing runs that uses the pools (the batch finished), so they may be reset or
        // destroyed; null handles are ignored. Timestamp pools are reset in the command buffer
        // that next uses them; a descriptor pool that fails to reset is destroyed instead.
        unsafe {
            let mut spare = self.dev.recycled.lock();
            if self.query_pool_kept && spare.query_pools.len() < Recycled::KEEP {
                if self.dev.host_query_reset {
                    // hostQueryReset was enabled (Device::host_query_reset); the batch finished
                    // and its timestamps were read.
                    d.reset_query_pool(self.query_pool, 0, 2 * Recycled::QUERY_LAUNCHES);
                }
                spare.query_pools.push(self.query_pool);
            } else {
                d.destroy_query_pool(self.query_pool, None);
            }
            if self.descriptor_pool_kept
                && spare.descriptor_pools.len() < Recycled::KEEP
                && d.reset_descriptor_pool(
                    self.descriptor_pool,
                    vk::DescriptorPoolResetFlags::empty(),
                )
                .is_ok()
            {
                spare.descriptor_pools.push(self.descriptor_pool);
            } else {
                d.destroy_descriptor_pool(self.descriptor_pool, None);
            }
        }
    }

    /// Waits, then each timed launch's device start and end in nanoseconds from the batch's first
    /// timestamp; `None` when the device cannot time.
    pub(crate) fn launch_intervals(&self) -> Result<Option<Vec<(u64, u64)>>> {
        self.wait()?;
        if self.timed == 0 {
            return Ok(None);
        }
        let ticks = {
            let f = self.finished.lock();
            match (&f.ticks, f.released) {
                (Some(t), _) => t.clone(),
                (None, true) => return Ok(None),
                (None, false) => self.read_ticks()?,
            }
        };
        let bits = self.dev.timestamp_valid_bits;
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let period = f64::from(self.dev.limits.timestamp_period);
        // Offsets from the first timestamp, modulo the valid bits, so that a counter that wraps
        // within the batch still gives ordered, positive intervals.
        let origin = ticks[0] & mask;
        let ns = |t: u64| ((t & mask).wrapping_sub(origin) & mask) as f64 * period;
        Ok(Some(
            ticks
                .chunks_exact(2)
                .map(|t| {
                    let (s, e) = (ns(t[0]) as u64, ns(t[1]) as u64);
                    (s, e.max(s))
                })
                .collect(),
        ))
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        // A submitted batch must finish before its pools and kept objects go; one that never reached
        // the queue has nothing running.
        if self.submitted {
            let _ = self.wait();
        }
        if !self.finished.get_mut().released {
            self.give_back_pools();
        }
        let d = &self.dev.raw;
        // SAFETY: nothing runs that waits on the fence (waited above); a kept fence is reset
        // (unsignaled) before it is offered again, and one that fails to reset is destroyed.
        unsafe {
            let mut spare = self.dev.recycled.lock();
            if self.fence != vk::Fence::null() {
                if spare.fences.len() < Recycled::KEEP && d.reset_fences(&[self.fence]).is_ok() {
                    spare.fences.push(self.fence);
                } else {
                    d.destroy_fence(self.fence, None);
                }
            }
        }
    }
}

struct State {
    pool: vk::CommandPool,
    free: Vec<vk::CommandBuffer>,
    /// In submission order: one queue finishes its submissions in order.
    in_flight: std::collections::VecDeque<(Arc<Record>, vk::CommandBuffer)>,
}

/// The context's command pool and its use of the device's queue. The state lock guards the pool
/// (recording is short, and Vulkan requires external synchronization of a pool); the queue lock,
/// shared by every kpc submitter over the same queue (`queue_lock.rs`), guards vkQueueSubmit.
pub(crate) struct Submitter {
    dev: Arc<Device>,
    state: Mutex<State>,
    queue: QueueLock,
}

impl Submitter {
    /// A submitter over `dev`'s queue; `hook` is the embedder's lock over that queue, if it gave one.
    pub(crate) fn new(dev: &Arc<Device>, hook: Option<VulkanQueueLock>) -> Result<Submitter> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(dev.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: plain object creation; destroyed in Drop after all work finished.
        let pool = unsafe { dev.raw.create_command_pool(&info, None) }
            .map_err(|e| vk_err("vkCreateCommandPool", e))?;
        Ok(Submitter {
            dev: dev.clone(),
            state: Mutex::new(State {
                pool,
                free: Vec::new(),
                in_flight: std::collections::VecDeque::new(),
            }),
            queue: QueueLock::for_queue(dev.raw.handle(), dev.queue, hook),
        })
    }

    /// Records commands with `record` into a command buffer that starts with the in-order barrier
    /// and, with `host_reads` (the host will read what it writes through a mapping), ends with a
    /// barrier that makes its writes visible to the host; submits it with `rec`'s fence. Returns
    /// the record, which the caller may wait on.
    pub(crate) fn submit(
        &self,
        mut rec: Record,
        host_reads: bool,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<()>,
    ) -> Result<Arc<Record>> {
        let d = &self.dev.raw;
        let mut st = self.state.lock();
        Self::reclaim(&mut st)?;
        let cmd = match st.free.pop() {
            Some(c) => c,
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(st.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is alive and externally synchronized by the state lock.
                unsafe { d.allocate_command_buffers(&info) }
                    .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?[0]
            }
        };
        let recorded = (|| {
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            // SAFETY: `cmd` is not in flight (fresh or reclaimed after its fence signaled); beginning
            // implicitly resets it (the pool allows resetting single buffers).
            unsafe { d.begin_command_buffer(cmd, &begin) }
                .map_err(|e| vk_err("vkBeginCommandBuffer", e))?;
            if rec.timed > 0 && !rec.query_pool_reset {
                // SAFETY: the pool holds exactly 2*timed queries; resetting outside a render pass.
                unsafe { d.cmd_reset_query_pool(cmd, rec.query_pool, 0, 2 * rec.timed) };
            }
            // SAFETY: recording into a command buffer in the recording state.
            unsafe { in_order_barrier(d, cmd) };
            record(d, cmd)?;
            if host_reads {
                // SAFETY: as above; makes every device write available and visible to host reads.
                unsafe {
                    d.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::ALL_COMMANDS,
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &[vk::MemoryBarrier::default()
                            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                            .dst_access_mask(vk::AccessFlags::HOST_READ)],
                        &[],
                        &[],
                    )
                };
            }
            // SAFETY: `cmd` is in the recording state.
            unsafe { d.end_command_buffer(cmd) }.map_err(|e| vk_err("vkEndCommandBuffer", e))?;
            let cmds = [cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&cmds);
            let _queue = self.queue.lock();
            // SAFETY: the queue is externally synchronized by the queue lock (every kpc submitter
            // over it, and the embedder's lock where it gave one); the fence is unsignaled and not
            // in use; every object the commands use is kept alive by `rec.keep_alive`.
            unsafe { d.queue_submit(self.dev.queue, &[submit], rec.fence) }
                .map_err(|e| vk_err("vkQueueSubmit", e))
        })();
        if let Err(e) = recorded {
            // The buffer never reached the queue: it can be reused at once (begin resets it).
            st.free.push(cmd);
            return Err(e);
        }
        rec.submitted = true;
        let rec = Arc::new(rec);
        st.in_flight.push_back((rec.clone(), cmd));
        Ok(rec)
    }

    /// Returns the command buffers of finished submissions to the free list and drops the pool's
    /// reference to their records (an event may still hold one for its timestamps).
    fn reclaim(st: &mut State) -> Result<()> {
        // Oldest first, stopping at the first unfinished one: one queue's submissions finish in
        // order, so this polls about one fence per submit instead of every one in flight, which
        // made the cost of a submit grow with the number in flight. Stopping early is safe either
        // way: a finished submission left in the list is only reclaimed later.
        while let Some((rec, _)) = st.in_flight.front() {
            if !rec.is_done()? {
                break;
            }
            rec.release_pools();
            if let Some((_, cmd)) = st.in_flight.pop_front() {
                st.free.push(cmd);
            }
        }
        Ok(())
    }

    /// Blocks until everything submitted so far has finished.
    pub(crate) fn finish(&self) -> Result<()> {
        let pending: Vec<Arc<Record>> = {
            let st = self.state.lock();
            st.in_flight.iter().map(|(r, _)| r.clone()).collect()
        };
        for r in &pending {
            r.wait()?;
        }
        drop(pending);
        Self::reclaim(&mut self.state.lock())
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        let _ = self.finish();
        let st = self.state.get_mut();
        st.in_flight.clear();
        // SAFETY: every submission has finished (finish above waited on each fence, and a failed wait
        // means a lost device, where destroying is still allowed); freeing the pool frees its buffers.
        unsafe { self.dev.raw.destroy_command_pool(st.pool, None) };
    }
}

/// Records a barrier that orders the device's earlier reads and writes of buffers (kernels and
/// copies) before its later ones: the in-order queue rule between submissions and between launches
/// of one batch. Host writes need no stage here: a submission already makes the host's earlier
/// writes to (coherent) mapped memory visible to the device. On an H200 the wider barrier that
/// named every stage and the host cost about 2 µs of device time per submission (BENCHMARKS.md,
/// issue 7).
///
/// # Safety
/// `cmd` must be in the recording state, outside a render pass.
pub(crate) unsafe fn in_order_barrier(d: &ash::Device, cmd: vk::CommandBuffer) {
    let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
    let b = vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(
            vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::TRANSFER_READ
                | vk::AccessFlags::TRANSFER_WRITE,
        );
    // SAFETY: guaranteed by the caller.
    unsafe {
        d.cmd_pipeline_barrier(
            cmd,
            stages,
            stages,
            vk::DependencyFlags::empty(),
            &[b],
            &[],
            &[],
        )
    };
}
