//! Submissions: command buffers, their deferral and vkQueueSubmit (a batch's pools are `record.rs`'s, a
//! submission's fence `batch.rs`'s), and the in-order
//! queue discipline.
//!
//! Every command buffer starts with a memory barrier over kernels and copies, so a submission
//! begins only after everything submitted before it has finished writing: the queue behaves in
//! order, as SYCL's in-order queue and OpenCL's default queue do. A command buffer whose writes
//! the host reads through a mapping (a download's staging copy; any launch where buffers are
//! mapped, on CPU devices) ends with a barrier that makes them visible to the host, so a signaled
//! fence means the results can be read.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;
use parking_lot::Mutex;

use crate::error::Result;

use super::batch::{Submission, SubmitOpen};
use super::device::{Device, Recycled, vk_err};
use super::queue_lock::{QueueLock, VulkanQueueLock};
pub use super::record::Record;
use super::submit_profile::{self, Phase};

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

struct Shared {
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
            .and_then(|()| {
                Submission::new(
                    &self.dev,
                    Arc::downgrade(self) as std::sync::Weak<dyn SubmitOpen>,
                )
            });
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

impl SubmitOpen for Shared {
    /// Submits `submission` if it is still the open one (an event's wait asks).
    fn submit_open(&self, submission: &Arc<Submission>) -> Result<()> {
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

/// `KPC_VULKAN_DEFER`: the most batches one vkQueueSubmit carries; [`DEFER`] when unset.
fn defer_from_env() -> Result<usize> {
    let v = std::env::var_os(DEFER_VAR);
    parse_defer(v.as_ref().map(|v| v.to_string_lossy()).as_deref())
}

const DEFER_VAR: &str = "KPC_VULKAN_DEFER";

fn parse_defer(v: Option<&str>) -> Result<usize> {
    let Some(s) = v else {
        return Ok(DEFER);
    };
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=Recycled::KEEP).contains(&n) => Ok(n),
        _ => Err(crate::error::Error::Config(
            crate::config::ConfigError::Invalid {
                var: DEFER_VAR,
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

#[cfg(test)]
mod tests {
    use super::{DEFER, parse_defer};

    #[test]
    fn defer_accepts_1_to_256_and_names_the_variable_otherwise() {
        assert_eq!(parse_defer(None).unwrap(), DEFER);
        assert_eq!(parse_defer(Some(" 1 ")).unwrap(), 1);
        assert_eq!(parse_defer(Some("256")).unwrap(), 256);
        for bad in ["0", "257", "-1", "many", ""] {
            let e = parse_defer(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("KPC_VULKAN_DEFER"), "{bad:?}: {e}");
        }
    }
}
