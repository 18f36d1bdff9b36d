//! The external synchronization of a `VkQueue`: one submit lock per queue, process-wide, and the
//! embedder's own lock where it hands kpc one.
//!
//! Vulkan requires that no two threads use a queue at once (vkQueueSubmit, vkQueueWaitIdle,
//! vkQueuePresentKHR, ...). A lock per kpc context is not enough: an engine that opens several
//! contexts over its one compute queue (one per model, one per thread) would have them submit
//! together. So every kpc submitter over a queue takes the same lock, found in a registry keyed by
//! the (device, queue) handles; the entry goes when the last submitter over that queue does, so a
//! handle value reused by a later device starts afresh.
//!
//! Between kpc and the engine, kpc's lock cannot help (the engine does not know it): the engine
//! either keeps its own submissions apart from kpc's calls that submit, or hands kpc its lock as a
//! [`VulkanQueueLock`], which kpc then holds around each of its queue calls, after its own.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Weak};

use ash::vk::{self, Handle};
use parking_lot::{Mutex, MutexGuard};

/// The embedder's lock over a queue it shares with kpc: kpc calls `lock(user_data)` before each of
/// its calls that use the queue (vkQueueSubmit) and `unlock(user_data)` right after, from whichever
/// thread makes the call. With it, the engine serializes its own queue use on the same lock and
/// needs no other coordination with kpc.
///
/// Contract for the callbacks: callable from any thread, any number of times; `lock` blocks until
/// the calling thread holds the engine's lock and `unlock` releases it (a plain mutex does). kpc
/// never calls `lock` twice without `unlock` in between on one thread, holds the lock only for the
/// queue call itself, and never calls back into the engine meanwhile. The engine must not call a
/// kpc function that submits (see `runtime::interop`) while it holds that lock itself: kpc would
/// wait for it forever.
///
/// Exhaustive on purpose, as [`super::VulkanHandles`]: the embedder supplies every field.
#[derive(Debug, Clone, Copy)]
pub struct VulkanQueueLock {
    /// Takes the engine's lock.
    pub lock: unsafe extern "C" fn(user_data: *mut c_void),
    /// Releases it.
    pub unlock: unsafe extern "C" fn(user_data: *mut c_void),
    /// Passed to both, unchanged.
    pub user_data: *mut c_void,
}

// SAFETY: the callbacks' contract (documented on the type, promised by the unsafe constructors that
// take it) is that they may be called from any thread with `user_data`; kpc never dereferences it.
unsafe impl Send for VulkanQueueLock {}
// SAFETY: as above; the struct itself is immutable.
unsafe impl Sync for VulkanQueueLock {}

type Key = (u64, u64);

/// The registry: one entry per queue some kpc submitter uses now.
static QUEUES: Mutex<BTreeMap<Key, Weak<SharedQueue>>> = Mutex::new(BTreeMap::new());

/// kpc's lock of one queue, shared by every kpc submitter over it.
struct SharedQueue {
    key: Key,
    mutex: Mutex<()>,
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        let mut map = QUEUES.lock();
        // Only a dead entry goes: another submitter may have replaced it meanwhile.
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

/// One submitter's way to take its queue: the shared kpc lock of that queue, then the embedder's
/// lock where this submitter's context was given one.
pub(crate) struct QueueLock {
    shared: Arc<SharedQueue>,
    hook: Option<VulkanQueueLock>,
}

/// Held while kpc uses the queue: kpc's lock, then the embedder's, released in reverse.
pub(crate) struct QueueGuard<'a> {
    _kpc: MutexGuard<'a, ()>,
    hook: Option<VulkanQueueLock>,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.hook {
            // SAFETY: `lock` was called on this thread by `QueueLock::lock`; the callbacks'
            // contract (VulkanQueueLock) allows this call from here.
            unsafe { (h.unlock)(h.user_data) };
        }
    }
}

impl QueueLock {
    /// The lock of `queue` on `device`, shared with every other kpc submitter over it, followed by
    /// `hook` (the embedder's lock) where one is given. Contexts over one queue made with and
    /// without a hook still exclude each other through kpc's shared lock.
    pub(crate) fn for_queue(
        device: vk::Device,
        queue: vk::Queue,
        hook: Option<VulkanQueueLock>,
    ) -> QueueLock {
        let key = (device.as_raw(), queue.as_raw());
        let mut map = QUEUES.lock();
        let shared = match map.get(&key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(SharedQueue {
                    key,
                    mutex: Mutex::new(()),
                });
                map.insert(key, Arc::downgrade(&s));
                s
            }
        };
        QueueLock { shared, hook }
    }

    /// Takes the queue: blocks until no other kpc call (and, with a hook, no engine code holding
    /// its lock) uses it.
    pub(crate) fn lock(&self) -> QueueGuard<'_> {
        let g = self.shared.mutex.lock();
        if let Some(h) = self.hook {
            // SAFETY: the callbacks' contract (VulkanQueueLock), promised by the embedder.
            unsafe { (h.lock)(h.user_data) };
        }
        QueueGuard {
            _kpc: g,
            hook: self.hook,
        }
    }
}

/// How many kpc submitters share the lock of `queue` on `device` now (0 when none).
pub fn queue_lock_sharers(device: vk::Device, queue: vk::Queue) -> usize {
    QUEUES
        .lock()
        .get(&(device.as_raw(), queue.as_raw()))
        .map_or(0, Weak::strong_count)
}
