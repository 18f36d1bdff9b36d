//! Embedding kpc in a runtime that owns its devices: contexts over the embedder's Vulkan or OpenCL
//! objects, and the raw handles of cached kernels for the embedder's own command recording.
//!
//! # What kpc borrows
//! - Vulkan: the `VkInstance`, `VkPhysicalDevice`, `VkDevice` and one `VkQueue` of
//!   [`VulkanHandles`]. kpc never destroys them and never calls vkDeviceWaitIdle on the device. The
//!   embedder keeps them alive until every kpc object made from the context (the context, kernels,
//!   buffers, events, prefetch handles) is dropped.
//! - OpenCL: the `cl_context`, `cl_device_id` and `cl_command_queue` of [`OpenClHandles`]. kpc
//!   retains the context and queue, and releases exactly what it retained; the embedder may release
//!   its own references at any time and keep using the queue concurrently (OpenCL queues are
//!   thread-safe).
//!
//! # The submission model: which calls touch the queue
//! Only calls that run work submit to the queue (Vulkan: vkQueueSubmit; OpenCL: enqueues):
//! - [`crate::Context::buffer_from`], `Buffer::write`/`write_at`, `Buffer::read`/`read_at` (a copy through
//!   a staging buffer on a GPU; on a CPU device, with mapped buffers, they wait for earlier
//!   submissions instead and submit nothing);
//! - `Queue::launch` and `Queue::submit`, and everything built on them: the attention layer's
//!   `KvCache::fill`, `append`, `prefill`, `decode_step`, `attend`.
//!
//! These only build and never touch the queue: [`crate::Context::kernel`], [`crate::Context::prefetch`] and the
//! warm start (pipelines and programs are created on the device, which needs no external
//! synchronization), `Context::kernel_from_blob`, `cache_blob`, [`crate::Kernel::vulkan_handles`],
//! [`crate::Kernel::opencl_lease`], [`crate::Context::buffer`] (allocation only). Waiting (`Event::wait`,
//! [`crate::Context::finish`], [`crate::Context::quiesce`]) waits on fences and touches no queue either: a
//! context over the embedder's device submits every batch at once, never holding one back for a
//! later wait to submit as kpc's own contexts may (`KPC_VULKAN_DEFER`, ENVIRONMENT.md).
//!
//! # What an engine must serialize (Vulkan)
//! Vulkan requires that no two threads use one `VkQueue` at once. Among kpc's own contexts this is
//! kpc's business: every kpc context over a queue takes one lock per queue, shared process-wide,
//! around its vkQueueSubmit, so any number of contexts over one queue, used from any threads, never
//! submit at once. Between kpc and the engine there are two ways:
//! - give kpc the engine's lock as [`VulkanHandles::queue_lock`] (C: `queue_lock`/`queue_unlock`
//!   in `kpc_vulkan_handles`): kpc takes it around each of its queue calls, the engine takes it
//!   around its own, and nothing else needs coordinating. The engine must not call a submitting
//!   kpc function while it holds that lock;
//! - or, without a hook, the engine keeps its own use of the queue (vkQueueSubmit,
//!   vkQueueWaitIdle, present) apart in time from the submitting kpc calls listed above, for
//!   example by making them on the thread that submits, or gives kpc a queue of its own.
//!
//! OpenCL needs neither: command queues are thread-safe, and kpc sets kernel arguments only on
//! kernel objects nobody else holds ([`OpenClKernelLease`]).
//!
//! # When kpc stops using the device
//! When the drop of the last kpc object made from a context has returned, kpc makes no further call
//! on the borrowed handles, from any thread: dropping a [`crate::Prefetch`] cancels its requests not
//! yet begun and waits for the running ones; dropping the last [`crate::Context`] handle stops the warm
//! start the same way; everything else kpc does on its own threads belongs to one of those. The
//! same holds for devices kpc opens itself. [`crate::Context::quiesce`] gets there without dropping: it
//! returns once kpc has nothing of its own in flight on the device.
//!
//! # What kpc owns
//! Everything it creates: Vulkan command pools, fences, descriptor and query pools, buffers and
//! their memory, pipeline caches, pipelines with their layouts; OpenCL programs, kernel objects,
//! buffers and events. Their handles, as [`crate::Kernel::vulkan_handles`] and [`crate::Kernel::opencl_lease`]
//! expose them, stay kpc's: the embedder uses them while the kernel (or its lease) is alive and
//! never destroys them.
//!
//! # Same device, same cache
//! An interop context fingerprints its device with the same code as discovery, so a binary built by
//! an owned context on the same device and driver is a disk hit (and a blob hit) for an interop one,
//! and the other way round.
//!
//! # Opening one
//! ```no_run
//! # fn f(handles: kpc::interop::VulkanHandles) -> kpc::Result<()> {
//! // SAFETY: the handles are the engine's live objects, kept alive past every kpc object.
//! let ctx = unsafe { kpc::Context::builder().vulkan_handles(&handles) }.build()?;
//! # Ok(()) }
//! ```
//! [`crate::ContextBuilder::stores`] gives an interop context the embedder's own stores, as for any
//! context.

pub use crate::backend::opencl::{OpenClHandles, OpenClKernelLease};
pub use crate::backend::vulkan::{
    VulkanFeatures, VulkanHandles, VulkanKernelHandles, VulkanQueueLock,
};
