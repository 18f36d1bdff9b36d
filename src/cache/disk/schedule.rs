//! When eviction passes run: off the caller's path, one at a time, and never one too few.
//!
//! A put that takes the total over `max_size` asks for a pass. In one process a [`PassGate`] keeps one
//! runner, which runs again when a put came while it ran. Across processes `evict.lock` keeps one
//! evictor; a process that finds it taken leaves `evict.recheck` before trying once more, and the
//! holder looks for that file after it lets go (`evict.rs`), then asks its own runner for a pass. So
//! every put over the limit is followed by a pass that starts after it, and once writers stop the total
//! is at or under the limit (entries being written excepted, and those are counted by puts that ask
//! again).

use std::sync::Arc;
use std::thread::JoinHandle;

use super::Inner;
use super::evict::Plan;
use super::lock::{HeldLock, RECHECK_FILE};

impl Inner {
    /// A put (or a pass that saw a bad record or a recheck flag) asks for a pass; it runs on a background
    /// thread unless `background_eviction` is off, and only if the record still calls for one then.
    pub(super) fn request_pass(&self) {
        let Some(me) = self.me.upgrade() else { return };
        if !me.passes.request() {
            return;
        }
        me.start_runner();
    }

    /// Runs the passes this instance's gate just made the caller responsible for.
    fn start_runner(self: &Arc<Inner>) {
        if !self.s.background_eviction {
            self.run_passes();
            return;
        }
        let me = Arc::clone(self);
        match std::thread::Builder::new()
            .name("kpc-disk-evict".into())
            .spawn(move || me.run_passes())
        {
            Ok(h) => self.keep_thread(h),
            Err(_) => self.run_passes(),
        }
    }

    /// The runner's loop: a pass when the record calls for one, again while requests keep coming.
    fn run_passes(self: &Arc<Inner>) {
        loop {
            self.passes.begin();
            if self.pass_due() {
                let plan = Plan {
                    target: (self.s.max_size > 0).then(|| self.low_watermark()),
                    older_than: None,
                    wait: false,
                    // Already off the caller's path when background_eviction is set.
                    defer_sweep: false,
                };
                if let Err(e) = self.evict(plan) {
                    self.warn_io(&e, &self.v1, "eviction failed");
                }
            }
            if !self.passes.finish() {
                return;
            }
        }
    }

    /// Lets go of `evict.lock` and, if another instance or process found it taken meanwhile (it left
    /// `evict.recheck`), asks for the pass it could not run. Every holder of `evict.lock` lets go
    /// through here (a pass, its deferred sweep, a recount), so no such request is lost. The caller
    /// must not hold the size lock: with `background_eviction` off the pass runs on this thread.
    pub(super) fn release_evict_lock(&self, evictor: HeldLock) {
        drop(evictor);
        if self.v1.join(RECHECK_FILE).exists() {
            self.request_pass();
        }
    }

    /// Whether the record is over the limit or needs measuring again.
    fn pass_due(&self) -> bool {
        if !self.v1.is_dir() {
            return false;
        }
        match self.lock_size().map(|l| l.read()) {
            // The size file cannot be locked: a pass could not count either.
            None => false,
            Some(None) => true,
            Some(Some(r)) => {
                r.dirty || (self.s.max_size > 0 && r.total > self.s.max_size)
                // A record flagged `evicting` is either a live pass's (it runs to the end and subtracts)
                // or a dead one's (the next pass that takes evict.lock measures it); its total alone
                // decides here.
            }
        }
    }

    /// Keeps `h` for [`PersistentCache::wait_for_eviction`](super::PersistentCache::wait_for_eviction),
    /// forgetting threads that already finished.
    pub(super) fn keep_thread(&self, h: JoinHandle<()>) {
        let mut threads = self.threads.lock();
        threads.retain(|t| !t.is_finished());
        threads.push(h);
    }

    /// Joins every background thread this instance started, including those started meanwhile.
    pub(super) fn join_threads(&self) {
        loop {
            let threads = std::mem::take(&mut *self.threads.lock());
            if threads.is_empty() {
                return;
            }
            for t in threads {
                let _ = t.join();
            }
        }
    }

    pub(super) fn low_watermark(&self) -> u64 {
        (self.s.max_size as u128 * self.s.low_watermark_percent.min(100) as u128 / 100) as u64
    }
}
