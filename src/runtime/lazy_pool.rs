//! The background builds of specialized kernels behind generic fallbacks (`lazy.rs` has the whole
//! picture): which keys are queued, built or failed, a small worker pool that runs the builds, and
//! what they counted. It knows nothing of how a kernel is acquired: a job is a closure that
//! `lazy.rs` gives it, which reports what became of its build.
//!
//! At most one worker per core, started on demand and gone when the queue is empty; a key queued
//! once is not queued again while pending or after it failed. [`Lazy::cancel_and_wait`] drops what
//! is queued and waits for what runs (a context's `quiesce`, the drop of its last handle).

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::cache::KernelKey;

/// What serving generic fallbacks did for one context (part of
/// [`crate::runtime::ContextStats`] and the C `kpc_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LazyStats {
    /// Acquisitions of a request with a fallback that were served the fallback.
    pub served_generic: u64,
    /// Of those, the ones served it because the `generic` seal was in force (nothing queued).
    pub sealed_generic: u64,
    /// Specialized kernels returned for the first time after their background build (or load).
    pub swapped_in: u64,
    /// Background builds that compiled (a background acquisition served by a store is not one).
    pub background_builds: u64,
    /// Their compile time, summed.
    pub background_build_time: Duration,
    /// Background builds that failed (each reported once; the fallback goes on serving).
    pub background_failures: u64,
    /// Background builds queued or running now.
    pub pending: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Queued or building.
    Pending,
    /// Built (or loaded) in the background; not yet returned to a request with a fallback.
    Ready,
    /// The background build failed: the fallback serves from now on.
    Failed,
}

/// What became of one background build, as its job reports it.
pub(crate) enum Outcome {
    /// The kernel is in memory now; `compiled`: how long its build took, when it was built (not
    /// loaded from a store).
    Ready { compiled: Option<Duration> },
    /// Nothing was done (the seal came into force, or the manager is gone): the next request
    /// decides again.
    Dropped,
    /// The build failed (the job reported it).
    Failed,
}

/// One background build: runs on a worker, once.
pub(crate) type Work = Box<dyn FnOnce() -> Outcome + Send>;

struct Job {
    key: KernelKey,
    work: Work,
}

#[derive(Default)]
struct Pool {
    jobs: VecDeque<Job>,
    /// Workers alive, and how many of them run a job now.
    live: usize,
    running: usize,
    handles: Vec<JoinHandle<()>>,
}

/// One manager's background builds of specialized kernels, and what they counted.
pub(crate) struct Lazy {
    states: Mutex<HashMap<KernelKey, State>>,
    /// How many states are [`State::Ready`]: a hit looks at the states only while one is.
    ready: AtomicUsize,
    pool: Mutex<Pool>,
    idle: Condvar,
    max_workers: usize,
    served_generic: AtomicU64,
    sealed_generic: AtomicU64,
    swapped_in: AtomicU64,
    builds: AtomicU64,
    build_nanos: AtomicU64,
    failures: AtomicU64,
}

