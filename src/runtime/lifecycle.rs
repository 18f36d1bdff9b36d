//! How a context stops using its device: the background work it runs (prefetch batches, the warm
//! start), what ends it, and [`super::Context::quiesce`].
//!
//! The guarantee an embedder builds on: once the drop of its last kpc object made from a context
//! (the context's handles, kernels, buffers, events, prefetch handles) has returned, kpc makes no
//! further call on the device, from any thread. What would break it is kpc's own threads:
//! - a prefetch batch's workers hold the context; dropping the [`super::Prefetch`] cancels the
//!   requests not yet begun and waits for the running ones (`prefetch.rs`);
//! - the warm-start loader holds the context only weakly, but each load upgrades it for its
//!   duration; dropping the last [`super::Context`] handle stops the loader the same way (cancel what has
//!   not begun, wait for what runs) before the context itself goes, so no upgrade outlives the drop;
//! - the background builds of specialized kernels (`lazy.rs`) hold the program manager only weakly,
//!   upgraded for each build; the same drop (and `quiesce`) drops the queued ones and waits for the
//!   running ones.
//!
//! kpc's threads never hold a [`super::Context`] handle of their own (only the context inside), so the
//! embedder's handles alone decide when the warm start stops.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::Result;

use super::prefetch::Cancel;
use super::warm_start::WarmStart;

/// One context's prefetch batches that may still run: what [`super::Context::quiesce`] cancels.
#[derive(Default)]
pub(crate) struct Background {
    batches: Mutex<Vec<Weak<dyn Cancel>>>,
}

impl Background {
    /// Remembers a batch; batches already gone are forgotten on the way.
    pub(crate) fn register(&self, batch: &Arc<dyn Cancel>) {
        let mut b = self.batches.lock();
        b.retain(|w| w.strong_count() > 0);
        b.push(Arc::downgrade(batch));
    }

    /// Cancels every batch still alive and waits for their running requests.
    pub(crate) fn cancel_all(&self) {
        let live: Vec<Arc<dyn Cancel>> = self
            .batches
            .lock()
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        for b in live {
            b.cancel_and_wait();
        }
    }
}

/// Shared by the embedder's [`super::Context`] handles, never by kpc's own threads: when the last handle
/// goes, the warm start stops (and the drop waits for its running loads) before the context does.
pub(crate) struct Life {
    pub(crate) warm: Option<Arc<WarmStart>>,
    /// The background builds of specialized kernels (`lazy.rs`): dropped if queued, waited for if
    /// running.
    pub(crate) lazy: Arc<super::lazy_pool::Lazy>,
}

impl Drop for Life {
    fn drop(&mut self) {
        if let Some(w) = &self.warm {
            w.stop();
        }
        self.lazy.cancel_and_wait();
    }
}

impl super::Context {
    /// A handle for kpc's own threads (prefetch workers): it shares the context but not the
    /// embedder's handles' lifetime, so it never keeps the warm start going.
    pub(crate) fn internal(&self) -> super::Context {
        super::Context {
            _life: None,
            inner: self.inner.clone(),
        }
    }

    /// Returns once kpc has no call in flight on this context's device and none pending of its
    /// own: the warm start is stopped (kernels it loaded stay cached; the others are loaded at
    /// their first request), the background builds of specialized kernels are dropped if queued
    /// (queued again by the next request that falls back) and waited for if running, every
    /// prefetch batch of this context is cancelled (its requests not
    /// yet begun finish with [`crate::Error::Cancelled`]) after its running requests finished, and
    /// every submission made so far has finished executing.
    ///
    /// For an embedder about to do something to the device that kpc must not overlap (tear down,
    /// vkDeviceWaitIdle, a reset), or that wants kpc's background work done now. The context stays
    /// usable: a call made afterwards runs as usual (and is in flight again). Calls that other
    /// threads of the embedder make on this context meanwhile are theirs to finish; other contexts
    /// over the same device are not affected.
    ///
    /// Errors: [`crate::Error::Backend`] when waiting for a submission fails (a lost device).
    pub fn quiesce(&self) -> Result<()> {
        if let Some(w) = &self.inner.warm {
            w.stop();
        }
        self.inner.background.cancel_all();
        self.inner.programs.lazy().cancel_and_wait();
        self.inner.compute.finish()
    }
}
