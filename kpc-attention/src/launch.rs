//! The one place the attention layers submit their kernels.
//!
//! Their kernels index K/V caches, activations and weights by shapes that live in push constants
//! and specialization constants, so kpc's safe [`kpc::Queue::submit`] cannot bound them on a
//! device without robust buffer access (OpenCL). The layers size every buffer from the shape they
//! launch with and check every caller-supplied buffer against it before they get here, which is
//! the contract [`kpc::Queue::submit_unchecked`] asks for.

use kpc::Result;
use kpc::{Event, LaunchDesc, Queue};

/// Submits `launches` as one batch on `queue`.
pub(crate) fn submit(queue: &Queue, launches: &[LaunchDesc<'_>]) -> Result<Event> {
    // SAFETY: every launch here comes from an attention layer that allocated or checked each of
    // its buffers for the shape in its push and specialization constants (KvCache::new, the layers'
    // shape checks), which is what the kernels index within.
    unsafe { queue.submit_unchecked(launches) }
}