impl Default for Lazy {
    fn default() -> Self {
        Lazy {
            states: Mutex::new(HashMap::new()),
            ready: AtomicUsize::new(0),
            pool: Mutex::new(Pool::default()),
            idle: Condvar::new(),
            // One per core the process may use, as a prefetch batch.
            max_workers: std::thread::available_parallelism().map_or(1, |c| c.get()),
            served_generic: AtomicU64::new(0),
            sealed_generic: AtomicU64::new(0),
            swapped_in: AtomicU64::new(0),
            builds: AtomicU64::new(0),
            build_nanos: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Lazy {
    pub(crate) fn stats(&self) -> LazyStats {
        let pending = self
            .states
            .lock()
            .values()
            .filter(|s| **s == State::Pending)
            .count() as u64;
        LazyStats {
            served_generic: self.served_generic.load(Ordering::Relaxed),
            sealed_generic: self.sealed_generic.load(Ordering::Relaxed),
            swapped_in: self.swapped_in.load(Ordering::Relaxed),
            background_builds: self.builds.load(Ordering::Relaxed),
            background_build_time: Duration::from_nanos(self.build_nanos.load(Ordering::Relaxed)),
            background_failures: self.failures.load(Ordering::Relaxed),
            pending,
        }
    }

    pub(crate) fn state(&self, key: &KernelKey) -> Option<State> {
        self.states.lock().get(key).copied()
    }

    /// A specialized kernel is being returned: whether it is the first time since its background
    /// build (counted once).
    pub(crate) fn take_ready(&self, key: impl FnOnce() -> KernelKey) -> bool {
        if self.ready.load(Ordering::Acquire) == 0 {
            return false;
        }
        let key = key();
        let mut s = self.states.lock();
        if s.get(&key) != Some(&State::Ready) {
            return false;
        }
        s.remove(&key);
        self.ready.fetch_sub(1, Ordering::AcqRel);
        drop(s);
        self.swapped_in.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("kpc_lazy_swapped_total").increment(1);
        true
    }

    pub(crate) fn served_generic(&self, sealed: bool) {
        self.served_generic.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("kpc_lazy_served_generic_total").increment(1);
        if sealed {
            self.sealed_generic.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues `work`, the background build of `key`, unless that is pending or has failed already.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        key: KernelKey,
        work: impl FnOnce() -> Outcome + Send + 'static,
    ) {
        {
            let mut s = self.states.lock();
            match s.get(&key) {
                Some(State::Pending | State::Failed) => return,
                Some(State::Ready) => {
                    self.ready.fetch_sub(1, Ordering::AcqRel);
                }
                None => {}
            }
            s.insert(key.clone(), State::Pending);
        }
        let mut p = self.pool.lock();
        p.jobs.push_back(Job {
            key,
            work: Box::new(work),
        });
        if p.live < self.max_workers && p.live < p.running + p.jobs.len() {
            p.handles.retain(|h| !h.is_finished());
            let me = self.clone();
            let i = p.live;
            match std::thread::Builder::new()
                .name(format!("kpc-lazy-{i}"))
                .spawn(move || me.work())
            {
                Ok(h) => {
                    p.live += 1;
                    p.handles.push(h);
                }
                Err(e) => {
                    // No worker: the job stays queued and the fallback serves meanwhile; the next
                    // enqueue tries again.
                    tracing::warn!(target: "kpc::lazy", "could not spawn a background build worker: {e}");
                }
            }
        }
    }

    fn work(&self) {
        loop {
            let job = {
                let mut p = self.pool.lock();
                match p.jobs.pop_front() {
                    Some(j) => {
                        p.running += 1;
                        j
                    }
                    None => {
                        p.live -= 1;
                        return;
                    }
                }
            };
            let Job { key, work } = job;
            let outcome = catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|_| {
                tracing::warn!(target: "kpc::lazy", "a background build panicked; the fallback goes on serving");
                self.failed();
                Outcome::Failed
            });
            self.finish(
                &key,
                match outcome {
                    Outcome::Ready { compiled } => {
                        if let Some(took) = compiled {
                            self.builds.fetch_add(1, Ordering::Relaxed);
                            self.build_nanos
                                .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                            metrics::counter!("kpc_lazy_background_builds_total").increment(1);
                            metrics::histogram!("kpc_lazy_background_build_duration_seconds")
                                .record(took.as_secs_f64());
                        }
                        Some(State::Ready)
                    }
                    Outcome::Dropped => None,
                    Outcome::Failed => Some(State::Failed),
                },
            );
            let mut p = self.pool.lock();
            p.running -= 1;
            if p.running == 0 {
                self.idle.notify_all();
            }
        }
    }

    fn finish(&self, key: &KernelKey, to: Option<State>) {
        let mut s = self.states.lock();
        match to {
            Some(st) => {
                if st == State::Ready {
                    self.ready.fetch_add(1, Ordering::AcqRel);
                }
                s.insert(key.clone(), st);
            }
            None => {
                s.remove(key);
            }
        }
    }

    /// Counts a failed background build.
    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("kpc_lazy_background_failures_total").increment(1);
    }
}

impl Lazy {
    /// Drops the queued builds (a later request queues them again) and waits for the running ones,
    /// then reaps the workers.
    pub(crate) fn cancel_and_wait(&self) {
        let mut p = self.pool.lock();
        let dropped: Vec<Job> = p.jobs.drain(..).collect();
        while p.running > 0 {
            self.idle.wait(&mut p);
        }
        let handles = std::mem::take(&mut p.handles);
        drop(p);
        for j in &dropped {
            self.finish(&j.key, None);
        }
        for h in handles {
            // The workers find the queue empty and return; joining only reaps them.
            let _ = h.join();
        }
    }
}
