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
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;
use parking_lot::Mutex;

use crate::error::Result;

use super::batch::Submission;
use super::device::{Device, Recycled, vk_err};
use super::queue_lock::{QueueLock, VulkanQueueLock};
use super::submit_profile::{self, Phase};

/// One submitted batch: what must live until it has finished, and its timestamps.
pub struct Record {
    dev: Arc<Device>,
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
    /// The vkQueueSubmit its commands went into, once recorded; shared with the batches recorded
    /// into the same command buffer.
    submission: Option<Arc<Submission>>,
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
            .field("recorded", &self.submission.is_some())
            .finish()
    }
}

impl Record {
    /// A record with, when asked, a timestamp pool for `timed` launches, reusing spares of
    /// finished batches where there are.
    pub(crate) fn new(dev: &Arc<Device>, timed: u32) -> Result<Record> {
        let mut r = Record {
            dev: dev.clone(),
            descriptor_pool: vk::DescriptorPool::null(),
            descriptor_pool_kept: false,
            query_pool: vk::QueryPool::null(),
            query_pool_kept: false,
            query_pool_reset: false,
            timed: 0,
            submission: None,
            finished: Mutex::new(Finished::default()),
            keep_alive: Vec::new(),
        };
        let want_queries = timed > 0 && dev.timestamp_valid_bits > 0;
        // Spares were reset from the host when they were handed back, where the device can.
        let host_reset = dev.host_query_reset;
        let kept = want_queries && timed <= Recycled::QUERY_LAUNCHES;
        if kept {
            r.query_pool = dev
                .recycled
                .lock()
                .query_pools
                .pop()
                .unwrap_or(vk::QueryPool::null());
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
                // SAFETY: plain object creation on a live device; `r` owns the handle (Drop).
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

    /// Blocks until the batch has finished, handing its command buffer to the queue first if it
    /// was held back (see `Submitter::submit`); the error of a submission that failed.
    pub(crate) fn wait(&self) -> Result<()> {
        match &self.submission {
            Some(s) => s.wait(),
            None => Ok(()),
        }
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
        // the queue has nothing running. An open submission holds its records, so none drops
        // while it could still be submitted.
        if let Some(s) = &self.submission {
            s.wait_if_submitted();
        }
        if !self.finished.get_mut().released {
            self.give_back_pools();
        }
    }
}

/// One command buffer handed to the queue, not yet known finished.
struct InFlight {
    submission: Arc<Submission>,
    cmd: vk::CommandBuffer,
    /// Its batches, whose pools go back once it has finished.
    records: Vec<Arc<Record>>,
}

/// The command buffer being recorded: batches appended since the last vkQueueSubmit.
struct Open {
    submission: Arc<Submission>,
    cmd: vk::CommandBuffer,
    records: Vec<Arc<Record>>,
}

struct State {
    pool: vk::CommandPool,
    free: Vec<vk::CommandBuffer>,
    /// In submission order: one queue finishes its submissions in order.
    in_flight: VecDeque<InFlight>,
    open: Option<Open>,
    /// When the last batch was recorded.
    last: Option<Instant>,
}

/// The context's command pool and its use of the device's queue. The state lock guards the pool
/// and the open command buffer (recording is short, and Vulkan requires external synchronization
/// of a pool); the queue lock, shared by every kpc submitter over the same queue
/// (`queue_lock.rs`), guards vkQueueSubmit.
///
/// Deferral: a batch that follows the one before closely (within `ALONE`) or finds earlier work of
/// this submitter still running is appended to an open command buffer rather than handed to the
/// queue at once; that command buffer goes to the queue when it holds `defer` batches, when a
/// batch comes alone to an idle device, or when anything waits (an event, `finish`, a host copy). One vkQueueSubmit
/// then carries several batches: on NVIDIA each costs the host tens of microseconds and the device
/// an idle gap between submissions (issue 28, BENCHMARKS.md). The queue still runs every batch in
/// submission order, each after the in-order barrier; a batch that comes alone to an idle device
/// is submitted at once, as before.
pub(crate) struct Submitter {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    dev: Arc<Device>,
    state: Mutex<State>,
    queue: QueueLock,
    /// The most batches one vkQueueSubmit carries (1: every batch is submitted at once).
    defer: usize,
}

impl Submitter {
    /// A submitter over `dev`'s queue; `hook` is the embedder's lock over that queue, if it gave one.
    /// A borrowed device's submitter never defers: kpc documents that only its submitting calls
    /// touch the embedder's queue, and a wait that submitted held-back work would break that.
    pub(crate) fn new(dev: &Arc<Device>, hook: Option<VulkanQueueLock>) -> Result<Submitter> {
        let defer = if dev.borrowed.is_some() {
            1
        } else {
            defer_from_env()?
        };
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(dev.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: plain object creation; destroyed in Drop after all work finished.
        let pool = unsafe { dev.raw.create_command_pool(&info, None) }
            .map_err(|e| vk_err("vkCreateCommandPool", e))?;
        Ok(Submitter {
            shared: Arc::new(Shared {
                dev: dev.clone(),
                state: Mutex::new(State {
                    pool,
                    free: Vec::new(),
                    in_flight: VecDeque::new(),
                    open: None,
                    last: None,
                }),
                queue: QueueLock::for_queue(dev.raw.handle(), dev.queue, hook),
                defer,
            }),
        })
    }

    /// Records commands with `record` after the in-order barrier and, with `host_reads` (the host
    /// will read what it writes through a mapping), a barrier that makes its writes visible to the
    /// host; hands them to the queue now or holds them back (see [`Submitter`]). Returns the
    /// record, which the caller may wait on.
    pub(crate) fn submit(
        &self,
        rec: Record,
        host_reads: bool,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<()>,
    ) -> Result<Arc<Record>> {
        self.shared.submit(rec, host_reads, record)
    }

    /// Blocks until everything submitted so far has finished.
    pub(crate) fn finish(&self) -> Result<()> {
        self.shared.finish()
    }
}

impl Shared {
    fn submit(
        self: &Arc<Self>,
        mut rec: Record,
        host_reads: bool,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<()>,
    ) -> Result<Arc<Record>> {
        let d = &self.dev.raw;
        let mut guard = self.state.lock();
        // Through a plain reference, so that the open command buffer and the other fields can
        // be borrowed apart.
        let st = &mut *guard;
        let t = submit_profile::start();
        Self::reclaim(st)?;
        submit_profile::end(Phase::Reclaim, t);
        let t = submit_profile::start();
        if st.open.is_none() {
            let open = self.open(st)?;
            st.open = Some(open);
        }
        let Some(open) = st.open.as_mut() else {
            unreachable!("opened above")
        };
        let cmd = open.cmd;
        let recorded = (|| {
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
            Ok(())
        })();
        submit_profile::end(Phase::Commands, t);
        if let Err(e) = recorded {
            // Part of this batch may be in the command buffer: none of it may run, so the
            // batches before it fail with the same error (their waits report it).
            self.discard_open(st, &e);
            return Err(e);
        }
        rec.submission = Some(open.submission.clone());
        let rec = Arc::new(rec);
        open.records.push(rec.clone());
        let now = Instant::now();
        let apart = st.last.is_none_or(|t| now.duration_since(t) >= ALONE);
        st.last = Some(now);
        if open.records.len() >= self.defer || (apart && st.in_flight.is_empty()) {
            self.submit_locked(st)?;
        }
        Ok(rec)
    }

    /// A command buffer in the recording state, with a fresh submission.
    fn open(self: &Arc<Self>, st: &mut State) -> Result<Open> {
        let d = &self.dev.raw;
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
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: `cmd` is not in flight (fresh or reclaimed after its fence signaled) and not
        // recording; beginning implicitly resets it (the pool allows resetting single buffers).
        let begun = unsafe { d.begin_command_buffer(cmd, &begin) }
            .map_err(|e| vk_err("vkBeginCommandBuffer", e))
            .and_then(|()| Submission::new(&self.dev, Arc::downgrade(self)));
        match begun {
            Ok(s) => Ok(Open {
                submission: Arc::new(s),
                cmd,
                records: Vec::new(),
            }),
            Err(e) => {
                Self::give_back_unsubmitted(d, st, cmd);
                Err(e)
            }
        }
    }

    /// Returns a command buffer that never reached the queue to the free list, reset; one that
    /// cannot be reset is freed.
    fn give_back_unsubmitted(d: &ash::Device, st: &mut State, cmd: vk::CommandBuffer) {
        // SAFETY: the buffer is not in flight; the pool allows resetting single buffers and is
        // externally synchronized by the state lock.
        unsafe {
            if d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .is_ok()
            {
                st.free.push(cmd);
            } else {
                d.free_command_buffers(st.pool, &[cmd]);
            }
        }
    }

    /// Drops the open command buffer: its batches fail with `e`.
    fn discard_open(&self, st: &mut State, e: &crate::error::Error) {
        if let Some(open) = st.open.take() {
            open.submission.mark_failed(e.clone());
            Self::give_back_unsubmitted(&self.dev.raw, st, open.cmd);
        }
    }

    /// Hands the open command buffer, if any, to the queue.
    fn submit_locked(&self, st: &mut State) -> Result<()> {
        let Some(open) = st.open.take() else {
            return Ok(());
        };
        let d = &self.dev.raw;
        let t = submit_profile::start();
        // SAFETY: `cmd` is in the recording state.
        let submitted = unsafe { d.end_command_buffer(open.cmd) }
            .map_err(|e| vk_err("vkEndCommandBuffer", e))
            .and_then(|()| {
                let cmds = [open.cmd];
                let submit = vk::SubmitInfo::default().command_buffers(&cmds);
                let _queue = self.queue.lock();
                // SAFETY: the queue is externally synchronized by the queue lock (every kpc
                // submitter over it, and the embedder's lock where it gave one); the fence is
                // unsignaled and not in use; every object the commands use is kept alive by the
                // records' keep-alives, which `in_flight` holds until the fence signals.
                unsafe { d.queue_submit(self.dev.queue, &[submit], open.submission.fence()) }
                    .map_err(|e| vk_err("vkQueueSubmit", e))
            });
        submit_profile::end(Phase::QueueSubmit, t);
        match submitted {
            Ok(()) => {
                open.submission.mark_submitted();
                st.in_flight.push_back(InFlight {
                    submission: open.submission,
                    cmd: open.cmd,
                    records: open.records,
                });
                Ok(())
            }
            Err(e) => {
                open.submission.mark_failed(e.clone());
                Self::give_back_unsubmitted(d, st, open.cmd);
                Err(e)
            }
        }
    }

    /// Submits `submission` if it is still the open one (an event's wait asks).
    pub(crate) fn submit_open(&self, submission: &Arc<Submission>) -> Result<()> {
        let mut st = self.state.lock();
        if st
            .open
            .as_ref()
            .is_some_and(|o| Arc::ptr_eq(&o.submission, submission))
        {
            self.submit_locked(&mut st)?;
        }
        Ok(())
    }

    /// Returns the command buffers of finished submissions to the free list and drops the pool's
    /// reference to their records (an event may still hold one for its timestamps).
    fn reclaim(st: &mut State) -> Result<()> {
        // Oldest first, stopping at the first unfinished one: one queue's submissions finish in
        // order, so this polls about one fence per submit instead of every one in flight, which
        // made the cost of a submit grow with the number in flight. Stopping early is safe either
        // way: a finished submission left in the list is only reclaimed later.
        while let Some(f) = st.in_flight.front() {
            if !f.submission.is_done()? {
                break;
            }
            for r in &f.records {
                r.release_pools();
            }
            if let Some(f) = st.in_flight.pop_front() {
                st.free.push(f.cmd);
            }
        }
        Ok(())
    }

    /// Submits what is held back, then blocks until everything submitted so far has finished.
    fn finish(&self) -> Result<()> {
        let pending: Vec<Arc<Submission>> = {
            let mut st = self.state.lock();
            self.submit_locked(&mut st)?;
            st.in_flight.iter().map(|f| f.submission.clone()).collect()
        };
        for s in &pending {
            s.wait()?;
        }
        drop(pending);
        Self::reclaim(&mut self.state.lock())
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        let _ = self.shared.finish();
        submit_profile::report();
        let mut st = self.shared.state.lock();
        if let Some(open) = st.open.take() {
            // Only a failed submit leaves one: nothing of it runs.
            open.submission
                .mark_failed(crate::error::Error::InvalidArgument(
                    "the context was dropped before this batch was submitted".into(),
                ));
        }
        st.in_flight.clear();
        // SAFETY: every submission has finished (finish above waited on each fence, and a failed
        // wait means a lost device, where destroying is still allowed); freeing the pool frees its
        // buffers.
        unsafe { self.shared.dev.raw.destroy_command_pool(st.pool, None) };
    }
}

/// `KPC_VULKAN_DEFER`: the most batches one vkQueueSubmit carries; 8 when unset.
fn defer_from_env() -> Result<usize> {
    const VAR: &str = "KPC_VULKAN_DEFER";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(DEFER);
    };
    let s = v.to_string_lossy();
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=Recycled::KEEP).contains(&n) => Ok(n),
        _ => Err(crate::error::Error::Config(
            crate::config::ConfigError::Invalid {
                var: VAR,
                value: s.to_string(),
                accepted: "a whole number from 1 to 256",
            },
        )),
    }
}

/// A batch recorded this long after the one before, with the device idle, is submitted at once:
/// it is not part of a run of steps, and whatever the caller does next overlaps with it. Batches
/// closer together are held back even with the device idle, so that a run whose host side is
/// slower than its device side (each step finding the device idle) still shares submissions: on
/// NVIDIA a submission to an idle device costs the host most, and the run would never catch up.
const ALONE: Duration = Duration::from_micros(200);

/// Batches one vkQueueSubmit carries at most by default. Small, so that a long run of batches
/// submitted while the device is busy starts soon after the device catches up, even when nothing
/// waits.
const DEFER: usize = 8;

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
