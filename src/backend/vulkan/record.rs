//! A batch's record: the pools and objects one `Queue::submit` batch uses, its timestamps, and
//! the submission (`batch.rs`) its commands went into.

use std::any::Any;
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;

use crate::error::Result;

use super::batch::Submission;
use super::device::{Device, Recycled, vk_err};

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
    pub(crate) query_pool_reset: bool,
    /// Launches timed by the query pool (two timestamps each).
    pub(crate) timed: u32,
    /// The vkQueueSubmit its commands went into, once recorded; shared with the batches recorded
    /// into the same command buffer.
    pub(crate) submission: Option<Arc<Submission>>,
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
