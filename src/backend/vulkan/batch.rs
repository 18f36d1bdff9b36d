//! One vkQueueSubmit: a command buffer that may carry several `Queue::submit` batches (see
//! `submit.rs` on deferral), its fence, and whether it has reached the queue.

use std::sync::{Arc, Weak};

use ash::vk;
use parking_lot::Mutex;

use crate::error::{Error, Result};

use super::device::{Device, Recycled, vk_err};

/// What can hand an open submission to the queue: its submitter.
pub(crate) trait SubmitOpen: Send + Sync {
    /// Submits `submission` if it is still open.
    fn submit_open(&self, submission: &Arc<Submission>) -> Result<()>;
}

/// Where a submission stands.
#[derive(Debug, Clone)]
enum State {
    /// Still being recorded: commands may be appended; nothing runs yet.
    Open,
    /// Handed to vkQueueSubmit with the fence.
    Submitted,
    /// Recording or vkQueueSubmit failed: nothing of it runs, and every batch in it reports this.
    Failed(Error),
}

/// A submission's fence and state, shared by the records of every batch it carries.
pub(crate) struct Submission {
    dev: Arc<Device>,
    fence: vk::Fence,
    state: Mutex<State>,
    /// The submitter that can still submit it while it is open.
    owner: Weak<dyn SubmitOpen>,
}

impl Submission {
    /// An open submission with an unsignaled fence (a spare where there is one).
    pub(crate) fn new(dev: &Arc<Device>, owner: Weak<dyn SubmitOpen>) -> Result<Submission> {
        let spare = dev.recycled.lock().fences.pop();
        let fence = match spare {
            Some(f) => f,
            // SAFETY: plain object creation on a live device; the submission owns it (Drop).
            None => unsafe { dev.raw.create_fence(&vk::FenceCreateInfo::default(), None) }
                .map_err(|e| vk_err("vkCreateFence", e))?,
        };
        Ok(Submission {
            dev: dev.clone(),
            fence,
            state: Mutex::new(State::Open),
            owner,
        })
    }

    pub(crate) fn fence(&self) -> vk::Fence {
        self.fence
    }

    pub(crate) fn mark_submitted(&self) {
        *self.state.lock() = State::Submitted;
    }

    pub(crate) fn mark_failed(&self, e: Error) {
        *self.state.lock() = State::Failed(e);
    }

    fn submitted(&self) -> bool {
        matches!(*self.state.lock(), State::Submitted)
    }

    /// Blocks until the submission has finished, submitting it first if it is still open (an
    /// event's wait must not wait for work that was never handed to the queue). A failed
    /// submission returns its error.
    pub(crate) fn wait(self: &Arc<Self>) -> Result<()> {
        let open = matches!(*self.state.lock(), State::Open);
        if open && let Some(owner) = self.owner.upgrade() {
            owner.submit_open(self)?;
        }
        let state = self.state.lock().clone();
        match state {
            State::Failed(e) => Err(e),
            // Only a submitter gone without submitting leaves one open, and it submits on drop.
            State::Open => Ok(()),
            // SAFETY: the fence is alive (owned by self) and was submitted; waiting needs no
            // external synchronization.
            State::Submitted => {
                unsafe { self.dev.raw.wait_for_fences(&[self.fence], true, u64::MAX) }
                    .map_err(|e| vk_err("vkWaitForFences", e))
            }
        }
    }

    /// Blocks until a submitted submission has finished; returns at once for one that never
    /// reached the queue. Never submits: for drops, which may run under the submitter's lock.
    pub(crate) fn wait_if_submitted(&self) {
        if self.submitted() {
            // SAFETY: as in `wait`.
            let _ = unsafe { self.dev.raw.wait_for_fences(&[self.fence], true, u64::MAX) };
        }
    }

    /// Whether a submitted submission has finished.
    pub(crate) fn is_done(&self) -> Result<bool> {
        // SAFETY: as in `wait`.
        unsafe { self.dev.raw.get_fence_status(self.fence) }
            .map_err(|e| vk_err("vkGetFenceStatus", e))
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        let d = &self.dev.raw;
        // A submitted fence must signal before it is reset or destroyed; one never submitted is
        // unsignaled and unused.
        self.wait_if_submitted();
        // SAFETY: nothing waits on the fence any more (above); a kept fence is reset (unsignaled)
        // before it is offered again, and one that fails to reset is destroyed.
        unsafe {
            let mut spare = self.dev.recycled.lock();
            if spare.fences.len() < Recycled::KEEP && d.reset_fences(&[self.fence]).is_ok() {
                spare.fences.push(self.fence);
            } else {
                d.destroy_fence(self.fence, None);
            }
        }
    }
}
