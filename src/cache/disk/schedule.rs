//! When eviction passes run: off the caller's path, one at a time, and never one too few.
//!
//! A put that takes the total over `max_size` asks for a pass. In one process a [`PassGate`] keeps one
//! runner, which runs again when a put came while it ran. Across processes `evict.lock` keeps one
//! evictor, and a runner waits for it (up to the lock timeout), then runs only if the record still
//! calls for a pass. A runner that does not get the lock (it timed out, or its thread may hold a leaf's
//! lock and must not wait) leaves `evict.recheck` before trying once more, and the holder looks for
//! that file after it lets go (`evict.rs`), then asks its own runner for a pass. Waiting, not leaving
//! the flag alone, is what holds when the holder never looks: a process killed holding the lock, or a
//! child forked by some thread, which shares the parent's locks until it execs and so keeps one past
//! its holder's release and look. A runner's pass also waits for the leaves that keep entries it must
//! remove (`evict.rs`). So every put over the limit is followed by a pass that starts after it and
//! removes what it must, and once writers stop the total is at or under the limit.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::Inner;
use super::count::SizeRecord;
use super::evict::Plan;
use super::lock::{Asker, HeldLock, RECHECK_FILE};

impl Inner {
    /// A put (or a pass that saw a bad record or a recheck flag) asks for a pass; it runs on a background
    /// thread unless `background_eviction` is off, and only if the record still calls for one then. The
    /// caller holds no lock of the cache (a pass run on its thread may wait for locks).
    pub(super) fn request_pass(&self) {
        self.request_pass_from(Asker::Free);
    }

    /// [`Inner::request_pass`] for a caller that may hold a leaf's or a build's lock.
    pub(super) fn request_pass_from(&self, asker: Asker) {
        let Some(me) = self.me.upgrade() else { return };
        if !me.passes.request() {
            return;
        }
        me.start_runner(asker);
    }

    /// Runs the passes this instance's gate just made the caller responsible for.
    fn start_runner(self: &Arc<Inner>, asker: Asker) {
        if !self.s.background_eviction {
            self.run_passes(asker);
            return;
        }
        let me = Arc::clone(self);
        match std::thread::Builder::new()
            .name("kpc-disk-evict".into())
            .spawn(move || me.run_passes(Asker::Free))
        {
            Ok(h) => self.keep_thread(h),
            Err(_) => self.run_passes(asker),
        }
    }

    /// The runner's loop: a pass when the record calls for one, again while requests keep coming.
    ///
    /// A pass run on a thread that holds no other lock of the cache waits (up to the lock timeout) for
    /// `evict.lock` and for the leaves that keep entries it must remove. Giving up at once would rely on
    /// the holder to come back, and a holder may never: a process killed while holding a lock, or a child
    /// forked by any thread of a process, which shares that process's open locks until it execs, so the
    /// lock outlives the holder's own release (and its look for the recheck flag). Waiting cannot
    /// deadlock: the holders of `evict.lock` and of leaves never wait for a runner. A thread that may hold
    /// a leaf's lock (a counted change) only tries, and leaves the recheck flag.
    fn run_passes(self: &Arc<Inner>, asker: Asker) {
        let free = asker == Asker::Free;
        loop {
            self.passes.begin();
            if self.pass_due() {
                let plan = Plan {
                    target: (self.s.max_size > 0).then(|| self.low_watermark()),
                    target_entries: (self.s.max_entries > 0).then(|| self.low_watermark_entries()),
                    older_than: None,
                    wait: free,
                    // Already off the caller's path when background_eviction is set.
                    defer_sweep: false,
                    asked: true,
                    wait_busy: free,
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
    pub(super) fn release_evict_lock(&self, evictor: HeldLock, asker: Asker) {
        drop(evictor);
        if self.v1.join(RECHECK_FILE).exists() {
            self.request_pass_from(asker);
        }
    }

    /// Whether the record is over the limit or needs measuring again.
    pub(super) fn pass_due(&self) -> bool {
        if !self.v1.is_dir() {
            return false;
        }
        match self.lock_size().map(|l| l.read()) {
            // The size file cannot be locked: a pass could not count either.
            None => false,
            Some(None) => true,
            Some(Some(r)) => {
                r.dirty || self.over_limits(&r)
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

    /// The entry count a pass for `KPC_CACHE_MAX_ENTRIES` evicts down to: the same percentage.
    pub(super) fn low_watermark_entries(&self) -> u64 {
        (self.s.max_entries as u128 * self.s.low_watermark_percent.min(100) as u128 / 100) as u64
    }

    /// Whether `r` is over `KPC_CACHE_MAX_SIZE` or `KPC_CACHE_MAX_ENTRIES`.
    pub(super) fn over_limits(&self, r: &SizeRecord) -> bool {
        (self.s.max_size > 0 && r.total > self.s.max_size)
            || (self.s.max_entries > 0 && r.entries > self.s.max_entries)
    }
}
