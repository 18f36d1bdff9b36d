//! The one place the attention layers submit their kernels.
//!
//! Their kernels index K/V caches, activations and weights by shapes that live in push constants
//! and specialization constants, so kpc's safe [`kpc::Queue::submit`] cannot bound them on a
//! device without robust buffer access (OpenCL). The layers size every buffer from the shape they
//! launch with and check every caller-supplied buffer against it before they get here, which is
//! the contract [`kpc::Queue::submit_unchecked`] asks for.
//!
//! A call records its launches into a [`Batch`] (owned copies of the kernels, buffer handles and
//! push constants) and submits the batch once: a layer call, or a whole decoder stack's step, is
//! one [`kpc::Queue::submit`], each launch ordered after the one before it.

use kpc::Result;
use kpc::{BufferArg, Event, Kernel, LaunchDesc, Queue, RawBuffer};

/// What a launch of a layer call does, for splitting its device time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A Q/K/V or output projection, or a conversion between fp16 and f32 activations.
    Projection,
    /// Appending K/V and attending.
    Attention,
}

/// One launch kept until its batch is submitted.
struct Recorded {
    kernel: Kernel,
    groups: [u32; 3],
    /// Each handle keeps its buffer alive until the submission holds it.
    buffers: Vec<RawBuffer>,
    push: Vec<u8>,
    phase: Phase,
}

/// Launches recorded in order, submitted together.
pub(crate) struct Batch {
    launches: Vec<Recorded>,
    phase: Phase,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch {
            launches: Vec::new(),
            phase: Phase::Projection,
        }
    }

    /// The phase of the launches added from now on.
    pub(crate) fn phase(&mut self, phase: Phase) -> &mut Batch {
        self.phase = phase;
        self
    }

    /// Appends `launches`, after every launch recorded before them.
    pub(crate) fn add(&mut self, launches: &[LaunchDesc<'_>]) {
        for l in launches {
            self.launches.push(Recorded {
                kernel: l.kernel.clone(),
                groups: l.groups,
                buffers: l.buffers.iter().map(|b| b.raw().clone()).collect(),
                push: l.push_constants.to_vec(),
                phase: self.phase,
            });
        }
    }

    /// The phase of each launch, in order.
    pub(crate) fn phases(&self) -> Vec<Phase> {
        self.launches.iter().map(|l| l.phase).collect()
    }

    /// Submits every launch recorded as one batch on `queue`.
    pub(crate) fn submit(&self, queue: &Queue) -> Result<Event> {
        let args: Vec<Vec<&dyn BufferArg>> = self
            .launches
            .iter()
            .map(|l| l.buffers.iter().map(|b| b as &dyn BufferArg).collect())
            .collect();
        let descs: Vec<LaunchDesc<'_>> = self
            .launches
            .iter()
            .zip(&args)
            .map(|(l, a)| LaunchDesc {
                kernel: &l.kernel,
                groups: l.groups,
                buffers: a,
                push_constants: &l.push,
            })
            .collect();
        submit(queue, &descs)
    }
}

/// Submits `launches` as one batch on `queue`.
pub(crate) fn submit(queue: &Queue, launches: &[LaunchDesc<'_>]) -> Result<Event> {
    // SAFETY: every launch here comes from an attention layer that allocated or checked each of
    // its buffers for the shape in its push and specialization constants (KvCache::new, the layers'
    // shape checks, Tensor's shape checks), which is what the kernels index within.
    unsafe { queue.submit_unchecked(launches) }
}
